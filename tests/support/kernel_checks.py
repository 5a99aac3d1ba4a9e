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


# Fixed shapes for the numerics property tests, so each jitted kernel compiles once.
OUTCOME_SHAPE = (16, 4)  # (rows, groups)
TOKEN_SHAPE = (6, 5)
NON_FINITE = (np.nan, np.inf, -np.inf)


def _pick(rng, options, size=None):
    """Uniform picks from `options` (`rng.choice` is several times slower on small inputs)."""
    return np.asarray(options)[rng.integers(len(options), size=size)]


@st.composite
def extreme_outcome_batches(draw, shape=OUTCOME_SHAPE):
    """(rewards f32[N], group_ids i32[N], valid bool[N], num_groups, seed) with rewards up to +-1e30.

    Rewards are binary, ordinary, huge (1e20..1e30), tiny or spread over 1e-30..1e30, with
    either sign. Invalid rows hold NaN or +-inf; some valid rows do too (a non-finite
    reward makes a row invalid). Degenerate cases are forced with some probability: a
    group of one row, a group of equal rewards, a group with no valid row, no valid row
    at all; random group ids leave groups empty or uneven too. Hypothesis draws the
    regime and the seed of a numpy generator for the bulk values (fast to draw; `seed`
    is returned for builders of further inputs).
    """
    n, num_groups = shape
    regime = draw(st.sampled_from(["binary", "ordinary", "huge", "tiny", "spread"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    group_ids = rng.integers(0, num_groups, n)
    if regime == "binary":
        rewards = rng.integers(0, 2, n).astype(np.float64)
    elif regime == "ordinary":
        rewards = rng.normal(size=n) * 10.0 ** rng.integers(-2, 3)
    else:
        low, high = {"huge": (20, 30), "tiny": (-30, -20), "spread": (-30, 30)}[regime]
        rewards = _pick(rng, [-1.0, 1.0], n) * 10.0 ** rng.uniform(low, high, n)
    valid = rng.random(n) < _pick(rng, [1.0, 0.75, 0.4])
    single, equal, empty, none_valid = rng.random(4) < (0.5, 0.5, 0.5, 0.1)
    g = int(rng.integers(num_groups))
    if single:  # a group of one row
        rows = np.flatnonzero(group_ids == g)
        group_ids[rows[1:]] = (g + 1) % num_groups
    if equal:  # a group of equal rewards
        rewards[group_ids == (g + 1) % num_groups] = rewards[0]
    if empty:  # a group with no valid row
        valid[group_ids == (g + 2) % num_groups] = False
    if none_valid:
        valid[:] = False
    rewards = rewards.astype(np.float32)
    rewards[~valid] = _pick(rng, NON_FINITE, int((~valid).sum()))
    rewards[rng.permutation(n)[: rng.integers(0, 3)]] = _pick(rng, NON_FINITE)
    return rewards, group_ids.astype(np.int32), valid, num_groups, seed


@st.composite
def extreme_token_batches(draw, shape=TOKEN_SHAPE):
    """(logp, old_logp, advantages f32[N, T], mask, seed) with NaN or +-inf at every masked position.

    Unmasked log-probs lie in [-50, 0] (sometimes old == new, ratio 1); advantages span
    +-1e4 with zeros, per token or constant along each row; masks include fully masked
    rows and sometimes a fully masked batch. Hypothesis draws what fills the masked
    positions and the seed of a numpy generator for the bulk values.
    """
    n, t = shape
    filler = draw(st.sampled_from(NON_FINITE + ("mixed",)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    mask = (rng.random((n, t)) < _pick(rng, [1.0, 0.7, 0.3])).astype(np.float32)
    empty_row, empty_batch, same_policy, per_row = rng.random(4) < (0.5, 0.1, 0.3, 0.5)
    if empty_row:
        mask[rng.integers(n)] = 0.0
    if empty_batch:
        mask[:] = 0.0
    logp = -(10.0 ** rng.uniform(-4, np.log10(50.0), (n, t)))
    old = logp if same_policy else np.minimum(logp + rng.normal(scale=_pick(rng, [0.1, 3.0, 30.0]), size=(n, t)), 0.0)
    adv = _pick(rng, [-1.0, 1.0], (n, t)) * 10.0 ** rng.uniform(-3, 4, (n, t))
    adv[rng.random((n, t)) < 0.2] = 0.0
    if per_row:
        adv = np.broadcast_to(adv[:, :1], (n, t))
    fill = _pick(rng, NON_FINITE, (3, n, t)) if filler == "mixed" else np.full((3, n, t), filler)
    logp, old, adv = (np.where(mask > 0, x, f).astype(np.float32) for x, f in zip((logp, old, adv), fill))
    return logp, old, adv, mask, seed
