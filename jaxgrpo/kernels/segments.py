"""Group statistics over segment ids, with a validity mask.

Groups are given by `group_ids` (segment ids in [0, num_groups)), so uneven and
filtered groups work under jit with static shapes. Rows with `valid=False` do
not enter any statistic. Every function returns per-group values `[num_groups]`;
`gather` broadcasts them back to rows.

These are the building blocks of the advantage estimators and are public, so a
new estimator in a notebook is a few lines::

    mean = segments.mean(rewards, group_ids, num_groups, valid)
    adv = rewards - segments.gather(mean, group_ids)

Overflow: `mean`, `variance`, `std` and `standardize` (and their `masked_`
forms) first divide each group by a power of two, 2^k with k >= 0 the smallest
exponent that brings the group's largest |x| below 4 (`unit_scale`), and
multiply the result back. Dividing by a power of two is exact, so for values
below 4 (k = 0) nothing changes and for larger ones results equal the plain
formulas' up to float rounding, while sums and squares can no longer overflow:
the mean is finite for any finite x, `std` and `variance` are inf only when the
true value exceeds the largest float, and `standardize` is finite for any
finite x. `sum` is a plain sum (it overflows when the true sum does).

Non-finite values: the statistics are only as finite as the valid rows are.
The outcome kernels resolve that before calling them: a row whose reward is
NaN or +-inf counts as invalid (see `validation.check_outcome_inputs`).
Values at masked-out positions never reach arithmetic: `fill_masked` replaces
them before any other operation, so NaN or inf there gives neither a NaN value
nor a NaN gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def power_of_two(k: Array, dtype=jnp.float32) -> Array:
    """2^k exactly, for integer k in [-126, 127] (built from the float32 bits, so no rounding)."""
    bits = (jnp.asarray(k, jnp.int32) + 127) << 23
    return jax.lax.bitcast_convert_type(bits, jnp.float32).astype(dtype)


def scale_exponent(peak: Array) -> Array:
    """The smallest k >= 0 with |x| / 2^k < 4 for every |x| <= peak, as int32 in [0, 126].

    peak < 4 gives k = 0 (values are not rescaled); the largest float32 gives 126.
    """
    _, e = jnp.frexp(jax.lax.stop_gradient(peak))  # peak < 2^e
    return jnp.clip(e - 2, 0, 126)


# The least epsilon of a std computed on rescaled values (k > 0): 2^-40 of the group's scale is far
# below float32 resolution, yet 1 / floor^2 (the derivative of a quotient) stays finite.
_EPS_FLOOR = 2.0**-40


def scaled_eps(eps: float, k: Array, dtype=jnp.float32, *, squared: bool = False) -> Array:
    """The epsilon of a denominator computed on values scaled by `unit_scale`: eps / 2^k.

    With `squared=True`, eps / 4^k, for an eps added to a variance. Where values
    were rescaled (k > 0), it is at least 2^-40 (2^-80 squared), so a zero
    spread divides by neither 0 nor a number whose derivative overflows when
    eps / 2^k underflows; that is far below float32 resolution relative to the
    values, so results do not change.
    """
    inverse = power_of_two(-k, dtype)
    scaled, floor = (eps * inverse * inverse, _EPS_FLOOR**2) if squared else (eps * inverse, _EPS_FLOOR)
    return jnp.where(k > 0, jnp.maximum(scaled, floor), scaled)


def fill_masked(mask: Array, *arrays: Array, value: float = 0.0):
    """Each array with `value` where `mask` is zero (masked out), before any arithmetic.

    A NaN or inf at a masked-out position would otherwise survive a later
    multiplication by the mask (NaN * 0 = NaN), in the value or, through the
    backward pass, in the gradient. `where` on the inputs keeps both clean: the
    gradient with respect to a filled position is exactly 0. Returns one array
    for one input, else a tuple.
    """
    on = jnp.asarray(mask) != 0
    out = tuple(jnp.where(on, x, jnp.asarray(value, jnp.asarray(x).dtype)) for x in arrays)
    return out[0] if len(out) == 1 else out


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


def _per_group(n: Array, x: Array) -> Array:
    """`[num_groups]` counts shaped to broadcast against per-group statistics of `x`."""
    return n.reshape(n.shape + (1,) * (x.ndim - 1))


def unit_scale(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None) -> tuple[Array, Array]:
    """Rows divided by a power of two per group: `(x / 2^k_g, k)` with every valid |x| / 2^k_g < 4.

    k = `scale_exponent` of the group's largest valid |x| (int32 `[num_groups, ...]`,
    0 for values below 4 and for empty groups). The division is exact, so any
    statistic that is homogeneous in x (mean, deviations, std, ratios of them)
    can be computed on the scaled rows, without overflow, and multiplied back
    by 2^k (`power_of_two`).
    """
    v = jnp.ones(x.shape[:1], bool) if valid is None else valid
    v = v.reshape(v.shape + (1,) * (x.ndim - 1))
    peak = jax.ops.segment_max(jnp.where(v, jnp.abs(x), 0), group_ids, num_segments=num_groups)
    k = scale_exponent(jnp.maximum(peak, 0))  # an empty segment's max is -inf
    return x * gather(power_of_two(-k, x.dtype), group_ids), k


def _scaled_moments(x, group_ids, num_groups, valid, ddof):
    """(scaled rows, per-group mean and variance (ddof) of them, exponent k), with x = 2^k * scaled."""
    scaled, k = unit_scale(x, group_ids, num_groups, valid)
    n = _per_group(count(group_ids, num_groups, valid, x.dtype), x)
    m = sum(scaled, group_ids, num_groups, valid) / jnp.maximum(n, 1)
    centered = scaled - gather(m, group_ids)
    ss = sum(centered * centered, group_ids, num_groups, valid)
    var = jnp.where(n > ddof, ss / jnp.maximum(n - ddof, 1), 0.0)
    return scaled, m, var, k


def _safe_sqrt(v: Array) -> Array:
    # sqrt has an infinite derivative at 0; keep gradients finite for constant groups.
    return jnp.where(v > 0, jnp.sqrt(jnp.where(v > 0, v, 1.0)), 0.0)


def mean(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None) -> Array:
    """Mean of valid rows per group; 0 for a group without valid rows. Finite for any finite x."""
    scaled, k = unit_scale(x, group_ids, num_groups, valid)
    n = _per_group(count(group_ids, num_groups, valid, x.dtype), x)
    return sum(scaled, group_ids, num_groups, valid) / jnp.maximum(n, 1) * power_of_two(k, x.dtype)


def variance(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None, *, ddof: int = 0) -> Array:
    """Variance of valid rows per group (two-pass, on rows scaled by `unit_scale`).

    A group with `count <= ddof` has variance 0 (not NaN). inf only where the
    true variance exceeds the largest float (use `std` or `standardize` there).
    """
    _, _, var, k = _scaled_moments(x, group_ids, num_groups, valid, ddof)
    scale = power_of_two(k, x.dtype)
    return var * scale * scale


def std(x: Array, group_ids: Array, num_groups: int, valid: Array | None = None, *, ddof: int = 0) -> Array:
    """Standard deviation of valid rows per group; 0 for a group with `count <= ddof`."""
    _, _, var, k = _scaled_moments(x, group_ids, num_groups, valid, ddof)
    return _safe_sqrt(var) * power_of_two(k, x.dtype)


def standardize(
    x: Array, group_ids: Array, num_groups: int, valid: Array | None = None, *, ddof: int = 0, eps: float = 0.0
) -> Array:
    """(x - mean_g) / (std_g + eps) per row, over the valid rows of each row's group.

    Computed on rows scaled by `unit_scale` (eps scaled alike), so it is finite
    for any finite x, even where the std itself would overflow, and equal to the
    plain formula up to float rounding elsewhere. A group with `count <= ddof`
    has std 0, so its rows get (x - mean) / eps (0 for a constant group).
    Invalid rows get 0.
    """
    scaled, m, var, k = _scaled_moments(x, group_ids, num_groups, valid, ddof)
    normalized = (scaled - gather(m, group_ids)) / gather(_safe_sqrt(var) + scaled_eps(eps, k, x.dtype), group_ids)
    v = jnp.ones(x.shape[:1], bool) if valid is None else valid
    return jnp.where(v.reshape(v.shape + (1,) * (x.ndim - 1)), normalized, 0.0)


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
    # On rows scaled by `unit_scale` (same order within a group), so lo + hi cannot overflow.
    scaled, k = unit_scale(x, group_ids, num_groups, valid)
    order, start, n = sorted_within_groups(scaled, group_ids, num_groups, valid)
    xs = scaled[order]
    last = x.shape[0] - 1
    lo = xs[jnp.clip(start + (n - 1) // 2, 0, last)]
    hi = xs[jnp.clip(start + n // 2, 0, last)]
    return jnp.where(n > 0, 0.5 * (lo + hi) * power_of_two(k, x.dtype), 0.0)


def _masked_scaled_moments(x, mask, axis, ddof):
    """`_scaled_moments` of the entries where `mask` is nonzero (weighted by it), over `axis`.

    Returns scaled x, scaled mean and variance with the reduced axes kept, the
    exponent k (kept axes too) and the count.
    """
    mask = jnp.asarray(mask)
    on = mask != 0
    weight = mask.astype(x.dtype)
    x = jnp.where(on, x, 0)  # masked-out entries never reach arithmetic
    k = scale_exponent(jnp.max(jnp.abs(x), axis=axis, keepdims=True))
    scaled = x * power_of_two(-k, x.dtype)
    n = weight.sum(axis, keepdims=True)
    m = (scaled * weight).sum(axis, keepdims=True) / jnp.maximum(n, 1)
    ss = (jnp.square(scaled - m) * weight).sum(axis, keepdims=True)
    var = jnp.where(n > ddof, ss / jnp.maximum(n - ddof, 1), 0.0)
    return scaled, m, var, k, n


def _reduced(x: Array, axis) -> Array:
    """Drops the axes a `keepdims=True` reduction over `axis` kept."""
    return x.reshape(()) if axis is None else jnp.squeeze(x, axis)


def masked_mean(x: Array, mask: Array, axis=None) -> Array:
    """Mean of `x` where `mask` is nonzero (weighted by the mask); 0 where the mask is empty.

    Entries where the mask is 0 are ignored even if NaN or inf; the mean of
    finite entries is finite (computed on entries scaled by a power of two).
    """
    mask = jnp.asarray(mask)
    on = mask != 0
    weight = mask.astype(x.dtype)
    x = jnp.where(on, x, 0)
    k = scale_exponent(jnp.max(jnp.abs(x), axis=axis, keepdims=True))
    scaled_sum = (x * power_of_two(-k, x.dtype) * weight).sum(axis)
    return scaled_sum / jnp.maximum(weight.sum(axis), 1) * _reduced(power_of_two(k, x.dtype), axis)


def masked_variance(x: Array, mask: Array, axis=None, *, ddof: int = 0) -> Array:
    """Variance of `x` where `mask` is nonzero (two-pass); 0 when the mask holds `<= ddof` entries.

    As `variance`: inf only where the true variance exceeds the largest float.
    """
    _, _, var, k, _ = _masked_scaled_moments(x, mask, axis, ddof)
    scale = power_of_two(k, x.dtype)
    return _reduced(var * scale * scale, axis)


def masked_standardize(
    x: Array, mask: Array, axis=None, *, ddof: int = 0, eps: float = 0.0, eps_inside: bool = False
) -> Array:
    """Standardized x over the entries where `mask` is nonzero: finite for any finite x; 0 where masked out.

    (x - mean) / (std + eps), or with `eps_inside=True` (x - mean) / sqrt(var + eps)
    (the whitening of PPO and REINFORCE++). Computed on entries scaled by a
    power of two (eps scaled alike), so equal to the plain formula up to float
    rounding wherever that does not overflow.
    """
    scaled, m, var, k, _ = _masked_scaled_moments(x, mask, axis, ddof)
    if eps_inside:
        white = (scaled - m) * jax.lax.rsqrt(var + scaled_eps(eps, k, x.dtype, squared=True))
    else:
        white = (scaled - m) / (_safe_sqrt(var) + scaled_eps(eps, k, x.dtype))
    return jnp.where(jnp.asarray(mask) != 0, white, 0.0)


# --------------------------------------------------------- order within groups
# Rows ordered inside their groups, and dense ids of sub-groups: what the median, rank, quantile and
# sub-group estimators share (MC-GRPO, GiGPO, Stratified GRPO, SEED-GRPO, RiskPO).


def sorted_rows_within_groups(x: Array, group_ids: Array, num_groups: int, valid: Array):
    """Rows sorted by (group, value, row index), invalid rows last; ties keep batch order.

    Returns:
      order: i32[N] row indices in sorted order.
      start: i32[num_groups] position in `order` where each group begins.
      n: i32[num_groups] valid rows per group.
    """
    key = jnp.where(valid, group_ids, num_groups)
    rows = jnp.arange(x.shape[0], dtype=jnp.int32)
    order = jnp.lexsort((rows, x, key))
    n = count(group_ids, num_groups, valid, jnp.int32)
    return order, jnp.cumsum(n) - n, n


def lower_median_rows(x: Array, group_ids: Array, num_groups: int, valid: Array):
    """The row holding each group's lower median (as `torch.median`): i32[num_groups], and bool[num_groups] non-empty.

    For an odd count this is the middle element; for an even count the lower of
    the two middle ones. Among equal values the first in batch order is taken.
    """
    order, start, n = sorted_rows_within_groups(x, group_ids, num_groups, valid)
    pos = jnp.clip(start + (n - 1) // 2, 0, x.shape[0] - 1)
    return order[pos], n > 0


def joint_segment_ids(primary: Array, secondary: Array, valid: Array) -> Array:
    """Dense segment ids in [0, N) of the (primary, secondary) pairs of valid rows.

    Rows share an id exactly when both ids match; invalid rows get ids of their
    own keys after every valid pair (use them with `valid` so they are ignored).
    Unlike `primary * num_secondary + secondary`, the number of segments is N,
    whatever the ranges of the ids.
    """
    n = primary.shape[0]
    rows = jnp.arange(n, dtype=jnp.int32)
    invalid = (~valid).astype(jnp.int32)
    order = jnp.lexsort((rows, secondary, primary, invalid))
    p, s, inv = primary[order], secondary[order], invalid[order]
    new = jnp.concatenate([jnp.ones((1,), bool), (p[1:] != p[:-1]) | (s[1:] != s[:-1]) | (inv[1:] != inv[:-1])])
    sorted_ids = jnp.cumsum(new.astype(jnp.int32)) - 1
    return jnp.zeros((n,), jnp.int32).at[order].set(sorted_ids)


def rank_within_groups(group_ids: Array, num_groups: int, valid: Array) -> Array:
    """Position of each valid row among its group's valid rows, in batch order (0, 1, ...); -1 if invalid."""
    n_rows = group_ids.shape[0]
    rows = jnp.arange(n_rows, dtype=jnp.int32)
    key = jnp.where(valid, group_ids, num_groups)
    order = jnp.lexsort((rows, key))
    n = count(group_ids, num_groups, valid, jnp.int32)
    start = jnp.cumsum(n) - n
    sorted_rank = rows - jnp.take(start, key[order], mode="clip")
    rank = jnp.zeros((n_rows,), jnp.int32).at[order].set(sorted_rank)
    return jnp.where(valid, rank, -1)


def quantile_within_groups(x: Array, group_ids: Array, num_groups: int, valid: Array, q: float) -> Array:
    """The q-quantile of each group's valid values, linear interpolation (`torch.quantile`); 0 if empty."""
    order, start, n = sorted_rows_within_groups(x, group_ids, num_groups, valid)
    xs = x[order]
    last = x.shape[0] - 1
    pos = q * jnp.maximum(n - 1, 0).astype(x.dtype)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
    frac = pos - lo.astype(x.dtype)
    x_lo = xs[jnp.clip(start + lo, 0, last)]
    x_hi = xs[jnp.clip(start + hi, 0, last)]
    return jnp.where(n > 0, x_lo + frac * (x_hi - x_lo), 0.0)
