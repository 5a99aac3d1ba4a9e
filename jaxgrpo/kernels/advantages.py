"""Outcome advantage estimators: the baselines (GRPO, Dr. GRPO, RLOO, REINFORCE++) and verl's OPO, GPG, pass@k, ReMax.

Every estimator follows one contract::

    fn(rewards: f32[N], group_ids: i32[N], *, num_groups: int,
       valid: bool[N] | None = None, **hparams) -> f32[N]

Rows with `valid=False` (padding, filtered groups) get advantage 0 and do not
enter their group's statistics. A group with a single valid row gets 0, except
where verl keeps its raw reward (group baseline 0): `reinforce_pp_baseline`,
`opo` and `gpg`, as their docstrings say.

Non-finite rewards: a row whose reward is NaN or +-inf is invalid (advantage 0,
left out of its group's statistics), in every registered estimator; the other
rows of its group get the advantages of the group without it. Large rewards:
group and batch statistics are computed on rewards scaled by a power of two
(`segments.unit_scale`), so the normalized estimators (GRPO, REINFORCE++) are
finite for any finite reward, and the others overflow only where the
advantage itself exceeds the largest float.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.registry import register_advantage
from jaxgrpo.kernels.validation import check_floating, check_outcome_inputs

Array = jax.Array

# Declared ranges shared by the estimators (`jaxgrpo.kernels.hyperparameters`).
#: A group std needs more valid rows than its delta degrees of freedom; at group_size or more every std is 0.
STD_DDOF = ("in [0, group_size)", "delta degrees of freedom of the group std")
#: Added to a std: with 0 a constant group divides 0 by 0.
STD_EPS = ("> 0", "added to the std so that a constant group does not divide by 0")
WHITEN_EPS = ("> 0", "added to the batch variance so that constant rewards do not divide by 0")
WHITEN = ("one of tokens, rows", "what the batch whitening weighs: each token or each row")


def group_centered(rewards: Array, group_ids: Array, num_groups: int, valid: Array) -> Array:
    """r_i - mean of r over the valid rows of i's group."""
    mean = segments.mean(rewards, group_ids, num_groups, valid)
    return rewards - segments.gather(mean, group_ids)


def batch_whiten(x: Array, valid: Array, *, ddof: int = 1, eps: float = 1e-8) -> Array:
    """(x - mean) / sqrt(var + eps) over the valid rows of the whole batch; 0 for invalid rows."""
    return segments.masked_standardize(x, valid, ddof=ddof, eps=eps, eps_inside=True)


def _finish(advantages: Array, group_ids: Array, num_groups: int, valid: Array) -> Array:
    """Zero for invalid rows and for groups with fewer than two valid rows."""
    n = segments.gather(segments.count(group_ids, num_groups, valid), group_ids)
    return jnp.where(valid & (n > 1), advantages, 0.0)


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


WHITEN_MODES = ("tokens", "rows")


def checked_lengths(lengths, n: int, valid: Array) -> Array | None:
    """Completion lengths f32[N] (tokens per row) as floats, 0 for invalid rows and never negative; None stays None."""
    if lengths is None:
        return None
    lengths = jnp.asarray(lengths)
    lengths = lengths.astype(jnp.float32) if jnp.issubdtype(lengths.dtype, jnp.integer) else check_floating("lengths", lengths)
    if lengths.shape != (n,):
        raise ValueError(f"lengths must have shape [N]=[{n}] like rewards, got shape {tuple(lengths.shape)}")
    return jnp.where(valid & jnp.isfinite(lengths), jnp.maximum(lengths, 0.0), 0.0)


def whitened(x: Array, valid: Array, *, mode: str = "tokens", lengths: Array | None = None, eps: float = 1e-8) -> Array:
    """Batch whitening (x - mean) / sqrt(var + eps), unbiased variance, over tokens or over rows.

    `mode="tokens"` weights each row by its number of completion tokens
    (`lengths`), which is the whitening of a row-constant advantage broadcast
    over its tokens with the completion mask (REINFORCE++'s and verl's
    `masked_whiten`): mean = sum_i l_i x_i / L, var = sum_i l_i (x_i - mean)^2 / (L - 1),
    L = sum_i l_i. Without `lengths` every row counts as one token, which is
    `mode="rows"`: each valid row weighs 1 whatever its length. A row with no
    token gets 0.
    """
    if mode not in WHITEN_MODES:
        raise ValueError(f"whiten must be one of {', '.join(WHITEN_MODES)}, got {mode!r}")
    weight = valid.astype(x.dtype)
    if mode == "tokens" and lengths is not None:
        weight = weight * lengths
    return segments.masked_standardize(x, weight, ddof=1, eps=eps, eps_inside=True)


@register_advantage("reinforce_pp", paper="REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models (2025)",
                    ranges={"eps": WHITEN_EPS, "whiten": WHITEN})
def reinforce_pp(
    rewards, group_ids, *, num_groups: int, valid=None, eps: float = 1e-8, whiten: str = "tokens", lengths=None
) -> Array:
    """REINFORCE++ advantage: the rewards whitened over the global batch.

    A_i = (r_i - mean) / sqrt(var + eps), unbiased variance; groups are ignored
    (no per-prompt baseline). With `whiten="tokens"` (the default, as the paper
    and verl: the advantage of every completion token is whitened) mean and
    variance are taken over the tokens of the batch, each row weighted by its
    length; with `whiten="rows"` over the valid rows, each row weighing 1. The
    two agree only when every row has the same number of tokens, up to the
    unbiased variance's (L - 1) vs (N - 1). For token-level returns with a KL
    term folded into the reward, use `discounted_returns` and `masked_whiten`.

    Args:
      whiten: "tokens" or "rows".
      lengths: f32[N] completion tokens per row (the trainer passes them); without
        them every row counts as one token, i.e. row whitening.

    Paper: Hu, "REINFORCE++" (2025); eps and the unbiased variance follow verl.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    lengths = checked_lengths(lengths, rewards.shape[0], valid)
    return jnp.where(valid, whitened(rewards, valid, mode=whiten, lengths=lengths, eps=eps), 0.0)


@register_advantage("reinforce_pp_baseline", paper="REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models (2025)",
                    ranges={"eps": WHITEN_EPS, "whiten": WHITEN})
def reinforce_pp_baseline(
    rewards, group_ids, *, num_groups: int, valid=None, eps: float = 1e-8, whiten: str = "tokens", lengths=None
) -> Array:
    """REINFORCE++ with a group baseline: subtract the group mean, then whiten over the batch.

    A_i = whiten_batch(r_i - b_g), b_g the mean of the valid rows of i's group,
    except that a group with a single valid row keeps its raw reward (b_g = 0),
    as verl does; that row then enters the batch statistics with r_i, which
    changes every row's whitened advantage. Whitening is over tokens (default,
    the paper and verl) or rows, as in `reinforce_pp`.

    Args:
      whiten: "tokens" or "rows".
      lengths: f32[N] completion tokens per row (the trainer passes them); without
        them every row counts as one token, i.e. row whitening.

    Paper: Hu, "REINFORCE++" (2025); the baseline variant and single-row groups as in verl.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    lengths = checked_lengths(lengths, rewards.shape[0], valid)
    n = segments.gather(segments.count(group_ids, num_groups, valid), group_ids)
    centered = jnp.where(n > 1, group_centered(rewards, group_ids, num_groups, valid), rewards)
    return jnp.where(valid, whitened(centered, valid, mode=whiten, lengths=lengths, eps=eps), 0.0)


# ---------------------------------------------------------------------------------------------------------
# The other outcome estimators of verl's registry (verl 1dda039, verl/trainer/ppo/core_algos.py): OPO, GPG,
# the pass@k advantage and ReMax. Advantages are constants for the policy gradient: each returns
# stop_gradient of its result. Unlike the estimators above, a group with one valid row keeps its raw
# reward where verl does (OPO, GPG), as stated in each docstring.
# ---------------------------------------------------------------------------------------------------------


def _row_input(name: str, x, n: int, valid: Array) -> tuple[Array, Array]:
    """A float row input f32[N] checked against the rewards; returns (x with 0 where unusable, usable rows)."""
    x = jnp.asarray(x)
    x = x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.integer) else check_floating(name, x)
    if x.shape != (n,):
        raise ValueError(f"{name} must have shape [N]=[{n}] like rewards, got shape {tuple(x.shape)}")
    usable = valid & jnp.isfinite(x)
    return jnp.where(usable, x, 0.0), usable


def _group_count(group_ids: Array, num_groups: int, valid: Array) -> Array:
    return segments.gather(segments.count(group_ids, num_groups, valid), group_ids)


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
