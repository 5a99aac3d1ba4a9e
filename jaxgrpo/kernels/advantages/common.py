"""What the outcome advantage estimators share: declared ranges, group centering, row-input checks.

Helpers of the modules of `jaxgrpo.kernels.advantages` (and of the kernels of other kinds that take an
estimator's hyper-parameters): the declared ranges of a group std's ddof and eps, the group-centered reward,
the zeroing of invalid rows and of groups with fewer than two valid rows, the count of each row's group, and
the checks of method-specific row inputs (completion lengths, step returns, ids).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.validation import check_floating, check_integer, is_concrete

Array = jax.Array


# Declared ranges shared by the estimators (`jaxgrpo.kernels.hyperparameters`).
#: A group std needs more valid rows than its delta degrees of freedom; at group_size or more every std is 0.
STD_DDOF = ("in [0, group_size)", "delta degrees of freedom of the group std")
#: Added to a std: with 0 a constant group divides 0 by 0.
STD_EPS = ("> 0", "added to the std so that a constant group does not divide by 0")


def group_centered(rewards: Array, group_ids: Array, num_groups: int, valid: Array) -> Array:
    """r_i - mean of r over the valid rows of i's group."""
    mean = segments.mean(rewards, group_ids, num_groups, valid)
    return rewards - segments.gather(mean, group_ids)


def _finish(advantages: Array, group_ids: Array, num_groups: int, valid: Array) -> Array:
    """Zero for invalid rows and for groups with fewer than two valid rows."""
    n = segments.gather(segments.count(group_ids, num_groups, valid), group_ids)
    return jnp.where(valid & (n > 1), advantages, 0.0)


def _zero_invalid_and_singletons(advantages: Array, group_ids: Array, num_groups: int, valid: Array) -> Array:
    """0 for invalid rows and for groups with fewer than two valid rows (no relative signal)."""
    n = _group_count(group_ids, num_groups, valid)
    return jax.lax.stop_gradient(jnp.where(valid & (n > 1), advantages, 0.0))


def _group_count(group_ids: Array, num_groups: int, valid: Array) -> Array:
    """Number of valid rows of each row's group, f32[N]."""
    return segments.gather(segments.count(group_ids, num_groups, valid), group_ids)


def checked_lengths(lengths, n: int, valid: Array) -> Array | None:
    """Completion lengths f32[N] (tokens per row) as floats, 0 for invalid rows and never negative; None stays None."""
    if lengths is None:
        return None
    lengths = jnp.asarray(lengths)
    lengths = lengths.astype(jnp.float32) if jnp.issubdtype(lengths.dtype, jnp.integer) else check_floating("lengths", lengths)
    if lengths.shape != (n,):
        raise ValueError(f"lengths must have shape [N]=[{n}] like rewards, got shape {tuple(lengths.shape)}")
    return jnp.where(valid & jnp.isfinite(lengths), jnp.maximum(lengths, 0.0), 0.0)


def _check_row_array(name: str, x, n: int, *, integer: bool = False, valid: Array | None = None) -> Array:
    """A checked [N] row input; with `valid`, float values of invalid rows are replaced by 0."""
    x = check_integer(name, x) if integer else check_floating(name, x)
    if x.shape != (n,):
        raise ValueError(f"{name} must have shape [N]=[{n}] like rewards, got shape {tuple(x.shape)}")
    if integer:
        return x.astype(jnp.int32)
    return x if valid is None else jnp.where(valid, x, 0)


def _check_ids_in_range(name: str, ids: Array, size: int, size_name: str) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{size_name} must be a positive Python int (it fixes a shape), got {size!r}")
    if is_concrete(ids) and ids.size:
        values = np.asarray(ids)
        lo, hi = int(values.min()), int(values.max())
        if lo < 0 or hi >= size:
            raise ValueError(f"{name} must lie in [0, {size_name}={size}), got values in [{lo}, {hi}]")
