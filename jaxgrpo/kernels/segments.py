"""Group statistics over segment ids, with a validity mask.

Groups are given by `group_ids` (segment ids in [0, num_groups)), so uneven and
filtered groups work under jit with static shapes. Rows with `valid=False` do
not enter any statistic. Every function returns per-group values `[num_groups]`;
`gather` broadcasts them back to rows.

These are the building blocks of the advantage estimators and are public, so a
new estimator in a notebook is a few lines::

    mean = segments.mean(rewards, group_ids, num_groups, valid)
    adv = rewards - segments.gather(mean, group_ids)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def _weights(x: Array, valid: Array | None) -> Array:
    return jnp.ones(x.shape[:1], x.dtype) if valid is None else valid.astype(x.dtype)


def _segment_sum(x: Array, group_ids: Array, num_groups: int) -> Array:
    return jax.ops.segment_sum(x, group_ids, num_segments=num_groups)


def count(group_ids: Array, num_groups: int, valid: Array | None = None, dtype=jnp.float32) -> Array:
    """Number of valid rows per group, `[num_groups]`."""
    w = jnp.ones(group_ids.shape, dtype) if valid is None else valid.astype(dtype)
    return _segment_sum(w, group_ids, num_groups)


def gather(per_group: Array, group_ids: Array) -> Array:
    """Per-group values broadcast back to rows: `per_group[group_ids]`."""
    return jnp.take(per_group, group_ids, axis=0, mode="clip")


def sum(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None) -> Array:  # noqa: A001
    """Sum of valid rows per group."""
    w = _weights(x, valid)
    w = w.reshape(w.shape + (1,) * (x.ndim - 1))
    return _segment_sum(jnp.where(w > 0, x, 0) * w, group_ids, num_groups)


def mean(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None) -> Array:
    """Mean of valid rows per group; 0 for a group without valid rows."""
    n = count(group_ids, num_groups, valid, x.dtype)
    n = n.reshape(n.shape + (1,) * (x.ndim - 1))
    return sum(x, group_ids, num_groups, valid) / jnp.maximum(n, 1)


def variance(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None, *, ddof: int = 0) -> Array:
    """Variance of valid rows per group (two-pass, numerically stable).

    A group with `count <= ddof` has variance 0 (not NaN).
    """
    m = mean(x, group_ids, num_groups, valid)
    centered = x - gather(m, group_ids)
    ss = sum(centered * centered, group_ids, num_groups, valid)
    n = count(group_ids, num_groups, valid, x.dtype)
    n = n.reshape(n.shape + (1,) * (x.ndim - 1))
    return jnp.where(n > ddof, ss / jnp.maximum(n - ddof, 1), 0.0)


def std(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None, *, ddof: int = 0) -> Array:
    """Standard deviation of valid rows per group; 0 for a group with `count <= ddof`."""
    v = variance(x, group_ids, num_groups, valid, ddof=ddof)
    # sqrt has an infinite derivative at 0; keep gradients finite for constant groups.
    safe = jnp.where(v > 0, v, 1.0)
    return jnp.where(v > 0, jnp.sqrt(safe), 0.0)


def max(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None) -> Array:  # noqa: A001
    """Maximum of valid rows per group; -inf for a group without valid rows."""
    v = jnp.ones(x.shape, bool) if valid is None else valid
    return jax.ops.segment_max(jnp.where(v, x, -jnp.inf), group_ids, num_segments=num_groups)


def min(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None) -> Array:  # noqa: A001
    """Minimum of valid rows per group; +inf for a group without valid rows."""
    v = jnp.ones(x.shape, bool) if valid is None else valid
    return jax.ops.segment_min(jnp.where(v, x, jnp.inf), group_ids, num_segments=num_groups)


def sorted_within_groups(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None):
    """Sorts rows by (group, value), invalid rows last.

    Returns:
      order: i32[N], row indices in sorted order.
      start: i32[num_groups], the position in `order` where each group begins.
      n: i32[num_groups], the number of valid rows of each group.
    """
    v = jnp.ones(x.shape, bool) if valid is None else valid
    key = jnp.where(v, group_ids, num_groups)  # invalid rows form a last, ignored group
    order = jnp.lexsort((x, key))
    n = count(group_ids, num_groups, v, jnp.int32)
    start = jnp.cumsum(n) - n
    return order, start, n


def median(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None) -> Array:
    """Median of valid rows per group (mean of the two middle values for even counts); 0 if empty."""
    order, start, n = sorted_within_groups(x, group_ids, num_groups, valid)
    xs = x[order]
    last = x.shape[0] - 1
    lo = xs[jnp.clip(start + (n - 1) // 2, 0, last)]
    hi = xs[jnp.clip(start + n // 2, 0, last)]
    return jnp.where(n > 0, 0.5 * (lo + hi), 0.0)


def masked_mean(x: Array, mask: Array, axis=None) -> Array:
    """Mean of `x` where `mask` is nonzero; 0 where the mask is empty."""
    mask = mask.astype(x.dtype)
    return (x * mask).sum(axis) / jnp.maximum(mask.sum(axis), 1)


def masked_variance(x: Array, mask: Array, axis=None, *, ddof: int = 0) -> Array:
    """Variance of `x` where `mask` is nonzero (two-pass); 0 when the mask holds `<= ddof` entries."""
    mask = mask.astype(x.dtype)
    m = masked_mean(x, mask, axis)
    m = m if axis is None else jnp.expand_dims(m, axis)
    n = mask.sum(axis)
    ss = (jnp.square(x - m) * mask).sum(axis)
    return jnp.where(n > ddof, ss / jnp.maximum(n - ddof, 1), 0.0)
