"""Group-normalized advantages: each reward against its group's center, scaled by a spread.

GRPO's A_i = (r_i - mean_g) / (std_g + eps) and the estimators that change its center or its scale: Dr. GRPO
(no scale), Lite PPO (`grpo_batch_std`: the batch's std), NGRPO (a virtual best sample joins each group), HAPO
(statistics over the group's tokens), BNPO (a Beta density fitted over the batch), DGPO (the mean absolute
deviation) and MC-GRPO (median and MAD).

Every estimator follows the outcome-estimator contract of `jaxgrpo.kernels.advantages`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import betaln, xlogy

from jaxgrpo.kernels import papers, segments
from jaxgrpo.kernels.advantages.common import (
    STD_DDOF,
    STD_EPS,
    _finish,
    _zero_invalid_and_singletons,
    group_centered,
)
from jaxgrpo.kernels.registry import register_advantage
from jaxgrpo.kernels.segments import lower_median_rows, masked_mean
from jaxgrpo.kernels.validation import check_outcome_inputs

Array = jax.Array


@register_advantage("grpo", paper="DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models (2024)",
                    ranges={"std_ddof": STD_DDOF, "eps": STD_EPS}, group_relative=True)
def grpo(rewards, group_ids, *, num_groups: int, valid=None, std_ddof: int = 1, eps: float = 1e-6) -> Array:
    """Group-normalized advantage (GRPO): A_i = (r_i - mean_g) / (std_g + eps).

    Mean and standard deviation are taken over the valid rows of i's group.

    Args:
      rewards: f32[N] outcome rewards.
      group_ids: i32[N] group (prompt) of each row, in [0, num_groups).
      num_groups: number of groups (static).
      valid: optional bool[N]; invalid rows, and rows with a NaN or inf reward, get 0
        and are left out of the statistics.
      std_ddof: delta degrees of freedom of the group std; 1 (unbiased, as
        `torch.std` in TRL and verl) by default, 0 for the population std.
      eps: added to the std; 1e-6 as in verl. A constant group gets 0.

    Paper: Shao et al., "DeepSeekMath" (2024). Defaults follow verl/TRL.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    normalized = segments.standardize(rewards, group_ids, num_groups, valid, ddof=std_ddof, eps=eps)
    return _finish(normalized, group_ids, num_groups, valid)


@register_advantage("dr_grpo", paper="Understanding R1-Zero-Like Training: A Critical Perspective (2025)",
                    group_relative=True)
def dr_grpo(rewards, group_ids, *, num_groups: int, valid=None) -> Array:
    """Dr. GRPO advantage: A_i = r_i - mean_g (no division by the group std).

    Removing the std avoids up-weighting groups that are nearly all right or all
    wrong. Pair it with the `seq_mean_token_sum_norm` aggregation (a constant
    denominator) to remove the length bias as the paper does.

    Paper: Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    return _finish(group_centered(rewards, group_ids, num_groups, valid), group_ids, num_groups, valid)


@register_advantage("grpo_batch_std", paper="Tricks or Traps? A Deep Dive into RL for LLM Reasoning (2025)",
                    ranges={"std_ddof": ("in [0, batch_size)", "delta degrees of freedom of the batch std"),
                            "eps": ("> 0", "added to the batch std so that constant rewards do not divide by 0")}, group_relative=True)
def grpo_batch_std(rewards, group_ids, *, num_groups: int, valid=None, std_ddof: int = 1, eps: float = 1e-4) -> Array:
    """Group-mean baseline, batch-std scale (Lite PPO): A_i = (r_i - mean_g) / (std_batch + eps).

    mean_g is over the valid rows of i's group, std_batch over the valid rows
    of the whole batch (the raw rewards, not the centered ones). The group std
    of GRPO over-weights groups that are nearly all right or all wrong; the
    batch std keeps one scale for every group. A group with fewer than two
    valid rows gets 0.

    Args:
      std_ddof: 1 (unbiased, as `torch.std` / TRL's `nanstd`), 0 for the population std.
      eps: added to the std; 1e-4 as TRL's `scale_rewards="batch"`.

    Paper: Liu et al., "Tricks or Traps? A Deep Dive into RL for LLM Reasoning"
    (2025), "Lite PPO"; eps and ddof from TRL.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    one_group = jnp.zeros_like(group_ids)
    batch_std = segments.std(rewards, one_group, 1, valid, ddof=std_ddof)[0]
    centered = group_centered(rewards, group_ids, num_groups, valid)
    # Divide in the scale of the rewards' largest magnitude, so 1e30-sized rewards neither overflow nor lose eps.
    peak = jnp.max(jnp.where(valid, jnp.abs(rewards), 0.0))
    k = segments.scale_exponent(peak)
    scale = segments.power_of_two(-k, rewards.dtype)
    advantages = (centered * scale) / (batch_std * scale + segments.scaled_eps(eps, k, rewards.dtype))
    n = segments.gather(segments.count(group_ids, num_groups, valid), group_ids)
    return jnp.where(valid & (n > 1), advantages, 0.0)


# ----------------------------------------------------------------------- NGRPO


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


# ------------------------------------------------------------------------ HAPO

# HAPO's advantage; the loss it is designed for, `hapo_clip`, is in `jaxgrpo.kernels.losses.adaptive_clip`.


@register_advantage("hapo", paper=papers.HAPO, ranges={
    "eps": ("> 0", "added to the token-level std so that a constant group does not divide by 0"),
    "fallback_threshold": ("> 0", "the |advantage| at which a group falls back to GRPO's"),
}, group_relative=True)
def hapo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    lengths,
    valid=None,
    eps: float = 1e-6,
    fallback_threshold: float = 5.0,
) -> Array:
    """HAPO's token-level group average normalization.

    mu_g and sigma_g are taken over all *tokens* of group g (each response's
    reward counted |o_i| times): mu = sum |o_i| r_i / sum |o_i|,
    sigma^2 = sum |o_i| (r_i - mu)^2 / sum |o_i|; A_i = (r_i - mu) / (sigma + eps).
    If any |A_i| >= 5 in a group (a lone long or short response dominating),
    the group falls back to the GRPO advantage (ddof=1).

    Args:
      lengths: [N] response lengths in tokens (the row sums of the loss mask).
      eps: 1e-6 as in the reference code; fallback_threshold 5 as there.

    Paper: Liu et al., "From Uniform to Heterogeneous" (HAPO, 2025); checked
    against the official code.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    lengths = jnp.asarray(lengths, rewards.dtype)
    if lengths.shape != rewards.shape:
        raise ValueError(f"lengths must have shape [N]=[{rewards.shape[0]}], got shape {lengths.shape}")
    weight = jnp.where(valid, jnp.maximum(lengths, 0.0), 0.0)
    total = segments.sum(weight, group_ids, num_groups, valid)
    # On rewards scaled by a power of two per group (eps alike), so the squares cannot overflow.
    scaled, k = segments.unit_scale(rewards, group_ids, num_groups, valid)
    mean = segments.sum(weight * scaled, group_ids, num_groups, valid) / jnp.maximum(total, 1e-12)
    centered = scaled - segments.gather(mean, group_ids)
    var = segments.sum(weight * centered * centered, group_ids, num_groups, valid) / jnp.maximum(total, 1e-12)
    std = jnp.where(var > 0, jnp.sqrt(jnp.where(var > 0, var, 1.0)), 0.0)
    token_level = centered / segments.gather(std + segments.scaled_eps(eps, k, rewards.dtype), group_ids)
    too_large = segments.max(jnp.where(valid, jnp.abs(token_level), 0.0), group_ids, num_groups, valid) >= fallback_threshold
    fallback = grpo(rewards, group_ids, num_groups=num_groups, valid=valid, eps=eps)
    advantages = jnp.where(segments.gather(too_large, group_ids), fallback, token_level)
    n = segments.gather(segments.count(group_ids, num_groups, valid), group_ids)
    return jnp.where(valid & (n > 1), advantages, 0.0)


# ------------------------------------------------------------------------ BNPO


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


# ------------------------------------------------------------ DGPO (MathForge)

# DGPO's question weights (DQW), `dgpo_question_weights`, are in `jaxgrpo.kernels.selection`.


@register_advantage("dgpo", paper=papers.DGPO,
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


# --------------------------------------------------------------------- MC-GRPO

# MC-GRPO's loss mask, `mc_grpo_pivot_mask`, is in `jaxgrpo.kernels.masks`.


def _median_and_mad(rewards, group_ids, num_groups, valid):
    pivot, nonempty = lower_median_rows(rewards, group_ids, num_groups, valid)
    median = jnp.where(nonempty, rewards[pivot], 0.0)
    deviation = jnp.abs(rewards - segments.gather(median, group_ids))
    mad_row, _ = lower_median_rows(deviation, group_ids, num_groups, valid)
    mad = jnp.where(nonempty, deviation[mad_row], 0.0)
    return median, mad, pivot, nonempty


@register_advantage("mc_grpo", paper=papers.MC_GRPO,
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
