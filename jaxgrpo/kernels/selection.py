"""Prompt and group selection, rollout allocation and prompt sampling (kind "selection").

Knapsack RL budgets, MMR1 VAS, DUMP UCB, DAPO's dynamic-sampling filter, DGPO's
question weights, and the reconstructions of single-stream SPO's value tracker
and prioritized sampling and of TraPO's unlabeled-prompt selector.

`knapsack_allocation` is an exact dynamic program on the host (numpy): it
runs between steps on per-prompt estimates, never inside the jitted update.
The other kernels are pure JAX: masks, weights, sampling probabilities, or
(the SPO tracker) a state in and a state out.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import papers, segments
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.segments import masked_mean
from jaxgrpo.kernels.validation import (
    check_floating,
    check_outcome_inputs,
    check_rank,
    check_same_shape,
    check_valid,
)

Array = jax.Array


_KNAPSACK = "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation (2025)"
_MMR1 = "MMR1: Enhancing Multimodal Reasoning with Variance-Aware Sampling and Open Resources (2025)"
_DUMP = "DUMP: Automated Distribution-Level Curriculum Learning for RL-based LLM Post-training (2025)"


# ----------------------------------------------------------------- Knapsack RL


def nonzero_gradient_probability(success_rate, rollouts):
    """P(a group of N rollouts has both a success and a failure) = 1 - p^N - (1 - p)^N.

    Works on numpy or JAX arrays (broadcasting). 0 for N <= 1.
    """
    p = success_rate
    return 1.0 - p**rollouts - (1.0 - p) ** rollouts


def _bounds(value, m: int, name: str) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(value), (m,)).astype(np.int64)
    if np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return arr


@register("selection", "knapsack_allocation", paper=_KNAPSACK,
          ranges={"budget": (">= 0", "the total rollouts to hand out"),
                  "min_rollouts": (">= 0", "the fewest rollouts of a prompt"),
                  "max_rollouts": (">= min_rollouts", "the most rollouts of a prompt")},
          loop=("needs a sampler drawing a different number of rollouts per prompt; the loop draws group_size for"
                " every prompt"))
def knapsack_allocation(
    success_rates,
    budget: int,
    *,
    min_rollouts=2,
    max_rollouts=128,
    gain=None,
) -> np.ndarray:
    """Knapsack RL: rollouts per prompt maximizing the expected useful gradient, under an exact budget.

    Chooses integers N_i, min_i <= N_i <= max_i, sum_i N_i = budget exactly,
    maximizing sum_i V_i(N_i), V_i(N) = (1 - p_i^N - (1 - p_i)^N) * g_i: the
    probability that prompt i's group has a non-zero GRPO gradient, times a
    per-prompt gain g_i (default 1). Solved exactly by dynamic programming over
    (prompt, rollouts used) in O(M * budget * max_rollouts); ties go to the
    smallest N_i of the last prompt first (deterministic).

    Host-side (numpy), not jittable: the budget fixes the output's meaning and
    the allocation feeds the sampler, outside the jitted update.

    Args:
      success_rates: [M] estimated success probability p_i of each prompt.
      budget: total rollouts to hand out.
      min_rollouts, max_rollouts: per-prompt bounds (scalars or [M]); 2 and
        128 are our defaults (the paper reports up to 93 rollouts for hard
        prompts; its exact bounds are unverified).
      gain: optional [M] g_i. The paper multiplies by an information-gain term
        whose exact form the paper does not give, so it is the caller's.

    Returns:
      int64[M] allocation summing to `budget`.

    Raises:
      ValueError if no allocation within the bounds sums to `budget`.

    Paper: "Knapsack RL" (2025). [Abstract + review: the value's gain term is U.]
    """
    p = np.asarray(success_rates, np.float64)
    if p.ndim != 1:
        raise ValueError(f"success_rates must have shape [M], got shape {p.shape}")
    m = p.shape[0]
    budget = int(budget)
    lo, hi = _bounds(min_rollouts, m, "min_rollouts"), _bounds(max_rollouts, m, "max_rollouts")
    if np.any(lo > hi):
        raise ValueError("min_rollouts must be <= max_rollouts for every prompt")
    if lo.sum() > budget or np.minimum(hi, budget).sum() < budget:
        raise ValueError(
            f"no allocation sums to budget={budget}: the per-prompt bounds allow totals in "
            f"[{int(lo.sum())}, {int(hi.sum())}]"
        )
    g = np.ones(m) if gain is None else np.broadcast_to(np.asarray(gain, np.float64), (m,))

    # best[b]: the best value of the prompts so far using exactly b rollouts.
    best = np.full(budget + 1, -np.inf)
    best[0] = 0.0
    choice = np.zeros((m, budget + 1), np.int64)
    for i in range(m):
        new = np.full(budget + 1, -np.inf)
        for n in range(lo[i], min(hi[i], budget) + 1):
            value = nonzero_gradient_probability(p[i], n) * g[i]
            cand = np.full(budget + 1, -np.inf)
            cand[n:] = best[: budget + 1 - n] + value
            better = cand > new
            new = np.where(better, cand, new)
            choice[i] = np.where(better, n, choice[i])
        best = new
    allocation = np.zeros(m, np.int64)
    b = budget
    for i in range(m - 1, -1, -1):
        allocation[i] = choice[i, b]
        b -= allocation[i]
    return allocation


# -------------------------------------------------------------------- MMR1 VAS


def variance_promotion_score(success_rates, *, diversity=None, ovs_weight: float = 1.0, tds_weight: float = 0.0) -> Array:
    """MMR1's variance promotion score: w_ovs * p (1 - p) + w_tds * TDS.

    p (1 - p) is the outcome variance of a Bernoulli success rate (largest
    for p = 0.5, zero for always/never solved prompts); TDS is a trajectory
    diversity score in [0, 1].
    """
    p = check_floating("success_rates", success_rates)
    check_rank("success_rates", p, 1, "[M]")
    score = ovs_weight * p * (1.0 - p)
    if diversity is not None:
        diversity = check_floating("diversity", diversity)
        check_same_shape("diversity", diversity, "success_rates", p)
        score = score + tds_weight * diversity
    elif tds_weight:
        raise ValueError("tds_weight is set but no diversity scores were given")
    return score


@register("selection", "mmr1_vas_weights", paper=_MMR1, ranges={
    "ovs_weight": (">= 0", "the weight of the outcome variance score"),
    "tds_weight": (">= 0", "the weight of the trajectory diversity score"),
    "weighted_fraction": ("in [0, 1]", "lambda, the share of score-weighted draws"),
})
def mmr1_vas_weights(
    success_rates,
    *,
    diversity=None,
    ovs_weight: float = 1.0,
    tds_weight: float = 0.0,
    weighted_fraction: float = 0.5,
) -> Array:
    """MMR1 variance-aware sampling: prompt probabilities mixing score-weighted and uniform draws.

    q_i = lambda * s_i / sum_j s_j + (1 - lambda) / M, s = `variance_promotion_score`
    (clamped at 0), lambda = `weighted_fraction`; if every score is 0 the
    weighted part is uniform too.

    Args:
      success_rates: f32[M] current success estimates (8 rollouts per prompt,
        refreshed every 4 steps in the paper's setup; the trainer keeps them).
      ovs_weight, tds_weight: 1.0 and 0.0 by default (outcome variance only,
        the code's default); the paper's example uses 0.8 / 0.2.
      weighted_fraction: 0.5 (code default).

    Paper: "MMR1" (2025); checked against the official code.
    """
    if not 0.0 <= weighted_fraction <= 1.0:
        raise ValueError(f"weighted_fraction must be in [0, 1], got {weighted_fraction}")
    score = jnp.maximum(variance_promotion_score(success_rates, diversity=diversity, ovs_weight=ovs_weight, tds_weight=tds_weight), 0.0)
    m = score.shape[0]
    total = score.sum()
    weighted = jnp.where(total > 0, score / jnp.where(total > 0, total, 1.0), 1.0 / m)
    return weighted_fraction * weighted + (1.0 - weighted_fraction) / m


# ------------------------------------------------------------------------ DUMP


@register("selection", "dump_ucb_weights", paper=_DUMP,
          ranges={"temperature": ("> 0", "the softmax temperature over the UCB scores")},
          loop="needs several data distributions with statistics kept across steps (DUMP's curriculum)")
def dump_ucb_weights(mean_abs_advantage, counts, *, temperature: float = 0.1) -> Array:
    """DUMP distribution weights: softmax of a UCB score over data distributions.

    UCB_d = mean|A|_d + sqrt(2 ln(N + 1) / (n_d + 1)), N = sum_d n_d;
    p_d = softmax_d(UCB_d / temperature). mean|A|_d is the mean absolute
    advantage of distribution d's recent samples (a window of 300 in the
    paper; the trainer keeps the window), n_d how often d was sampled.

    Args:
      mean_abs_advantage: f32[D]; counts: [D] non-negative sample counts.
      temperature: 0.1 (paper and code).

    Paper: Wang et al., "DUMP" (2025); checked against the official code.
    """
    mu = check_floating("mean_abs_advantage", mean_abs_advantage)
    check_rank("mean_abs_advantage", mu, 1, "[D]")
    counts = jnp.asarray(counts, mu.dtype)
    check_same_shape("counts", counts, "mean_abs_advantage", mu)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    total = counts.sum()
    ucb = mu + jnp.sqrt(2.0 * jnp.log(total + 1.0) / (counts + 1.0))
    return jax.nn.softmax(ucb / temperature)


# ------------------------------------------------------------------------ DAPO

# DAPO's overlong penalty, `overlong_penalty`, is in `jaxgrpo.kernels.reward_shaping`.
@register("selection", "dynamic_sampling_filter", paper=papers.DAPO,
          ranges={"atol": (">= 0", "the spread of rewards up to which a group counts as all-equal")})
def dynamic_sampling_filter(rewards, group_ids, *, num_groups: int, valid=None, atol: float = 0.0) -> Array:
    """DAPO's dynamic sampling: keep groups whose raw rewards are not all equal.

    A group whose valid rows all have the same reward (all right or all wrong)
    gives zero advantage and no gradient; DAPO drops it and samples more. Use
    the raw correctness (before shaping) as `rewards`.

    keep_i = valid_i and (max_g r - min_g r > atol), max and min over the valid
    rows of i's group.

    Returns:
      bool[N]: True for valid rows of groups with at least two distinct rewards.

    Paper: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    spread = segments.max(rewards, group_ids, num_groups, valid) - segments.min(rewards, group_ids, num_groups, valid)
    keep_group = jnp.isfinite(spread) & (spread > atol)
    return valid & segments.gather(keep_group, group_ids)


# ------------------------------------------------------------ DGPO (MathForge)

# DGPO's advantage, `dgpo`, is in `jaxgrpo.kernels.advantages.group_normalized`.
@register("selection", "dgpo_question_weights", paper=papers.DGPO,
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


# ----------------------------------------------------------- single-stream SPO

# SPO's advantage, `experimental/spo_advantage`, is in `jaxgrpo.kernels.advantages.whitened`.
class SPOTrackerState(NamedTuple):
    """Per-prompt Beta posterior of the success rate: v = alpha / (alpha + beta)."""

    alpha: Array  # f32[P]
    beta: Array  # f32[P]

    @property
    def value(self) -> Array:
        """The tracked success rate v(x) of every prompt, f32[P]."""
        return self.alpha / (self.alpha + self.beta)


def spo_tracker_init(num_prompts: int, initial_values=None, *, prior_count: float = 8.0) -> SPOTrackerState:
    """A tracker with prior alpha = n0 v0, beta = n0 (1 - v0) per prompt.

    Args:
      num_prompts: P, the number of prompts of the dataset (static).
      initial_values: optional f32[P] initial success estimates v0 (e.g. from a
        few offline rollouts); 0.5 when None.
      prior_count: n0, the effective number of observations of the prior
        (8 here; the paper's value is unverified).
    """
    if prior_count <= 0:
        raise ValueError(f"prior_count must be > 0, got {prior_count}")
    v0 = jnp.full((num_prompts,), 0.5, jnp.float32) if initial_values is None else jnp.asarray(initial_values, jnp.float32)
    if v0.shape != (num_prompts,):
        raise ValueError(f"initial_values must have shape [P]=[{num_prompts}], got {tuple(v0.shape)}")
    v0 = jnp.clip(v0, 1e-3, 1.0 - 1e-3)  # a Beta needs alpha, beta > 0
    return SPOTrackerState(prior_count * v0, prior_count * (1.0 - v0))


@register("selection", "experimental/spo_value_tracker", paper=papers.SPO, ranges={
    "kl_half_life": ("> 0", "D_half, the KL at which the forgetting factor halves"),
    "min_forget": ("in [0, max_forget]", "rho_min, the least forgetting factor"),
    "max_forget": ("in [min_forget, 1]", "rho_max, the largest forgetting factor"),
})
def spo_value_tracker(
    state: SPOTrackerState,
    prompt_ids,
    rewards,
    kl,
    *,
    valid=None,
    kl_half_life: float = 0.06,
    min_forget: float = 0.875,
    max_forget: float = 0.96,
) -> SPOTrackerState:
    """Single-stream SPO's KL-adaptive Beta value tracker (reconstruction): state in, state out.

    For every prompt x seen in the batch, with D(x) the KL between the current
    policy and the one that last saw x:
        rho(x) = clip(2^(-D(x) / D_half), rho_min, rho_max),
        alpha <- rho alpha + sum r,   beta <- rho beta + sum (1 - r).
    Prompts not in the batch keep their state. The baseline is v = alpha/(alpha+beta).

    Reconstructed from the abstract and secondary summaries of Xu & Ding,
    "Single-stream Policy Optimization" (2025) ("a persistent, KL-adaptive
    value tracker", a Bayesian Beta tracker whose forgetting grows with the
    policy's drift). Unverified: the exact forgetting law and the constants
    D_half = 0.06, rho in [0.875, 0.96], recalled from the paper but not checked
    against its code.

    Args:
      state: `SPOTrackerState` of P prompts.
      prompt_ids: i32[N] index of each row's prompt, in [0, P).
      rewards: f32[N] rewards in [0, 1] (0/1 correctness in the paper).
      kl: f32[N] the estimated KL D(x) for each row's prompt (rows of one prompt
        are averaged).
      valid: optional bool[N]; invalid rows do not update the state.
    """
    alpha = check_floating("state.alpha", state.alpha)
    beta = check_floating("state.beta", state.beta)
    check_rank("state.alpha", alpha, 1, "[P]")
    if beta.shape != alpha.shape:
        raise ValueError(f"state.beta has shape {tuple(beta.shape)} but state.alpha has {tuple(alpha.shape)}")
    num_prompts = alpha.shape[0]
    rewards, prompt_ids, valid, _ = check_outcome_inputs(rewards, prompt_ids, num_prompts, valid)
    kl = check_floating("kl", kl)
    if kl.shape != rewards.shape:
        raise ValueError(f"kl must have shape [N]=[{rewards.shape[0]}] like rewards, got {tuple(kl.shape)}")
    seen = segments.count(prompt_ids, num_prompts, valid) > 0
    drift = jnp.maximum(segments.mean(kl, prompt_ids, num_prompts, valid), 0.0)
    forget = jnp.clip(jnp.exp2(-drift / kl_half_life), min_forget, max_forget)
    successes = segments.sum(rewards, prompt_ids, num_prompts, valid)
    failures = segments.sum(1.0 - rewards, prompt_ids, num_prompts, valid)
    new_alpha = jnp.where(seen, forget * alpha + successes, alpha)
    new_beta = jnp.where(seen, forget * beta + failures, beta)
    return SPOTrackerState(new_alpha, new_beta)


@register("selection", "experimental/spo_priority", paper=papers.SPO,
          loop=("needs prioritized prompt sampling from the SPO tracker's values; the prompt stream draws prompts"
                " uniformly without replacement"),
          ranges={"floor": (">= 0", "added to every prompt's priority, so solved and hopeless prompts stay reachable")})
def spo_priority(values, *, valid=None, floor: float = 0.05) -> Array:
    """Single-stream SPO's prioritized-sampling weights (reconstruction).

    w(x) ∝ sqrt(v(x) (1 - v(x))) + floor over the valid prompts, normalized to sum 1;
    prompts near v = 0.5 (largest Bernoulli std) are sampled most, the floor
    keeps solved and hopeless prompts reachable.

    Reconstructed from the abstract ("the persistent value tracker naturally
    enables an adaptive curriculum via prioritized sampling"), read as
    priority ∝ sqrt(v(1-v)); the floor 0.05 is unverified.

    Args:
      values: f32[P] tracked success rates (`SPOTrackerState.value`).
      valid: optional bool[P] prompts eligible for sampling.
    """
    values = check_floating("values", values)
    check_rank("values", values, 1, "[P]")
    valid = check_valid("valid", valid, values.shape[0])
    v = jnp.clip(values, 0.0, 1.0)
    score = jnp.where(valid, jnp.sqrt(v * (1.0 - v)) + floor, 0.0)
    return score / jnp.maximum(score.sum(), jnp.finfo(score.dtype).tiny)


# ----------------------------------------------------------------------- TraPO


_TRAPO = "TraPO: A Semi-Supervised Reinforcement Learning Framework for Boosting LLM Reasoning (2025)"


@register("selection", "experimental/trapo_selection", paper=_TRAPO,
          loop="needs a labeled and an unlabeled prompt pool with pass rates tracked across steps (TRAPO)",
          ranges={"top_fraction": ("in [0, 1]", "the fraction of unlabeled prompts kept by similarity rank"),
                  "min_similarity": ("in [-1, 1]", "the cosine similarity above which a prompt is kept")})
def trapo_selection(
    unlabeled_pass_rates,
    labeled_pass_rates,
    *,
    top_fraction: float = 0.1,
    min_similarity: float = 0.4,
    unlabeled_valid=None,
    labeled_valid=None,
) -> tuple[Array, Array]:
    """TraPO's selector of unlabeled prompts whose pass-rate trajectory resembles the labeled ones.

    sim_u = mean over labeled prompts l of cos(traj_u, traj_l), where a
    trajectory is a prompt's pass rate (against majority-vote pseudo-labels for
    unlabeled prompts) over the last E epochs. Keep u if it is in the top
    `top_fraction` by similarity or has sim_u >= `min_similarity`.

    The rule "top-10% ∪ sim ≥ 0.4" is the TraPO repository's; the aggregation over labeled
    prompts (mean cosine) is our reading and unverified.

    Args:
      unlabeled_pass_rates: f32[U, E].
      labeled_pass_rates: f32[L, E].

    Returns:
      (keep bool[U], similarity f32[U]).
    """
    unl = check_floating("unlabeled_pass_rates", unlabeled_pass_rates)
    lab = check_floating("labeled_pass_rates", labeled_pass_rates)
    check_rank("unlabeled_pass_rates", unl, 2, "[U, E]")
    check_rank("labeled_pass_rates", lab, 2, "[L, E]")
    if unl.shape[1] != lab.shape[1]:
        raise ValueError(f"both trajectories need the same number of epochs E, got {unl.shape[1]} and {lab.shape[1]}")
    u_valid = check_valid("unlabeled_valid", unlabeled_valid, unl.shape[0])
    l_valid = check_valid("labeled_valid", labeled_valid, lab.shape[0])

    def unit(x):
        norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
        return jnp.where(norm > 0, x / jnp.where(norm > 0, norm, 1.0), 0.0)

    cos = unit(unl) @ unit(lab).T  # [U, L]
    sim = masked_mean(cos, jnp.broadcast_to(l_valid[None, :], cos.shape), axis=1)
    sim = jnp.where(u_valid, sim, -jnp.inf)
    # Top fraction of the valid prompts; invalid ones sort last (similarity -inf).
    k = jnp.ceil(top_fraction * u_valid.sum() - 1e-6)
    order = jnp.argsort(-sim, stable=True)
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(unl.shape[0], dtype=order.dtype))
    keep = u_valid & ((rank < k) | (sim >= min_similarity))
    return keep, jnp.where(u_valid, sim, 0.0)


__all__ = [
    "SPOTrackerState",
    "dgpo_question_weights",
    "dump_ucb_weights",
    "dynamic_sampling_filter",
    "knapsack_allocation",
    "mmr1_vas_weights",
    "nonzero_gradient_probability",
    "spo_priority",
    "spo_tracker_init",
    "spo_value_tracker",
    "trapo_selection",
    "variance_promotion_score",
]
