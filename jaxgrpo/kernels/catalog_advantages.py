"""Advantage estimators of the GRPO-family papers beyond the baselines, and the off-policy REINFORCE losses.

Every estimator follows the outcome-estimator contract::

    fn(rewards: f32[N], group_ids: i32[N], *, num_groups: int,
       valid: bool[N] | None = None, **hparams) -> f32[N]

with method-specific inputs (step returns, anchor ids, strata, cluster ids,
bundle ids, sequence log-likelihoods, a reward matrix f32[N, K]) passed as
explicit keyword arrays. Rows with `valid=False` get 0 and never enter a
statistic; so do rows whose reward is NaN or +-inf (they count as invalid, see
`validation.check_outcome_inputs`), and method-specific row inputs of invalid
rows are ignored too. Finite inputs give finite outputs: statistics are taken
on rewards scaled by a power of two per group (`segments.unit_scale`), so the
normalized estimators stay finite for any finite reward. Advantages are
constants for the policy gradient, so every estimator returns `stop_gradient`
of its result.

Companions: `mc_grpo_pivot_mask` (kind "mask"), `dgpo_question_weights`
(kind "selection"), and the losses `rec` and `opmd` (kind "loss").

Generic helpers added here (candidates for `segments.py`):
`sorted_rows_within_groups` (a tie-broken, stable sort by (group, value)),
`lower_median_rows`, `joint_segment_ids` (dense ids of (primary, secondary)
pairs, without a static product of sizes), `rank_within_groups`, and
`quantile_within_groups` (linear interpolation, as `torch.quantile`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import betaln, xlogy

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.advantages import STD_DDOF, STD_EPS, WHITEN, WHITEN_MODES, checked_lengths, whitened
from jaxgrpo.kernels.losses import log_ratio, prepare, ratio_metrics
from jaxgrpo.kernels.registry import get_advantage, register, register_advantage, register_loss
from jaxgrpo.kernels.segments import masked_mean
from jaxgrpo.kernels.validation import check_floating, check_integer, check_outcome_inputs, is_concrete

Array = jax.Array


# --------------------------------------------------------------------------- #
# Generic helpers
# --------------------------------------------------------------------------- #


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


def _group_count(group_ids: Array, num_groups: int, valid: Array) -> Array:
    """Number of valid rows of each row's group, f32[N]."""
    return segments.gather(segments.count(group_ids, num_groups, valid), group_ids)


def _zero_invalid_and_singletons(advantages: Array, group_ids: Array, num_groups: int, valid: Array) -> Array:
    """0 for invalid rows and for groups with fewer than two valid rows (no relative signal)."""
    n = _group_count(group_ids, num_groups, valid)
    return jax.lax.stop_gradient(jnp.where(valid & (n > 1), advantages, 0.0))


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
    n = segments.count(group_ids, num_groups, valid, jnp.int32)
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
    n = segments.count(group_ids, num_groups, valid, jnp.int32)
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


# --------------------------------------------------------------------------- #
# 8. MC-GRPO
# --------------------------------------------------------------------------- #

_MC_GRPO_PAPER = (
    "MC-GRPO: Median-Centered Group Relative Policy Optimization for Small-Rollout Reinforcement Learning (2026)"
)


def _median_and_mad(rewards, group_ids, num_groups, valid):
    pivot, nonempty = lower_median_rows(rewards, group_ids, num_groups, valid)
    median = jnp.where(nonempty, rewards[pivot], 0.0)
    deviation = jnp.abs(rewards - segments.gather(median, group_ids))
    mad_row, _ = lower_median_rows(deviation, group_ids, num_groups, valid)
    mad = jnp.where(nonempty, deviation[mad_row], 0.0)
    return median, mad, pivot, nonempty


@register_advantage("mc_grpo", paper=_MC_GRPO_PAPER,
                    ranges={"mad_eps": ("> 0", "added to the MAD, so that a group whose MAD is 0 does not divide by 0")}, group_relative=True)
def mc_grpo(rewards, group_ids, *, num_groups: int, valid=None, mad_eps: float = 1e-3) -> Array:
    """Median-centered advantage (MC-GRPO): A_i = (r_i - median_g) / (MAD_g + 1e-3).

    MAD_g = median_g |r - median_g|; no std scaling. Medians are lower medians
    (`torch.median`, as the authors' code): with the intended G+1 (odd) rollouts
    per prompt the median is one rollout, the pivot, whose advantage is 0 and
    which `mc_grpo_pivot_mask` removes from the loss (so G rollouts train).

    Args:
      mad_eps: added to the MAD; 1e-3 as in the authors' code. A group whose
        MAD is 0 (e.g. binary rewards with a clear majority) gives +-1/mad_eps
        to the minority.

    Paper: Kim, "MC-GRPO: Median-Centered Group Relative Policy Optimization for
    Small-Rollout Reinforcement Learning" (2026); code MC-GRPO da07745.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    # Median and MAD of rewards scaled by a power of two (exact, and |r - median| cannot overflow).
    scaled, k = segments.unit_scale(rewards, group_ids, num_groups, valid)
    median, mad, _, _ = _median_and_mad(scaled, group_ids, num_groups, valid)
    mad_eps = segments.scaled_eps(mad_eps, k, rewards.dtype)
    adv = (scaled - segments.gather(median, group_ids)) / segments.gather(mad + mad_eps, group_ids)
    return _zero_invalid_and_singletons(adv, group_ids, num_groups, valid)


@register("mask", "mc_grpo_pivot_mask", paper=_MC_GRPO_PAPER)
def mc_grpo_pivot_mask(rewards, group_ids, *, num_groups: int, valid=None) -> Array:
    """MC-GRPO's loss mask: bool[N], True for valid rows except each group's median (pivot) rollout.

    The pivot is the row `mc_grpo` centers on (lower median; first in batch
    order among ties). Multiply the token mask by `mask[:, None]`.

    Paper: Kim, "MC-GRPO" (2026); code MC-GRPO da07745 (`median_mask`).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    pivot, nonempty = lower_median_rows(rewards, group_ids, num_groups, valid)
    is_pivot = jnp.zeros(rewards.shape, jnp.int32).at[pivot].max(nonempty.astype(jnp.int32)) > 0
    return valid & ~is_pivot


# --------------------------------------------------------------------------- #
# 9. BNPO
# --------------------------------------------------------------------------- #


@register_advantage("bnpo", paper="BNPO: Beta Normalization Policy Optimization (2025)", ranges={
    "min_value": ("< max_value", "the lowest reward, mapped to 0"),
    "max_value": ("> min_value", "the highest reward, mapped to 1"),
    "max_inverse_density": ("> 0", "the clamp of 1 / Beta pdf"),
}, group_relative=True)
def bnpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    min_value: float = 0.0,
    max_value: float = 1.0,
    max_inverse_density: float = 1e6,
) -> Array:
    """Beta-normalized advantage (BNPO): A_i = (r_i - p_q) / Beta_pdf(p_q; alpha, beta).

    Rewards are rescaled to [0, 1] by (r - min_value) / (max_value - min_value);
    p_q is the mean of prompt q's rescaled rewards. Over the prompts of the batch,
    mu = mean p, v = var p (ddof=1), c = mu(1-mu)/v - 1, alpha = max(1 + c mu / 3, 1),
    beta = max(1 + c (1-mu) / 3, 1); 1/pdf is clamped to [0, 1e6].
    With alpha = beta = 1 (e.g. v >= mu(1-mu)) the pdf is 1 and A_i = r_i - p_q,
    Dr. GRPO's advantage. With fewer than two prompts or v = 0 we also use
    alpha = beta = 1 (the moment fit is undefined there).

    Differs from the authors' code only on single-rollout prompts, whose p_q is
    their own reward here (advantage 0) instead of 0.

    Paper: "BNPO: Beta Normalization Policy Optimization" (2025);
    formula and defaults from code BNPO a9c51b9.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    if not max_value > min_value:
        raise ValueError(f"max_value must exceed min_value, got [{min_value}, {max_value}]")
    scaled = (rewards - min_value) / (max_value - min_value)
    p_group = segments.mean(scaled, group_ids, num_groups, valid)
    has_rows = segments.count(group_ids, num_groups, valid) > 0
    # The Beta fit needs p in [0, 1] (as the density below); out-of-range rewards would make c +-inf.
    p_fit = jnp.clip(p_group, 0.0, 1.0)
    mu = masked_mean(p_fit, has_rows)
    var = segments.masked_variance(p_fit, has_rows, ddof=1)
    fit = (has_rows.sum() > 1) & (var > 0)
    c = mu * (1.0 - mu) / jnp.where(fit, var, 1.0) - 1.0
    alpha = jnp.where(fit, jnp.maximum(1.0 + c * mu / 3.0, 1.0), 1.0)
    beta = jnp.where(fit, jnp.maximum(1.0 + c * (1.0 - mu) / 3.0, 1.0), 1.0)
    p = segments.gather(p_group, group_ids)
    # The authors assert 0 <= p <= 1; here rewards outside [min_value, max_value] are allowed and the
    # density is read at p clipped to [0, 1]. xlogy keeps (alpha - 1) log p = 0 at alpha = 1, p = 0.
    p_in = jnp.clip(p, 0.0, 1.0)
    log_pdf = xlogy(alpha - 1.0, p_in) + xlogy(beta - 1.0, 1.0 - p_in) - betaln(alpha, beta)
    inverse_density = jnp.clip(jnp.exp(-log_pdf), 0.0, max_inverse_density)
    adv = inverse_density * (scaled - p)
    return _zero_invalid_and_singletons(adv, group_ids, num_groups, valid)


# --------------------------------------------------------------------------- #
# 10. GDPO
# --------------------------------------------------------------------------- #


@register_advantage(
    "gdpo", paper="GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL Optimization (2026)",
    ranges={"std_ddof": STD_DDOF, "eps": STD_EPS, "whiten": WHITEN},
    group_relative=True,
)
def gdpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    reward_weights=None,
    std_ddof: int = 1,
    eps: float = 1e-4,
    whiten: str = "rows",
    lengths=None,
) -> Array:
    """Group reward-decoupled normalization (GDPO) of K rewards per rollout.

    A^k_i = (r^k_i - mean^k_g) / (std^k_g + eps) for each reward k inside the
    group; S_i = sum_k w_k A^k_i; then S is normalized over the batch. GRPO
    instead normalizes the weighted sum, which merges distinct reward
    combinations into one advantage. With K = 1 this is GRPO followed by batch
    normalization.

    The batch step differs between the two reference implementations:
    `whiten="rows"` (default, TRL, the paper's release) gives
    A_i = (S_i - mean S) / (std S + eps) over the valid rows, each row weighing 1;
    `whiten="tokens"` (verl) gives verl's `masked_whiten` over the completion
    tokens, A_i = (S_i - mean) / sqrt(var + 1e-8) with each row weighted by its
    length (`lengths`) and the unbiased variance over the batch's tokens. They
    agree only when every row has one token.

    Args:
      rewards: f32[N, K], one column per reward function.
      reward_weights: f32[K], default all ones.
      std_ddof: 1 (unbiased, `torch.std`) for group and batch std.
      eps: 1e-4 as TRL's normalization (verl's group step uses 1e-6).
      whiten: "rows" (TRL) or "tokens" (verl).
      lengths: f32[N] completion tokens per row, for `whiten="tokens"` (the
        trainer passes them); without them every row counts as one token.

    Paper: "GDPO: Group reward-Decoupled Normalization Policy Optimization for
    Multi-reward RL Optimization" (2026); checked against TRL, and verl for the token whitening.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(
        rewards, group_ids, num_groups, valid, reward_shape="[N, K]"
    )
    k = rewards.shape[1]
    weights = jnp.ones((k,), rewards.dtype) if reward_weights is None else check_floating("reward_weights", reward_weights)
    if weights.shape != (k,):
        raise ValueError(f"reward_weights must have shape [K]=[{k}] like rewards' second axis, got {tuple(weights.shape)}")
    per_reward = segments.standardize(rewards, group_ids, num_groups, valid, ddof=std_ddof, eps=eps)
    n = _group_count(group_ids, num_groups, valid)
    per_reward = jnp.where((valid & (n > 1))[:, None], per_reward, 0.0)
    summed = per_reward @ weights
    if whiten not in WHITEN_MODES:
        raise ValueError(f"whiten must be one of {', '.join(WHITEN_MODES)}, got {whiten!r}")
    if whiten == "tokens":
        lengths = checked_lengths(lengths, rewards.shape[0], valid)
        return jax.lax.stop_gradient(whitened(summed, valid, mode="tokens", lengths=lengths, eps=1e-8))
    return jax.lax.stop_gradient(segments.masked_standardize(summed, valid, ddof=std_ddof, eps=eps))


# --------------------------------------------------------------------------- #
# 11. NGRPO
# --------------------------------------------------------------------------- #


@register_advantage("ngrpo", paper="NGRPO: Negative-enhanced Group Relative Policy Optimization (2025)",
                    ranges={"r_max": ("any", "the reward of the virtual best sample"), "eps": STD_EPS})
def ngrpo(rewards, group_ids, *, num_groups: int, valid=None, r_max: float = 1.0, eps: float = 1e-6) -> Array:
    """GRPO with a virtual max-reward sample (NGRPO): mean and std over {r_1..r_G, r_max}.

    mu = (sum_i r_i + r_max) / (G + 1), sigma^2 = (sum_i (r_i - mu)^2 + (r_max - mu)^2) / G
    (ddof=1 over the G+1 values); A_i = (r_i - mu) / (sigma + eps). An all-wrong
    group now gets negative advantages; a single rollout is compared with r_max.
    Use it with the asymmetric clip eps_low=0.16, eps_high=0.24 (`ppo_clip`).

    Paper: "NGRPO: Negative-enhanced Group Relative Policy Optimization" (2025); r_max=1 and eps from code NGRPO e7a3804.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    n = segments.count(group_ids, num_groups, valid)
    # In units of 2^k, k from the group's largest |r| and r_max, so sums and squares cannot overflow.
    peak = jnp.maximum(segments.max(jnp.abs(rewards), group_ids, num_groups, valid), abs(r_max))
    k = segments.scale_exponent(peak)
    scale = segments.power_of_two(-k, rewards.dtype)
    scaled, r_max = rewards * segments.gather(scale, group_ids), r_max * scale
    eps = segments.scaled_eps(eps, k, rewards.dtype)
    total = segments.sum(scaled, group_ids, num_groups, valid) + r_max
    mu = total / (n + 1.0)
    mu_row = segments.gather(mu, group_ids)
    ss = segments.sum(jnp.square(scaled - mu_row), group_ids, num_groups, valid) + jnp.square(r_max - mu)
    var = ss / jnp.maximum(n, 1.0)
    sigma = jnp.where(var > 0, jnp.sqrt(jnp.where(var > 0, var, 1.0)), 0.0)
    adv = (scaled - mu_row) / segments.gather(sigma + eps, group_ids)
    return jax.lax.stop_gradient(jnp.where(valid, adv, 0.0))


# --------------------------------------------------------------------------- #
# 12. KRPO
# --------------------------------------------------------------------------- #


@register_advantage(
    "krpo", paper="Kalman Filter Enhanced Group Relative Policy Optimization for Language Model Reasoning (2025)",
    ranges={
        "process_noise": (">= 0", "the process noise Q, a variance"),
        "measurement_noise": ("> 0", "the measurement noise R, a variance (0 divides 0 by 0 on a certain prior)"),
        "initial_mean": ("any", "the filter's first estimate x_0"),
        "initial_variance": (">= 0", "the filter's first variance P_0"),
        "eps": ("> 0", "added to sqrt(P) so that a certain filter does not divide by 0"),
    },
)
def krpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    process_noise: float = 1e-5,
    measurement_noise: float = 1e-2,
    initial_mean: float = 0.0,
    initial_variance: float = 1.0,
    eps: float = 1e-8,
) -> Array:
    """Kalman-filtered baseline (KRPO): a scalar Kalman filter runs over each group's rewards in batch order.

    Per group, x_0 = 0, P_0 = 1; for each valid row j of the group in order:
    P- = P + Q, K = P- / (P- + R), x <- x + K (r_j - x), P <- (1 - K) P-, and
    A_j = (r_j - x) / (sqrt(P) + 1e-8) with the posterior after r_j. The result
    depends on the order of rows within a group. Implemented as one `lax.scan`
    over rows carrying the per-group state, so it jits with segment ids.

    Defaults Q=1e-5, R=1e-2 from the official KRPO code (df1ae2b).
    Paper: "Kalman Filter Enhanced Group Relative Policy Optimization for
    Language Model Reasoning" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    dtype = rewards.dtype
    init = (jnp.full((num_groups,), initial_mean, dtype), jnp.full((num_groups,), initial_variance, dtype))

    def step(state, row):
        x, p = state
        r, g, ok = row
        p_prior = p[g] + process_noise
        gain = p_prior / (p_prior + measurement_noise)
        x_new = x[g] + gain * (r - x[g])
        p_new = (1.0 - gain) * p_prior
        adv = jnp.where(ok, (r - x_new) / (jnp.sqrt(p_new) + eps), 0.0)
        x = x.at[g].set(jnp.where(ok, x_new, x[g]))
        p = p.at[g].set(jnp.where(ok, p_new, p[g]))
        return (x, p), adv

    _, adv = jax.lax.scan(step, init, (rewards, group_ids, valid))
    return jax.lax.stop_gradient(adv)


# --------------------------------------------------------------------------- #
# 13. DGPO (MathForge)
# --------------------------------------------------------------------------- #

_DGPO_PAPER = (
    "Harder Is Better: Boosting Mathematical Reasoning via Difficulty-Aware GRPO and Multi-Aspect Question Reformulation (2026)"
)


@register_advantage("dgpo", paper=_DGPO_PAPER,
                    ranges={"eps": ("> 0", "added to the sum of absolute deviations, so a constant group does not divide by 0")}, group_relative=True)
def dgpo(rewards, group_ids, *, num_groups: int, valid=None, eps: float = 1e-4) -> Array:
    """Difficulty-balanced group advantage (DGPO): mean-absolute-deviation scaling.

    A_i = G (r_i - mean_g) / (sum_j |r_j - mean_g| + 1e-4), G the group's valid
    size: the total |A| of every non-constant group is G, so hard questions
    (few successes) get updates as large as medium ones. Combine with
    `dgpo_question_weights` (DQW) by multiplication.

    The code's token-count balancing ratios are a loss normalization and are not
    part of this kernel.

    Paper: Dai et al., "Harder Is Better: Boosting Mathematical Reasoning via
    Difficulty-Aware GRPO and Multi-Aspect Question Reformulation" (2026);
    eps=1e-4 from code MathForge 83edda0.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    n = segments.count(group_ids, num_groups, valid)
    # A ratio of deviations: computed on rewards scaled by a power of two, so the sum cannot overflow.
    scaled, k = segments.unit_scale(rewards, group_ids, num_groups, valid)
    mean = segments.mean(scaled, group_ids, num_groups, valid)
    centered = scaled - segments.gather(mean, group_ids)
    extent = segments.sum(jnp.abs(centered), group_ids, num_groups, valid) + segments.scaled_eps(eps, k, rewards.dtype)
    adv = segments.gather(n, group_ids) * centered / segments.gather(extent, group_ids)
    return _zero_invalid_and_singletons(adv, group_ids, num_groups, valid)


@register("selection", "dgpo_question_weights", paper=_DGPO_PAPER,
          ranges={"temperature": ("> 0", "the softmax temperature T over -accuracy")})
def dgpo_question_weights(rewards, group_ids, *, num_groups: int, valid=None, temperature: float = 2.0) -> Array:
    """DGPO's difficulty-aware question weights (DQW), per row: f32[N].

    Over the groups whose rewards vary (sigma > 0), w_q = N_valid softmax_q(-acc_q / T),
    acc_q the group's mean (accuracy) reward and N_valid the number of such
    groups; the weights average to 1 and favour harder questions. Constant
    groups keep weight 1; invalid rows get 0. As in the code, a varying group
    with mean exactly 0 uses acc = 1.

    Args:
      rewards: f32[N], the accuracy reward (the code uses the first reward function).
      temperature: T=2 (the authors' code, `dgpo_dqw_temp`).

    Paper: Dai et al., "Harder Is Better" (2026); code MathForge 83edda0.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    acc = segments.mean(rewards, group_ids, num_groups, valid)
    varies = segments.max(rewards, group_ids, num_groups, valid) > segments.min(rewards, group_ids, num_groups, valid)
    acc = jnp.where(acc == 0, 1.0, acc)
    logits = jnp.where(varies, -acc / temperature, -jnp.inf)
    top = jnp.max(jnp.where(varies, logits, -jnp.finfo(rewards.dtype).max))
    unnorm = jnp.where(varies, jnp.exp(logits - top), 0.0)
    num_varying = varies.sum().astype(rewards.dtype)
    weights = jnp.where(varies, num_varying * unnorm / jnp.maximum(unnorm.sum(), jnp.finfo(rewards.dtype).tiny), 1.0)
    return jax.lax.stop_gradient(jnp.where(valid, segments.gather(weights, group_ids), 0.0))


# --------------------------------------------------------------------------- #
# 14. GiGPO
# --------------------------------------------------------------------------- #


def _normalize_in_segments(x, seg_ids, num_segments, valid, normalization, eps):
    if normalization == "mean_norm":
        return x - segments.gather(segments.mean(x, seg_ids, num_segments, valid), seg_ids)
    return segments.standardize(x, seg_ids, num_segments, valid, ddof=1, eps=eps)


@register_advantage("gigpo", paper="Group-in-Group Policy Optimization for LLM Agent Training (2025)",
                    ranges={"step_weight": ("any", "omega, the weight of the step-level advantage"),
                            "normalization": ("one of mean_norm, std", "the scale F of both levels: 1 or the std"),
                            "eps": STD_EPS},
                    group_relative=True)
def gigpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    step_returns,
    anchor_ids,
    num_anchors: int,
    step_weight: float = 1.0,
    normalization: str = "mean_norm",
    eps: float = 1e-6,
) -> Array:
    """Group-in-group advantage (GiGPO): A = A^E + omega A^S, one row per agent step.

    A^E_i = (R_tau(i) - mean_g) / F over the rows of prompt group g (the episode
    return of each row's trajectory, statistics across steps as in the code's
    default); A^S_i = (R_t(i) - mean_s) / F over the rows of g that act from the
    same anchor state s. F = 1 ("mean_norm", default) or std (ddof=1) + eps ("std").

    Args:
      rewards: f32[N] episode return of each row's trajectory.
      step_returns: f32[N] discounted return from the row's step,
        R_t = sum_k gamma^k r_{t+k} (gamma=0.95 in verl-agent; see `discounted_returns`).
      anchor_ids: i32[N] id of the environment state the step acts from; steps
        are grouped by (group, anchor), as the code clusters states per prompt.
      num_anchors: the range of anchor ids (static; only checked).
      step_weight: omega=1.

    Single-row episode groups get A^E = 0 (the code would keep R_tau).

    Paper: Feng et al., "Group-in-Group Policy Optimization for LLM Agent
    Training" (2025); code verl-agent `core_gigpo.py`.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    n = rewards.shape[0]
    step_returns = _check_row_array("step_returns", step_returns, n, valid=valid)
    anchor_ids = _check_row_array("anchor_ids", anchor_ids, n, integer=True)
    _check_ids_in_range("anchor_ids", anchor_ids, num_anchors, "num_anchors")
    if normalization not in ("mean_norm", "std"):
        raise ValueError(f"normalization must be 'mean_norm' or 'std', got {normalization!r}")
    episode = _normalize_in_segments(rewards, group_ids, num_groups, valid, normalization, eps)
    episode = _zero_invalid_and_singletons(episode, group_ids, num_groups, valid)
    step_groups = joint_segment_ids(group_ids, anchor_ids, valid)
    step = _normalize_in_segments(step_returns, step_groups, n, valid, normalization, eps)
    step = _zero_invalid_and_singletons(step, step_groups, n, valid)
    return jax.lax.stop_gradient(episode + step_weight * step)


# --------------------------------------------------------------------------- #
# 15. Stratified GRPO
# --------------------------------------------------------------------------- #


def _grpo_normalize(rewards, seg_ids, num_segments, valid, ddof, eps):
    normalized = segments.standardize(rewards, seg_ids, num_segments, valid, ddof=ddof, eps=eps)
    return _zero_invalid_and_singletons(normalized, seg_ids, num_segments, valid)


@register_advantage(
    "stratified_grpo",
    paper="Stratified GRPO: Handling Structural Heterogeneity in Reinforcement Learning of LLM Search Agents (2025)",
    ranges={"num_strata": (">= 1", "the number of strata"),
            "blend": ("in [0, 1]", "alpha, the weight of the stratified normalization against the global one"),
            "std_ddof": STD_DDOF, "eps": STD_EPS},
    group_relative=True,
)
def stratified_grpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    strata_ids,
    num_strata: int,
    blend: float = 1.0,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> Array:
    """Stratified advantage normalization (SAN) blended with the group's global normalization.

    A^SAN_i = (R_i - mu_k) / (sigma_k + eps) inside stratum k of i's prompt group
    (e.g. k = number of search calls); A^global_i is GRPO's normalization over
    the whole group; A = alpha A^SAN + (1 - alpha) A^global. With one stratum
    both terms are GRPO's advantage.

    Reconstruction: the paper's abstract gives SAN and the blend; the default
    alpha = 1 (pure SAN) and the std convention (ddof=1, eps=1e-6, as GRPO in
    verl) are our choices, not verified against the authors' code.

    Args:
      strata_ids: i32[N] stratum of each trajectory, in [0, num_strata).
      num_strata: number of strata (static).
      blend: alpha.

    Paper: "Stratified GRPO: Handling Structural Heterogeneity in Reinforcement
    Learning of LLM Search Agents" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    strata_ids = _check_row_array("strata_ids", strata_ids, rewards.shape[0], integer=True)
    _check_ids_in_range("strata_ids", strata_ids, num_strata, "num_strata")
    strata = joint_segment_ids(group_ids, strata_ids, valid)
    within = _grpo_normalize(rewards, strata, rewards.shape[0], valid, std_ddof, eps)
    global_ = _grpo_normalize(rewards, group_ids, num_groups, valid, std_ddof, eps)
    return jax.lax.stop_gradient(blend * within + (1.0 - blend) * global_)


# --------------------------------------------------------------------------- #
# 16. SEED-GRPO
# --------------------------------------------------------------------------- #

SEED_SCALINGS = ("linear", "exp", "focal")


def semantic_entropy_from_clusters(group_ids, cluster_ids, num_groups: int, valid) -> Array:
    """Semantic entropy per group from answer clusters: SE = -(1/K) sum_k log p(C_k), f32[num_groups].

    p(C_k) = |C_k| / G over the group's valid rows, K the number of clusters in
    the group. One cluster gives 0; G singleton clusters give log G.
    Each row adds -log p(C)/|C| to the sum and 1/|C| to K, so no static number
    of clusters is needed.
    """
    clusters = joint_segment_ids(group_ids, cluster_ids, valid)
    n = group_ids.shape[0]
    cluster_size = segments.gather(segments.count(clusters, n, valid), clusters)
    group_size = _group_count(group_ids, num_groups, valid)
    safe_size = jnp.maximum(cluster_size, 1.0)
    p = safe_size / jnp.maximum(group_size, 1.0)
    neg_log_p = jnp.where(valid, -jnp.log(p) / safe_size, 0.0)
    inv_size = jnp.where(valid, 1.0 / safe_size, 0.0)
    total = jax.ops.segment_sum(neg_log_p, group_ids, num_segments=num_groups)
    k = jax.ops.segment_sum(inv_size, group_ids, num_segments=num_groups)
    return total / jnp.maximum(k, 1.0)


@register_advantage(
    "seed_grpo",
    paper="SEED-GRPO: Semantic Entropy Enhanced GRPO for Uncertainty-Aware Policy Optimization (2025)",
    experimental=True,  # the scaling functions f and alpha are reconstructed
    ranges={"alpha": (">= 0", "the strength of the semantic-entropy scaling"),
            "scaling": ("one of linear, exp, focal", "the scaling function f"),
            "focal_gamma": (">= 0", "the exponent of the focal scaling"), "eps": STD_EPS},
    group_relative=True,
    loop=("needs semantic clusters of each group's answers (SEED-GRPO's cluster_ids or semantic_entropy), "
          "which no answer clusterer in the loop computes"),
)
def seed_grpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    semantic_entropy=None,
    cluster_ids=None,
    alpha: float = 1.0,
    scaling: str = "linear",
    focal_gamma: float = 2.0,
    std_normalize: bool = False,
    eps: float = 1e-6,
) -> Array:
    """Semantic-entropy-scaled advantage (SEED-GRPO): A_i = (r_i - mean_g) f(alpha SE_q / SE_max).

    SE_q is the semantic entropy of prompt q's answers (given, or computed from
    `cluster_ids` by `semantic_entropy_from_clusters`), SE_max = log G. f is
    decreasing with f(0) = 1, so SE = 0 leaves the advantage unchanged and
    uncertain prompts get smaller updates. x = alpha SE / SE_max is clipped to
    [0, 1]; f(x) = 1 - x ("linear"), exp(-x) ("exp") or (1 - x)^gamma ("focal").

    Reconstruction: the scaling form comes from the paper's abstract and a
    review; f's three shapes, alpha = 1 and gamma = 2 are our choices, not
    verified against the authors' code. `std_normalize=True` divides the centered
    reward by the group std (ddof=1) first, i.e. scales GRPO's advantage.

    Args:
      semantic_entropy: f32[num_groups] or None.
      cluster_ids: i32[N] semantic cluster of each answer within its group, or None.

    Paper: "SEED-GRPO: Semantic Entropy Enhanced GRPO for Uncertainty-Aware
    Policy Optimization" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    if scaling not in SEED_SCALINGS:
        raise ValueError(f"scaling must be one of {SEED_SCALINGS}, got {scaling!r}")
    if (semantic_entropy is None) == (cluster_ids is None):
        raise ValueError("pass exactly one of semantic_entropy f32[num_groups] or cluster_ids i32[N]")
    if semantic_entropy is not None:
        semantic_entropy = check_floating("semantic_entropy", semantic_entropy)
        if semantic_entropy.shape != (num_groups,):
            raise ValueError(
                f"semantic_entropy must have shape [num_groups]=[{num_groups}], got {tuple(semantic_entropy.shape)}"
            )
    else:
        cluster_ids = _check_row_array("cluster_ids", cluster_ids, rewards.shape[0], integer=True)
        semantic_entropy = semantic_entropy_from_clusters(group_ids, cluster_ids, num_groups, valid)
    n = segments.count(group_ids, num_groups, valid)
    se_max = jnp.log(jnp.maximum(n, 1.0))
    x = jnp.clip(alpha * semantic_entropy / jnp.where(se_max > 0, se_max, 1.0), 0.0, 1.0)
    x = jnp.where(se_max > 0, x, 0.0)
    if scaling == "linear":
        factor = 1.0 - x
    elif scaling == "exp":
        factor = jnp.exp(-x)
    else:
        factor = jnp.power(1.0 - x, focal_gamma)
    if std_normalize:
        centered = segments.standardize(rewards, group_ids, num_groups, valid, ddof=1, eps=eps)
    else:
        centered = rewards - segments.gather(segments.mean(rewards, group_ids, num_groups, valid), group_ids)
    return _zero_invalid_and_singletons(centered * segments.gather(factor, group_ids), group_ids, num_groups, valid)


# --------------------------------------------------------------------------- #
# 17. RiskPO
# --------------------------------------------------------------------------- #


@register_advantage(
    "riskpo", paper="RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM Post-Training (2025)",
    ranges={"num_bundles": (">= 1", "the range of bundle ids"),
            "quantile_low": ("in (0, 1)", "a, the lower quantile level (below quantile_high)"),
            "quantile_high": ("in (quantile_low, 1)", "b, the upper quantile level"),
            "cvar_weight": (">= 0", "w, the weight of the lower tail"), "eps": STD_EPS},
    group_relative=True,  # a bundle's papers are its questions' j-th rollouts: one per question, one paper
)
def riskpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    bundle_ids,
    num_bundles: int | None = None,
    quantile_low: float = 0.2,
    quantile_high: float = 0.9,
    cvar_weight: float = 1.5,
    tracked_quantiles=None,
    eps: float = 1e-6,
) -> Array:
    """Mixed value-at-risk advantage over question bundles (RiskPO).

    Questions (groups) are bundled by `bundle_ids`; the j-th valid rollout of
    every question of a bundle (batch order) forms "paper" j, with score S_j the
    sum of its rewards (a bundle has as many papers as its smallest question
    has rollouts; other rollouts get 0). With q_a, q_b the quantile_low /
    quantile_high quantiles (linear) of the bundle's paper scores:
      RVaR_j = [(S_j - q_a)+ - (S_j - q_b)+ + q_a - q_b] / (b - a),
      CVaR_j = -(q_a - S_j)+ / a,
      A_j = (w CVaR_j + RVaR_j) / (w + 1) / (std(S) + eps), std with ddof=1
      (1 for a single paper), copied to every rollout of paper j.

    Args:
      bundle_ids: i32[N] bundle of each row (all rows of a question share it).
      num_bundles: range of bundle ids (static); defaults to num_groups.
      quantile_low, quantile_high: a=0.2, b=0.9 (the authors' training scripts).
      cvar_weight: w=1.5.
      tracked_quantiles: optional (q_a, q_b) tracked across steps by the
        trainer; averaged with the batch quantiles (the code's "mix" mode).

    Paper: "RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM
    Post-Training" (2025); code RiskPO 65ec40c (uniform credit).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    n = rewards.shape[0]
    num_bundles = num_groups if num_bundles is None else num_bundles
    bundle_ids = _check_row_array("bundle_ids", bundle_ids, n, integer=True)
    _check_ids_in_range("bundle_ids", bundle_ids, num_bundles, "num_bundles")
    if not 0.0 < quantile_low < quantile_high < 1.0:
        raise ValueError(f"need 0 < quantile_low < quantile_high < 1, got {quantile_low}, {quantile_high}")

    rank = rank_within_groups(group_ids, num_groups, valid)
    question_size = _group_count(group_ids, num_groups, valid)
    big = jnp.asarray(n + 1, question_size.dtype)
    papers_per_bundle = jax.ops.segment_min(jnp.where(valid, question_size, big), bundle_ids, num_segments=num_bundles)
    in_paper = valid & (rank < jnp.take(papers_per_bundle, bundle_ids, mode="clip"))
    paper_ids = joint_segment_ids(bundle_ids, rank, in_paper)
    # Scores in units of 2^k per bundle (k from its largest |reward|), so sums and squares cannot
    # overflow; the advantage is a ratio of scores, and 1 and eps below are scaled alike.
    scaled, k = segments.unit_scale(rewards, bundle_ids, num_bundles, in_paper)
    unit = segments.power_of_two(-k, rewards.dtype)
    paper_score = segments.sum(scaled, paper_ids, n, in_paper)
    paper_exists = segments.count(paper_ids, n, in_paper) > 0
    paper_bundle = jax.ops.segment_max(jnp.where(in_paper, bundle_ids, -1), paper_ids, num_segments=n)
    paper_bundle = jnp.clip(paper_bundle, 0, num_bundles - 1)

    q_low = quantile_within_groups(paper_score, paper_bundle, num_bundles, paper_exists, quantile_low)
    q_high = quantile_within_groups(paper_score, paper_bundle, num_bundles, paper_exists, quantile_high)
    if tracked_quantiles is not None:
        tracked = jnp.asarray(tracked_quantiles, rewards.dtype)
        q_low, q_high = 0.5 * (q_low + tracked[0] * unit), 0.5 * (q_high + tracked[1] * unit)
    num_papers = segments.count(paper_bundle, num_bundles, paper_exists)
    std = segments.std(paper_score, paper_bundle, num_bundles, paper_exists, ddof=1)
    std = jnp.where(num_papers > 1, std, unit) + segments.scaled_eps(eps, k, rewards.dtype)

    s = paper_score
    a, b = q_low[paper_bundle], q_high[paper_bundle]
    rvar = (jnp.maximum(s - a, 0.0) - jnp.maximum(s - b, 0.0) + a - b) / (quantile_high - quantile_low + eps)
    cvar = -jnp.maximum(a - s, 0.0) / (quantile_low + eps)
    paper_adv = (cvar_weight * cvar + rvar) / (cvar_weight + 1.0) / std[paper_bundle]
    return jax.lax.stop_gradient(jnp.where(in_paper, paper_adv[paper_ids], 0.0))


# --------------------------------------------------------------------------- #
# 18. XRPO sharpening
# --------------------------------------------------------------------------- #


#: The estimators XRPO can sharpen: those that read nothing beyond (rewards, group_ids, num_groups, valid).
XRPO_BASES = ("grpo", "dr_grpo", "rloo", "gpg", "pass_at_k", "reinforce_pp", "reinforce_pp_baseline", "grpo_batch_std",
              "asymre", "bnpo", "dgpo", "krpo", "mc_grpo", "ngrpo", "opmd", "experimental/a_grae")


@register_advantage(
    "xrpo",
    paper="XRPO: Pushing the limits of GRPO with Targeted Exploration and Exploitation (2025)",
    experimental=True,  # formula from a third-party re-implementation
    ranges={"base": ("one of " + ", ".join(XRPO_BASES), "the base advantage estimator, one that reads only the rewards"),
            "novelty_weight": (">= 0", "lambda, the scale of the novelty bonus"),
            "clip_ratio": (">= 0", "kappa, the bonus's cap as a fraction of |A|")},
    group_relative=True,
)
def xrpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    seq_logp,
    base: str = "grpo",
    novelty_weight: float = 1.0,
    clip_ratio: float = 1.0,
    positive_only: bool = True,
) -> Array:
    """Novelty-aware advantage sharpening (XRPO) on top of a base estimator.

    s_i = seq_logp_i (mean token log-likelihood), eta_i = exp(s_i - mean_g s),
    A+_i = A_i + min(max(lambda (1 - eta_i), 0), kappa |A_i|): unlikely (novel)
    rollouts get a bonus bounded by kappa |A_i|.

    Reconstruction from a third-party re-implementation (grpo-composer): lambda =
    kappa = 1; `positive_only=True` (default) adds the bonus only where A_i > 0,
    the paper's "novel yet correct" responses; False applies the formula to all
    rows (negative advantages of novel rollouts move toward 0).

    Args:
      seq_logp: f32[N] length-normalized sequence log-likelihood under the
        current policy; treated as a constant (stop_gradient).
      base: registry name of the base advantage estimator, called with its defaults.

    Paper: "XRPO: Pushing the limits of GRPO with Targeted Exploration and
    Exploitation" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    seq_logp = jax.lax.stop_gradient(_check_row_array("seq_logp", seq_logp, rewards.shape[0], valid=valid))
    adv = get_advantage(base)(rewards, group_ids, num_groups=num_groups, valid=valid)
    mean_s = segments.gather(segments.mean(seq_logp, group_ids, num_groups, valid), group_ids)
    eta = jnp.exp(jnp.clip(seq_logp - mean_s, -50.0, 50.0))
    bonus = jnp.minimum(jnp.maximum(novelty_weight * (1.0 - eta), 0.0), clip_ratio * jnp.abs(adv))
    if positive_only:
        bonus = jnp.where(adv > 0, bonus, 0.0)
    return jax.lax.stop_gradient(jnp.where(valid, adv + bonus, 0.0))


# --------------------------------------------------------------------------- #
# 19. Off-policy group REINFORCE: AsymRE, OPMD, REC
# --------------------------------------------------------------------------- #

_OFF_POLICY_PAPER = (
    "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some Myths About GRPO and Its Friends (2025)"
)


@register_advantage("asymre", paper=_OFF_POLICY_PAPER,
                    ranges={"baseline_shift": ("any", "delta, added to the group mean baseline")}, group_relative=True)
def asymre(rewards, group_ids, *, num_groups: int, valid=None, baseline_shift: float = -0.1) -> Array:
    """Asymmetric REINFORCE advantage (AsymRE): A_i = r_i - (mean_g + delta), delta = -0.1.

    A negative shift lowers the baseline, so updates lean positive. Single-row
    groups get 0 (Trinity-RFT uses baseline 0 there, i.e. A = r).

    Paper: "Group-Relative REINFORCE Is Secretly an Off-Policy
    Algorithm" (2025); delta=-0.1 from Trinity-RFT `asymre`.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    mean = segments.gather(segments.mean(rewards, group_ids, num_groups, valid), group_ids)
    return _zero_invalid_and_singletons(rewards - (mean + baseline_shift), group_ids, num_groups, valid)


OPMD_BASELINES = ("mean", "logmeanexp")


@register_advantage("opmd", paper=_OFF_POLICY_PAPER,
                    ranges={"baseline": ("one of mean, logmeanexp", "the group baseline b_g"),
                            "tau": ("> 0", "the temperature of the logmeanexp baseline")}, group_relative=True)
def opmd(rewards, group_ids, *, num_groups: int, valid=None, baseline: str = "mean", tau: float = 1.0) -> Array:
    """Online policy mirror descent advantage (OPMD): A_i = r_i - b_g.

    b_g = mean_g ("mean", default) or tau log mean_j exp(r_j / tau) ("logmeanexp",
    the soft-max baseline of the KL-regularized optimum). Pair with the `opmd`
    loss, which divides by 1 + tau. Single-row groups get 0 (Trinity-RFT: A = r).

    Paper: "Group-Relative REINFORCE Is Secretly an Off-Policy
    Algorithm" (2025); defaults (mean, tau=1) from Trinity-RFT `opmd`.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    if baseline not in OPMD_BASELINES:
        raise ValueError(f"baseline must be one of {OPMD_BASELINES}, got {baseline!r}")
    if baseline == "mean":
        b = segments.mean(rewards, group_ids, num_groups, valid)
    else:
        if tau <= 0:
            raise ValueError(f"tau must be positive, got {tau}")
        scaled = rewards / tau
        top = segments.max(scaled, group_ids, num_groups, valid)
        top = jnp.where(jnp.isfinite(top), top, 0.0)
        sum_exp = segments.sum(jnp.exp(scaled - segments.gather(top, group_ids)), group_ids, num_groups, valid)
        n = segments.count(group_ids, num_groups, valid)
        b = tau * (top + jnp.log(jnp.maximum(sum_exp, jnp.finfo(rewards.dtype).tiny)) - jnp.log(jnp.maximum(n, 1.0)))
    return _zero_invalid_and_singletons(rewards - segments.gather(b, group_ids), group_ids, num_groups, valid)


REC_CLIP_MODES = ("one_sided", "two_sided", "none")


@register_loss("rec", paper=_OFF_POLICY_PAPER,
               ranges={"clip_mode": ("one of one_sided, two_sided, none", "which tokens the clip keeps"),
                       "eps_low": (">= 0", "the lower clip epsilon"), "eps_high": (">= 0", "the upper clip epsilon")})
def rec(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    clip_mode: str = "one_sided",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
):
    """REC: REINFORCE with a ratio mask and no importance weight.

    l_t = -A_t log pi(y_t) 1[rho_t in range], rho_t = sg[pi / pi_old]:
    "one_sided" keeps tokens with (A >= 0 and rho <= 1 + eps_high) or
    (A <= 0 and rho >= 1 - eps_low), the tokens PPO's clip would still move;
    "two_sided" keeps 1 - eps_low <= rho <= 1 + eps_high; "none" keeps all.
    Because rho is detached, a kept token's gradient is the on-policy
    REINFORCE gradient.

    Defaults: eps_low = eps_high = 0.2 (Trinity-RFT); "one_sided" is the paper's
    REC-OneSide-NoIS variant (Trinity-RFT's class default is "none").

    Paper: "Group-Relative REINFORCE Is Secretly an Off-Policy
    Algorithm" (2025); checked against Trinity-RFT `rec_policy_loss.py`.
    """
    if clip_mode not in REC_CLIP_MODES:
        raise ValueError(f"clip_mode must be one of {REC_CLIP_MODES}, got {clip_mode!r}")
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = jax.lax.stop_gradient(log_ratio(logp, old_logp))
    ratio = jnp.exp(log_r)
    if clip_mode == "two_sided":
        in_range = (ratio >= 1.0 - eps_low) & (ratio <= 1.0 + eps_high)
    elif clip_mode == "one_sided":
        in_range = ((adv >= 0) & (ratio <= 1.0 + eps_high)) | ((adv <= 0) & (ratio >= 1.0 - eps_low))
    else:
        in_range = jnp.ones_like(ratio, bool)
    loss = -adv * logp * in_range.astype(logp.dtype)
    metrics = {"clip_fraction": masked_mean((~in_range).astype(logp.dtype), mask)}
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


@register_loss("opmd", paper=_OFF_POLICY_PAPER,
               ranges={"tau": ("> -1", "the regularization strength; the loss is divided by 1 + tau")})
def opmd_loss(logp, old_logp, advantages, mask, *, tau: float = 1.0):
    """OPMD policy loss: l_t = -A_t log pi(y_t) / (1 + tau), no importance ratio.

    The 1/(1 + tau) factor is the mirror-descent step against the current
    policy (regularization strength tau=1, Trinity-RFT default). `old_logp`
    only feeds the ratio metrics. Aggregate with `token_mean` as Trinity-RFT.

    Paper: "Group-Relative REINFORCE Is Secretly an Off-Policy
    Algorithm" (2025); Trinity-RFT `opmd_policy_loss.py`.
    """
    if tau <= -1.0:
        raise ValueError(f"tau must be > -1, got {tau}")
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    return -adv * logp / (1.0 + tau) * mask, ratio_metrics(jnp.exp(log_r), mask, log_r)
