"""Catalog reward kernels: Pref-GRPO win rates, S-GRPO serial exits, GRPO-CARE bonus, AdaptThink.

Kernels of kind "reward" map raw outcomes (correctness, preferences,
likelihoods) to the scalar rewards an advantage estimator consumes; e.g.
`grpo(pref_grpo_win_rate(wins, group_ids, num_groups=G), group_ids, num_groups=G)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.validation import check_floating, check_outcome_inputs, check_rank, check_same_shape

Array = jax.Array

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


__all__ = [
    "adaptthink_reward",
    "grpo_care_bonus",
    "pref_grpo_win_rate",
    "s_grpo_serial_advantages",
    "s_grpo_serial_rewards",
]
