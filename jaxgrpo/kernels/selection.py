"""Rollout allocation and prompt sampling: Knapsack RL budgets, MMR1 VAS, DUMP UCB.

`knapsack_allocation` is an exact dynamic program on the host (numpy): it
runs between steps on per-prompt estimates, never inside the jitted update.
The two samplers are pure JAX and return sampling probabilities.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.validation import check_floating, check_rank, check_same_shape

Array = jax.Array

_KNAPSACK = "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation (2025)"
_MMR1 = "MMR1: Enhancing Multimodal Reasoning with Variance-Aware Sampling and Open Resources (2025)"
_DUMP = "DUMP: Automated Distribution-Level Curriculum Learning for RL-based LLM Post-training (2025)"


# --------------------------------------------------------------------------- Knapsack RL


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


# --------------------------------------------------------------------------- MMR1 VAS


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


# --------------------------------------------------------------------------- DUMP


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


__all__ = [
    "dump_ucb_weights",
    "knapsack_allocation",
    "mmr1_vas_weights",
    "nonzero_gradient_probability",
    "variance_promotion_score",
]
