"""Shared checks for kernel tests: sharded == unsharded, hypothesis strategies for groups."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P


def shard_batch(x, mesh):
    """Places `x` with its leading (batch) axis split over every device of `mesh`."""
    spec = P(mesh.axis_names) if np.ndim(x) else P()
    return jax.device_put(x, NamedSharding(mesh, spec))


def assert_sharded_matches(fn, arrays: dict, mesh, *, atol: float = 1e-6, **static_kwargs):
    """jit(fn) on batch-sharded inputs equals fn on one device, for every output leaf.

    `arrays` are passed as keyword arguments with their leading axis sharded over
    all devices of the mesh (its size must divide the batch); `static_kwargs` are
    passed as they are (closed over, not traced).
    """
    expected = fn(**arrays, **static_kwargs)
    sharded = {k: shard_batch(v, mesh) for k, v in arrays.items()}
    got = jax.jit(lambda **a: fn(**a, **static_kwargs))(**sharded)
    jax.tree.map(lambda e, g: np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=atol, rtol=1e-6), expected, got)
    return got


@st.composite
def outcome_batches(draw, max_groups: int = 6, max_group_size: int = 8, binary: bool | None = None):
    """(rewards f32[N], group_ids i32[N], valid bool[N], num_groups): uneven groups, in any order.

    Covers groups of size 1, all-equal rewards, and fully invalid groups.
    """
    num_groups = draw(st.integers(1, max_groups))
    sizes = draw(st.lists(st.integers(1, max_group_size), min_size=num_groups, max_size=num_groups))
    group_ids = np.repeat(np.arange(num_groups), sizes).astype(np.int32)
    n = len(group_ids)
    is_binary = draw(st.booleans()) if binary is None else binary
    if is_binary:
        rewards = np.array(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)), np.float32)
    else:
        rewards = np.array(
            draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=n, max_size=n)), np.float32
        )
    valid = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    perm = np.array(draw(st.permutations(list(range(n)))), np.int32)
    return jnp.asarray(rewards[perm]), jnp.asarray(group_ids[perm]), jnp.asarray(valid[perm]), num_groups


@st.composite
def token_batches(draw, max_rows: int = 6, max_len: int = 8):
    """(logp, old_logp, mask) f32[N, T] with some fully masked rows."""
    n = draw(st.integers(1, max_rows))
    t = draw(st.integers(1, max_len))
    floats = st.floats(-30.0, 0.0, allow_nan=False, width=32)
    logp = np.array(draw(st.lists(floats, min_size=n * t, max_size=n * t)), np.float32).reshape(n, t)
    old = np.array(draw(st.lists(floats, min_size=n * t, max_size=n * t)), np.float32).reshape(n, t)
    mask = np.array(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n * t, max_size=n * t)), np.float32).reshape(n, t)
    return jnp.asarray(logp), jnp.asarray(old), jnp.asarray(mask)
