"""Reward shaping (kind "reward"): raw outcomes in, the scalar rewards an advantage estimator consumes.

Kernels of kind "reward" map raw outcomes (correctness, lengths, preferences,
likelihoods) to the rewards an advantage estimator consumes; e.g.
`grpo(pref_grpo_win_rate(wins, group_ids, num_groups=G), group_ids, num_groups=G)`.
DAPO's overlong penalty, Pref-GRPO's win rates, S-GRPO's serial early-exit
rewards, GRPO-CARE's consistency bonus and AdaptThink's reward, and the
reconstructions of GRPO-λ's group-switched length penalty and ConciseR's length
reward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import papers, segments
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.validation import check_floating, check_outcome_inputs, check_rank, check_same_shape

Array = jax.Array


# ------------------------------------------------------------------------ DAPO

# DAPO's dynamic-sampling filter, `dynamic_sampling_filter`, is in `jaxgrpo.kernels.selection`.


@register("reward", "overlong_penalty", paper=papers.DAPO, ranges={
    "max_len": (">= cache_len", "L_max, the length in tokens beyond which the penalty is -1"),
    "cache_len": ("in (0, max_len]", "L_cache, the window in tokens before max_len where the penalty grows"),
})
def overlong_penalty(lengths, *, max_len: int = 20480, cache_len: int = 4096) -> Array:
    """DAPO's soft overlong punishment, measured in tokens.

    R(y) = 0 if |y| <= max_len - cache_len; ((max_len - cache_len) - |y|) / cache_len
    inside the cache window; -1 beyond max_len. Add it to the task reward.

    Args:
      lengths: [N] completion lengths in tokens.
      max_len, cache_len: L_max and L_cache; 20480 and 4096 from the paper.

    Paper: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025).
    """
    check_rank("lengths", lengths, 1, "[N]")
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    lengths = jnp.asarray(lengths, jnp.float32)
    soft_start = max_len - cache_len
    penalty = (soft_start - lengths) / cache_len
    return jnp.where(lengths <= soft_start, 0.0, jnp.where(lengths <= max_len, penalty, -1.0))


# ------------------------------------ Pref-GRPO, S-GRPO, GRPO-CARE, AdaptThink


_PREF_GRPO = "Pref-GRPO: Pairwise Preference Reward-based GRPO for Stable Text-to-Image Reinforcement Learning (2025)"
_S_GRPO = "S-GRPO: Early Exit via Reinforcement Learning in Reasoning Models (2025)"
_CARE = "GRPO-CARE: Consistency-Aware Reinforcement Learning for Multimodal Reasoning (2025)"
_ADAPTTHINK = "AdaptThink: Reasoning Models Can Learn When to Think (2025)"


@register("reward", "pref_grpo_win_rate", paper=_PREF_GRPO,
          loop="needs a pairwise preference judge (Pref-GRPO's reward model comparing completions)")
def pref_grpo_win_rate(wins, group_ids, *, num_groups: int, valid=None) -> Array:
    """Pref-GRPO reward: each response's win rate against the rest of its group.

    r_i = (1 / (G_i - 1)) sum_{j != i, j in g(i)} W_ij over the valid rows of
    i's group, W_ij = 1 if the preference model prefers i over j (or its
    probability of doing so). Pairs across groups, the diagonal and invalid
    rows are ignored; single-row groups and invalid rows get 0. Feed the
    result to `grpo` for the paper's normalization.

    Args:
      wins: f32[N, N] pairwise preferences (only within-group entries are read).

    Paper: Wang et al., "Pref-GRPO" (2025); checked against the official code.
    """
    wins = check_floating("wins", wins)
    check_rank("wins", wins, 2, "[N, N]")
    n = wins.shape[0]
    if wins.shape != (n, n):
        raise ValueError(f"wins must be square [N, N], got shape {wins.shape}")
    _, group_ids, valid, num_groups = check_outcome_inputs(jnp.zeros((n,), wins.dtype), group_ids, num_groups, valid)
    pair = (group_ids[:, None] == group_ids[None, :]) & valid[:, None] & valid[None, :] & ~jnp.eye(n, dtype=bool)
    total = jnp.where(pair, wins, 0.0).sum(-1)
    opponents = pair.sum(-1)
    return jnp.where(valid & (opponents > 0), total / jnp.maximum(opponents, 1), 0.0)


@register("reward", "s_grpo_serial_rewards", paper=_S_GRPO,
          loop=("needs serial early-exit rollouts (the correctness of each early exit of a reasoning path, "
                "S-GRPO)"))
def s_grpo_serial_rewards(correct, *, exit_mask=None) -> Array:
    """S-GRPO serial-group rewards for the K early exits of one reasoning path.

    Exits are in order along the path; a correct exit gets 1 / 2^(n_k - 1),
    n_k the number of correct exits up to and including k, a wrong one 0, so
    earlier correct exits earn more (1, 1/2, 1/4, ...). Masked exits get 0
    and do not count.

    Args:
      correct: f32[N, K] exit correctness in {0, 1}, one row per path.
      exit_mask: optional f32[N, K], 1 for exits that exist.

    Paper: Dai et al., "S-GRPO" (2025). [A + third-party re-implementation;
    the exact decay rule is unverified.]
    """
    correct = check_floating("correct", correct)
    check_rank("correct", correct, 2, "[N, K]")
    on = jnp.ones(correct.shape, bool) if exit_mask is None else jnp.asarray(exit_mask) > 0
    check_same_shape("exit_mask", on, "correct", correct)
    hit = on & (correct > 0.5)
    n_correct = jnp.cumsum(hit, axis=-1)
    return jnp.where(hit, jnp.exp2(-(n_correct - 1).astype(correct.dtype)), 0.0)


def s_grpo_serial_advantages(rewards, *, exit_mask=None) -> Array:
    """S-GRPO advantage: A_k = r_k - mean over the path's exits (no std), 0 for masked exits."""
    rewards = check_floating("rewards", rewards)
    check_rank("rewards", rewards, 2, "[N, K]")
    on = jnp.ones(rewards.shape, bool) if exit_mask is None else jnp.asarray(exit_mask) > 0
    check_same_shape("exit_mask", on, "rewards", rewards)
    mean = segments.masked_mean(rewards, on, axis=-1)
    return jnp.where(on, rewards - mean[:, None], 0.0)


@register("reward", "grpo_care_bonus", paper=_CARE,
          ranges={"bonus_weight": (">= 0", "lambda, the weight of the consistency bonus"),
                  "max_consistency": ("in [0, 1]", "the cap of the consistency likelihood"),
                  "accuracy_threshold": ("any", "the accuracy above which a row can earn the bonus"),
                  "margin": (">= 0", "how far below the group's mean consistency a row may be")},
          loop="needs a consistency judge (GRPO-CARE's reference model scoring reasoning-answer consistency)")
def grpo_care_bonus(
    accuracy,
    consistency,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    bonus_weight: float = 0.5,
    max_consistency: float = 0.95,
    accuracy_threshold: float = 0.1,
    margin: float = 0.01,
) -> Array:
    """GRPO-CARE reward: accuracy plus a consistency bonus for accurate, self-consistent answers.

    c_i = min(consistency_i, 0.95); a row is accurate when acc_i > 0.1 and
    acc_i >= the group's mean accuracy; it earns a bonus lambda * acc_i if also
    c_i >= mean_{accurate j in g} c_j - 0.01. Reward = acc_i + bonus_i.

    Args:
      accuracy: f32[N] task accuracy reward.
      consistency: f32[N] likelihood of the answer given the question and the
        reasoning under the slow EMA reference model,
        exp(mean_t log pi_EMA(answer_t | q, CoT)).
      bonus_weight, max_consistency, accuracy_threshold, margin: lambda 0.5,
        0.95, 0.1, 0.01 from the official code.

    Paper: Chen et al., "GRPO-CARE" (2025); checked against the official code.
    """
    accuracy, group_ids, valid, num_groups = check_outcome_inputs(accuracy, group_ids, num_groups, valid)
    consistency = check_floating("consistency", consistency)
    check_same_shape("consistency", consistency, "accuracy", accuracy)
    c = jnp.minimum(consistency, max_consistency)
    mean_acc = segments.gather(segments.mean(accuracy, group_ids, num_groups, valid), group_ids)
    accurate = valid & (accuracy > accuracy_threshold) & (accuracy >= mean_acc)
    mean_c = segments.gather(segments.mean(c, group_ids, num_groups, accurate), group_ids)
    bonus = jnp.where(accurate & (c >= mean_c - margin), bonus_weight * accuracy, 0.0)
    return jnp.where(valid, accuracy + bonus, 0.0)


@register("reward", "adaptthink_reward", paper=_ADAPTTHINK,
          ranges={"delta": (">= 0", "the bonus of a no-thinking answer")},
          loop=("needs a thinking / no-thinking chat template and a reference model's accuracy on each prompt "
                "(AdaptThink)"))
def adaptthink_reward(accuracy, reference_accuracy, no_thinking, *, delta: float = 0.05) -> Array:
    """AdaptThink reward: r = acc - acc_ref(x) + delta * 1[NoThinking].

    acc_ref(x) is the reference model's mean accuracy on the prompt; the
    reward is used directly as the advantage (no group normalization), so
    skipping the thinking pays off only while accuracy stays within delta of
    the reference.

    Args:
      accuracy: f32[N]; reference_accuracy: f32[N] (the prompt's acc_ref on each row);
      no_thinking: bool[N] (or 0/1), whether the response skipped thinking
        (started with `</think>`).
      delta: 0.05 (paper and code).

    Paper: Zhang et al., "AdaptThink" (2025); checked against the official code.
    """
    accuracy = check_floating("accuracy", accuracy)
    check_rank("accuracy", accuracy, 1, "[N]")
    reference_accuracy = check_floating("reference_accuracy", reference_accuracy)
    check_same_shape("reference_accuracy", reference_accuracy, "accuracy", accuracy)
    no_thinking = jnp.asarray(no_thinking)
    check_same_shape("no_thinking", no_thinking, "accuracy", accuracy)
    return accuracy - reference_accuracy + delta * (no_thinking > 0).astype(accuracy.dtype)


# ---------------------------------------------------------------------- GRPO-λ


_LAMBDA = "Stable Reinforcement Learning for Efficient Reasoning (2025)"


def _length_rewards(correct, lengths, group_ids, num_groups, valid):
    """Kimi k1.5's group length reward: 0.5 - (len - min_g)/(max_g - min_g); min(0, .) if wrong."""
    lo = segments.gather(segments.min(lengths, group_ids, num_groups, valid), group_ids)
    hi = segments.gather(segments.max(lengths, group_ids, num_groups, valid), group_ids)
    spread = hi - lo
    has_spread = jnp.isfinite(spread) & (spread > 0)
    score = jnp.where(has_spread, 0.5 - (lengths - lo) / jnp.where(has_spread, spread, 1.0), 0.0)
    return jnp.where(correct > 0.5, score, jnp.minimum(score, 0.0))


@register("reward", "experimental/grpo_lambda", paper=_LAMBDA, ranges={
    "top_fraction": ("in [0, 1]", "lambda, the fraction of groups given the length penalty"),
    "length_weight": (">= 0", "w, the weight of the length reward"),
})
def grpo_lambda(
    correct,
    lengths,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    top_fraction: float = 0.2,
    length_weight: float = 1.0,
) -> Array:
    """GRPO-λ (reconstruction): length-penalized reward only for the groups with the highest correctness.

    c_g = mean correctness of group g. The ceil(lambda G_valid) valid groups with
    the largest c_g (ties broken by group index) get
        r_i = correct_i + w * len_reward_i  (Kimi k1.5's length reward:
        0.5 - (len_i - min_g)/(max_g - min_g) if correct, min(0, that) if wrong),
    every other group gets the plain 0/1 reward r_i = correct_i.

    Reconstructed from the abstract of Dai et al., "Stable Reinforcement
    Learning for Efficient Reasoning" (2025) ("a low correctness ratio triggers
    a switch to length-agnostic 0/1 rewards; a high ratio maintains length
    penalties") and a summary describing a batch-wise top-lambda selection of
    groups. Unverified: the top-fraction rule (vs a fixed threshold), the
    length reward form, lambda = 0.2 and w = 1. top_fraction = 0 gives the
    plain 0/1 rewards.

    Args:
      correct: f32[N] 0/1 correctness.
      lengths: f32[N] completion lengths in tokens.
      top_fraction: lambda in [0, 1].
      length_weight: w.

    Returns:
      f32[N] rewards (0 for invalid rows).
    """
    correct, group_ids, valid, num_groups = check_outcome_inputs(correct, group_ids, num_groups, valid)
    lengths = check_floating("lengths", jnp.asarray(lengths, jnp.float32))
    if lengths.shape != correct.shape:
        raise ValueError(f"lengths must have shape [N]=[{correct.shape[0]}] like correct, got {tuple(lengths.shape)}")
    if not 0.0 <= top_fraction <= 1.0:
        raise ValueError(f"top_fraction must lie in [0, 1], got {top_fraction}")
    n_rows = segments.count(group_ids, num_groups, valid)
    group_valid = n_rows > 0
    ratio = jnp.where(group_valid, segments.mean(correct, group_ids, num_groups, valid), -jnp.inf)
    # Rank of each group: how many valid groups come before it in (ratio desc, index asc).
    idx = jnp.arange(num_groups)
    before = (ratio[None, :] > ratio[:, None]) | ((ratio[None, :] == ratio[:, None]) & (idx[None, :] < idx[:, None]))
    rank = (before & group_valid[None, :]).sum(-1)
    k = jnp.ceil(top_fraction * group_valid.sum() - 1e-6)
    penalized = group_valid & (rank < k)
    length_reward = _length_rewards(correct, lengths, group_ids, num_groups, valid)
    rewards = correct + jnp.where(segments.gather(penalized, group_ids), length_weight * length_reward, 0.0)
    return jnp.where(valid, rewards, 0.0)


# -------------------------------------------------------------------- ConciseR


_CONCISER = "Walk Before You Run! Concise LLM Reasoning via Reinforcement Learning (2025)"


@register("reward", "experimental/conciser_length_reward", paper=_CONCISER, ranges={
    "max_len": (">= 1", "L_max, the length in tokens at which the bonus reaches 0"),
    "length_coef": (">= 0", "beta, the weight of the length bonus"),
})
def conciser_length_reward(
    correct,
    lengths,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    max_len: int = 8192,
    length_coef: float = 1.0,
) -> Array:
    """ConciseR stage 2 (reconstruction): a length reward only when every rollout of the prompt is correct.

    r_i = correct_i + beta (1 - len_i / L_max) if all valid rows of i's group are
    correct, else r_i = correct_i. Lengths beyond L_max earn no bonus (clipped
    at 0). Shorter correct answers then get positive GRPO advantages in solved
    groups, while groups still being learned keep the accuracy-only signal.

    Reconstructed from the abstract of Song & Zheng, "Walk Before You Run!
    Concise LLM Reasoning via Reinforcement Learning" (2025) ("length reward
    applied only when all rollouts of a prompt are correct"). Unverified: the
    linear bonus, beta = 1 and L_max = 8192 (set L_max to the rollout's length
    budget). length_coef = 0 gives the plain 0/1 rewards.

    Args:
      correct: f32[N] 0/1 correctness.
      lengths: f32[N] completion lengths in tokens.
      max_len: L_max.
      length_coef: beta.
    """
    correct, group_ids, valid, num_groups = check_outcome_inputs(correct, group_ids, num_groups, valid)
    lengths = check_floating("lengths", jnp.asarray(lengths, jnp.float32))
    if lengths.shape != correct.shape:
        raise ValueError(f"lengths must have shape [N]=[{correct.shape[0]}] like correct, got {tuple(lengths.shape)}")
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")
    all_correct = segments.min(correct, group_ids, num_groups, valid) > 0.5  # an empty group's +inf is never gathered
    bonus = length_coef * jnp.clip(1.0 - lengths / max_len, 0.0, 1.0)
    rewards = correct + jnp.where(segments.gather(all_correct, group_ids), bonus, 0.0)
    return jnp.where(valid, rewards, 0.0)


__all__ = [
    "adaptthink_reward",
    "conciser_length_reward",
    "grpo_care_bonus",
    "grpo_lambda",
    "overlong_penalty",
    "pref_grpo_win_rate",
    "s_grpo_serial_advantages",
    "s_grpo_serial_rewards",
]
