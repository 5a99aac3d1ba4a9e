"""Baseline-subtracted advantages: A_i = r_i - b_i, with no division by a group std.

The baseline is the rest of the group (RLOO; pass@k's best row against the group's second best), a
length-weighted group mean (OPO), the group mean with GPG's rescaling, a greedy rollout's reward (ReMax), a
shifted or soft-max group mean (AsymRE, OPMD), or the estimate of a Kalman filter run over the group (KRPO).

Every estimator follows the outcome-estimator contract of `jaxgrpo.kernels.advantages`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import papers, segments
from jaxgrpo.kernels.advantages.common import (
    STD_EPS,
    _finish,
    _group_count,
    _zero_invalid_and_singletons,
    checked_lengths,
    group_centered,
)
from jaxgrpo.kernels.registry import register_advantage
from jaxgrpo.kernels.validation import check_floating, check_outcome_inputs

Array = jax.Array


@register_advantage("rloo", paper="Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs (2024)",
                    group_relative=True)
def rloo(rewards, group_ids, *, num_groups: int, valid=None) -> Array:
    """Leave-one-out baseline (RLOO): A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_g).

    G is the number of valid rows of i's group; a group of one gets 0.

    Paper: Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs" (2024).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    n = segments.gather(segments.count(group_ids, num_groups, valid), group_ids)
    scale = n / jnp.maximum(n - 1, 1)
    return _finish(scale * group_centered(rewards, group_ids, num_groups, valid), group_ids, num_groups, valid)


# ---------------------------------------------------------------------------------------------------------
# The other outcome estimators of verl's registry (verl 1dda039, verl/trainer/ppo/core_algos.py): OPO, GPG,
# the pass@k advantage and ReMax (REINFORCE++ is in `whitened`). Advantages are constants for the policy
# gradient: each returns stop_gradient of its result. Unlike RLOO above, a group with one valid row keeps its
# raw reward where verl does (OPO, GPG), as stated in each docstring.
# ---------------------------------------------------------------------------------------------------------


def _row_input(name: str, x, n: int, valid: Array) -> tuple[Array, Array]:
    """A float row input f32[N] checked against the rewards; returns (x with 0 where unusable, usable rows)."""
    x = jnp.asarray(x)
    x = x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.integer) else check_floating(name, x)
    if x.shape != (n,):
        raise ValueError(f"{name} must have shape [N]=[{n}] like rewards, got shape {tuple(x.shape)}")
    usable = valid & jnp.isfinite(x)
    return jnp.where(usable, x, 0.0), usable


@register_advantage("opo", paper="On-Policy RL with Optimal Reward Baseline (2025)")
def opo(rewards, group_ids, *, num_groups: int, valid=None, lengths) -> Array:
    """OPO advantage: the length-weighted group mean as baseline, A_i = r_i - sum_j l_j r_j / sum_j l_j.

    The optimal reward baseline for sequence-level rewards under the paper's
    assumptions weights each completion by its length l_j (tokens), over the
    valid rows j of i's group. As verl, a group with one valid row keeps its raw
    reward (baseline 0), and so does a group whose rows have no token. No
    division by a standard deviation.

    Args:
      lengths: f32[N] completion tokens per row (the trainer passes them).

    Paper: Hao et al., "On-Policy RL with Optimal Reward Baseline" (2025); verl's `opo`.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    lengths = checked_lengths(lengths, rewards.shape[0], valid)
    # In units of 2^k per group (`unit_scale`), so sum_j l_j r_j cannot overflow.
    scaled, k = segments.unit_scale(rewards, group_ids, num_groups, valid)
    weighted = segments.sum(lengths * scaled, group_ids, num_groups, valid)
    total_length = segments.sum(lengths, group_ids, num_groups, valid)
    baseline = weighted / jnp.maximum(total_length, 1e-30) * segments.power_of_two(k, rewards.dtype)
    n = _group_count(group_ids, num_groups, valid)
    baseline = jnp.where(n > 1, segments.gather(baseline, group_ids), 0.0)
    return jax.lax.stop_gradient(jnp.where(valid, rewards - baseline, 0.0))


@register_advantage("gpg", paper="GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning (2025)",
                    ranges={"f_norm": ("> 0", "the constant F_norm the advantages are divided by")})
def gpg(rewards, group_ids, *, num_groups: int, valid=None, f_norm: float = 1.0) -> Array:
    """GPG advantage: A_i = alpha (r_i - mean_g) / F_norm, alpha = N / M.

    N is the number of valid rows of the batch and M the number of them with a
    nonzero reward (verl's count of nonzero scores; at least 1): alpha rescales
    the gradient, which rows with zero advantage would otherwise dilute. No
    division by the group std. As verl, a group with one valid row keeps its
    raw reward (group mean 0).

    Args:
      f_norm: the constant F_norm; 1 as verl and the paper.

    Paper: Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline
    for Model Reasoning" (2025); alpha and F_norm as verl's `gpg` estimator.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    num_rows = valid.sum()
    num_nonzero = (valid & (rewards != 0)).sum()
    alpha = num_rows / jnp.maximum(num_nonzero, 1)
    n = _group_count(group_ids, num_groups, valid)
    centered = jnp.where(n > 1, group_centered(rewards, group_ids, num_groups, valid), rewards)
    return jax.lax.stop_gradient(jnp.where(valid, alpha * centered / f_norm, 0.0))


@register_advantage(
    "pass_at_k", paper="Optimizing Language Models for Inference Time Objectives using Reinforcement Learning (2025)",
    ranges={"eps": STD_EPS},
    group_relative=True,
)
def pass_at_k(rewards, group_ids, *, num_groups: int, valid=None, std_normalize: bool = True, eps: float = 1e-6) -> Array:
    """Pass@k advantage: only each group's best row gets A = (r_max - r_second) / (std_g + eps).

    The best row is the valid row with the largest reward (the first one when
    several tie, which then gives r_max - r_second = 0); every other row gets 0.
    std_g is the unbiased std of the group's valid rewards (`torch.std`). A
    group with fewer than two valid rows gets 0 (verl raises an error).

    Args:
      std_normalize: divide by std_g + eps (verl's `norm_adv_by_std_in_grpo`, True).
      eps: 1e-6 as verl.

    Paper: Tang et al., "Optimizing Language Models for Inference Time Objectives
    using Reinforcement Learning" (2025); verl's `grpo_passk`.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    # On rewards scaled by a power of two per group: the gap and the std cannot overflow.
    scaled, k = segments.unit_scale(rewards, group_ids, num_groups, valid)
    order, start, n = segments.sorted_within_groups(scaled, group_ids, num_groups, valid)
    ranked = scaled[order]
    last = rewards.shape[0] - 1
    best = ranked[jnp.clip(start + n - 1, 0, last)]
    second = ranked[jnp.clip(start + n - 2, 0, last)]
    gap = best - second
    if std_normalize:
        std = segments.std(scaled, group_ids, num_groups, valid, ddof=1)
        gap = gap / (std + segments.scaled_eps(eps, k, rewards.dtype))
    else:
        gap = gap * segments.power_of_two(k, rewards.dtype)
    rows = jnp.arange(rewards.shape[0])
    is_best = valid & (scaled == segments.gather(best, group_ids))
    first_best = jax.ops.segment_min(jnp.where(is_best, rows, rows.shape[0]), group_ids, num_segments=num_groups)
    chosen = is_best & (rows == segments.gather(first_best, group_ids)) & segments.gather(n >= 2, group_ids)
    return jax.lax.stop_gradient(jnp.where(chosen, segments.gather(gap, group_ids), 0.0))


@register_advantage("remax", paper="ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large Language Models (2023)",
          loop=("needs a greedy-baseline rollout of each prompt (ReMax's baseline_rewards), which the sampler "
                "does not draw"))
def remax(rewards, group_ids, *, num_groups: int, valid=None, baseline_rewards) -> Array:
    """ReMax advantage: A_i = r_i - b_i, b_i the reward of the greedy completion of i's prompt.

    The baseline is a second, greedy rollout per prompt, scored like the sampled
    ones; it is an input here (`baseline_rewards`, one per row). A row whose
    baseline is NaN or inf is invalid (0). Groups are not used.

    Args:
      baseline_rewards: f32[N], the greedy completion's reward for each row's
        prompt. The trainer does not yet sample greedy baselines: give them to
        the kernel directly.

    Paper: Li et al., "ReMax: A Simple, Effective, and Efficient Reinforcement
    Learning Method for Aligning Large Language Models" (2023); verl's `remax`.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    baseline, valid = _row_input("baseline_rewards", baseline_rewards, rewards.shape[0], valid)
    return jax.lax.stop_gradient(jnp.where(valid, rewards - baseline, 0.0))


# ------------------------------------ Off-policy group REINFORCE: AsymRE, OPMD

# Their losses, `rec` and `opmd` (`opmd_loss`), are in `jaxgrpo.kernels.losses.reinforce`.


@register_advantage("asymre", paper=papers.OFF_POLICY_REINFORCE,
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


@register_advantage("opmd", paper=papers.OFF_POLICY_REINFORCE,
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


# ------------------------------------------------------------------------ KRPO


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
