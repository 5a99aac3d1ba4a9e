"""Token, segment and rank credit assignment (kind "credit"): TW-GRPO, PURE, Rank-GRPO, segments, GRPO-VPS.

Kernels of kind "credit" turn group, step or segment information into per-token
weights or advantages `[N, T]` (Rank-GRPO: per-rank `[N, K]`, with helpers to
move between ranks and tokens). They are pure: every extra input (token
distributions, step rewards, segment boundaries, rank ids, probe probabilities)
is an array argument. The importance weights of a sampler/trainer mismatch,
also of kind "credit", are in `importance`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.advantages.common import STD_DDOF, STD_EPS
from jaxgrpo.kernels.losses.common import log_ratio
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.validation import (
    check_floating,
    check_group_ids,
    check_integer,
    check_num_groups,
    check_outcome_inputs,
    check_rank,
    check_same_shape,
    check_token_inputs,
)

Array = jax.Array


_TW_GRPO = "Reinforcing Video Reasoning with Focused Thinking (2025)"
_PURE = "Stop Summation: Min-Form Credit Assignment Is All Process Reward Model Needs for Reasoning (2025)"
_RANK_GRPO = "Rank-GRPO: Training LLM-based Conversational Recommender Systems with Reinforcement Learning (2025)"
_SEGMENT = (
    "Segment Policy Optimization: Effective Segment-Level Credit Assignment in RL for Large Language Models (2025); "
    "GRPO-VPS (2025)"
)


# --------------------------------------------------------------------- TW-GRPO


def minmax_token_weights(divergence, position_mask, *, alpha: float = 1.7) -> Array:
    """w_t = 1 + (alpha - 1) * minmax_t(D_t) along the last axis.

    minmax_t(D) = (D_t - min D) / (max D - min D) over the positions where
    `position_mask` is set (0 if all equal); w is 1 at the least divergent
    position and alpha at the most divergent one; 0 where masked.
    """
    divergence = check_floating("divergence", divergence)
    on = jnp.asarray(position_mask) > 0
    check_same_shape("position_mask", on, "divergence", divergence)
    low = jnp.min(jnp.where(on, divergence, jnp.inf), axis=-1, keepdims=True)
    high = jnp.max(jnp.where(on, divergence, -jnp.inf), axis=-1, keepdims=True)
    spread = high - low
    ok = jnp.isfinite(spread) & (spread > 0)
    scaled = jnp.where(ok & on, (divergence - jnp.where(ok, low, 0.0)) / jnp.where(ok, spread, 1.0), 0.0)
    # XLA may evaluate `divergence` in the min/max fusion and here with different roundings; when the
    # spread is a few ulps that alone moves `scaled` outside [0, 1] (seen: 1.013), so clamp.
    scaled = jnp.clip(scaled, 0.0, 1.0)
    return jnp.where(on, 1.0 + (alpha - 1.0) * scaled, 0.0)


@register("credit", "tw_grpo_weights", paper=_TW_GRPO,
          ranges={"alpha": (">= 1", "the largest token weight (the smallest is 1)")},
          loop=("needs log-probs over the whole vocabulary [N, T, V], which the trainer never materializes (it "
                "scores tokens in vocabulary chunks)"))
def tw_grpo_weights(token_logprobs, group_ids, *, num_groups: int, mask, valid=None, alpha: float = 1.7) -> Array:
    """TW-GRPO token weights from the divergence of a group's next-token distributions.

    At each position t of group g: log p_bar = log_softmax(mean_i log p_i) (the
    group's mean distribution in log space, renormalized), with a masked
    position of row i counted as the uniform distribution;
    KL_t = mean_i sum_v p_bar(v) [log p_bar(v) - log p_i(v)];
    w_{i,t} = 1 + (alpha - 1) * minmax_t(KL_t) over the positions where some
    row of g has a token. Multiply the per-token loss by w and take the token
    mean, as the paper does. Weights are constants (no gradient).

    Args:
      token_logprobs: f32[N, T, V] log-softmax of the policy at every position.
      group_ids, num_groups, valid: the group of each row (invalid rows are left
        out of the statistics and get weight 0).
      mask: f32[N, T] response-token mask.
      alpha: the maximum weight, 1.7 (paper and code).

    Paper: "Reinforcing Video Reasoning with Focused Thinking" (TW-GRPO, 2025).
    The renormalization of p_bar is our reading of "group mean in log space".
    """
    token_logprobs = check_floating("token_logprobs", token_logprobs)
    check_rank("token_logprobs", token_logprobs, 3, "[N, T, V]")
    n, t, v = token_logprobs.shape
    _, group_ids, valid, num_groups = check_outcome_inputs(
        jnp.zeros((n,), token_logprobs.dtype), group_ids, num_groups, valid
    )
    mask = jnp.asarray(mask, token_logprobs.dtype)
    check_same_shape("mask", mask, "token_logprobs[..., 0]", token_logprobs[..., 0])
    logq = jax.lax.stop_gradient(token_logprobs)
    logq = jnp.where(mask[..., None] > 0, logq, -jnp.log(float(v)))
    log_bar = jax.nn.log_softmax(segments.mean(logq, group_ids, num_groups, valid), axis=-1)  # [G, T, V]
    bar_rows = segments.gather(log_bar, group_ids)
    kl_rows = jnp.sum(jnp.exp(bar_rows) * (bar_rows - logq), axis=-1)  # [N, T]
    kl = segments.mean(kl_rows, group_ids, num_groups, valid)  # [G, T]
    positions = segments.sum((mask > 0).astype(mask.dtype), group_ids, num_groups, valid) > 0
    weights = minmax_token_weights(kl, positions, alpha=alpha)
    return jnp.where(valid[:, None] & (mask > 0), segments.gather(weights, group_ids), 0.0)


# ------------------------------------------------------------------------ PURE


@register("credit", "pure_min_form", paper=_PURE,
          ranges={"temperature": ("> 0", "T of the softmin over the step rewards")},
          loop="needs a process reward model (a reward for each reasoning step)")
def pure_min_form(process_rewards, step_mask, *, temperature: float = 0.1, mask=None) -> Array:
    """PURE min-form credit: returns-to-go of softmin-weighted process rewards.

    For the steps k of a row (tokens where `step_mask` is set, e.g. each
    step's last token) with PRM rewards r_k = p(+) - p(-):
    w_k = softmax_k(-r_k / T), r'_k = w_k r_k, and the token return is
    G_t = sum_{k at or after t} r'_k. With T -> 0 the weights concentrate on
    the worst future step, so G_t approaches min of the future rewards (the
    min-form value) instead of their sum. Use G_t as the token advantage.

    Args:
      process_rewards: f32[N, T], the step reward at each step token (others ignored).
      step_mask: f32[N, T] (or bool), 1 at step tokens.
      temperature: T = 0.1 (paper and code).
      mask: optional f32[N, T] response mask; returns are 0 where it is 0.

    Paper: Cheng et al., "Stop Summation: Min-Form Credit Assignment Is All
    Process Reward Model Needs for Reasoning" (PURE, 2025).
    """
    process_rewards = check_floating("process_rewards", process_rewards)
    check_rank("process_rewards", process_rewards, 2, "[N, T]")
    steps = jnp.asarray(step_mask) > 0
    check_same_shape("step_mask", steps, "process_rewards", process_rewards)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    process_rewards = segments.fill_masked(steps, process_rewards)  # only step tokens are read
    logits = jnp.where(steps, -process_rewards / temperature, -jnp.inf)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    peak = jax.lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))
    e = jnp.where(steps, jnp.exp(logits - peak), 0.0)
    w = e / jnp.maximum(e.sum(-1, keepdims=True), jnp.finfo(e.dtype).tiny)
    weighted = jnp.where(steps, w * process_rewards, 0.0)
    returns = jnp.flip(jnp.cumsum(jnp.flip(weighted, -1), -1), -1)
    if mask is not None:
        m = jnp.asarray(mask)
        check_same_shape("mask", m, "process_rewards", process_rewards)
        returns = jnp.where(m > 0, returns, 0.0)
    return returns


# ------------------------------------------------------------------- Rank-GRPO


def rank_rewards(hits, *, reward: str = "dcg") -> Array:
    """Per-rank rewards of a recommendation list.

    "dcg" (causal DCG): r_k = sum_{j >= k} hit_j / log2(j + 1) (ranks from 1),
    so a rank is credited with the gain of itself and everything after it;
    "hit": r_k = hit_k.
    """
    hits = check_floating("hits", hits)
    check_rank("hits", hits, 2, "[N, K]")
    if reward == "hit":
        return hits
    if reward != "dcg":
        raise ValueError(f"reward must be 'dcg' or 'hit', got {reward!r}")
    k = hits.shape[-1]
    discount = 1.0 / jnp.log2(jnp.arange(2, k + 2, dtype=hits.dtype))
    return jnp.flip(jnp.cumsum(jnp.flip(hits * discount, -1), -1), -1)


@register("credit", "rank_grpo", paper=_RANK_GRPO,
          ranges={"reward": ("one of dcg", "the reward of a rank from its hits (causal DCG)"),
                  "std_ddof": STD_DDOF, "eps": STD_EPS},
          loop="needs a ranking task (the relevance of each ranked item)")
def rank_grpo(hits, group_ids, *, num_groups: int, valid=None, reward: str = "dcg", std_ddof: int = 1, eps: float = 1e-6) -> Array:
    """Rank-GRPO per-rank advantages: each rank normalized across the group's lists.

    r_{i,k} = `rank_rewards(hits)`; A_{i,k} = (r_{i,k} - mean_g r_{.,k}) /
    (std_g r_{.,k} + eps) over the valid lists i of group g (ddof = 1, the
    GRPO convention). Single-list groups and invalid rows (also lists with a
    NaN or inf rank reward) get 0. Pair with
    `rank_level_ratio` (the rank-level importance ratio) and
    `rank_token_values` (to put A on the rank's tokens).

    Args:
      hits: f32[N, K], 1 where the item at rank k of list i is relevant.

    Paper: "Rank-GRPO" (2025).
    """
    r, group_ids, valid, num_groups = check_outcome_inputs(
        rank_rewards(hits, reward=reward), group_ids, num_groups, valid, reward_shape="[N, K]"
    )
    adv = segments.standardize(r, group_ids, num_groups, valid, ddof=std_ddof, eps=eps)
    n = segments.gather(segments.count(group_ids, num_groups, valid), group_ids)
    return jnp.where((valid & (n > 1))[:, None], adv, 0.0)


def _rank_one_hot(rank_ids, num_ranks: int, dtype) -> Array:
    rank_ids = check_integer("rank_ids", rank_ids)
    check_rank("rank_ids", rank_ids, 2, "[N, T]")
    return jax.nn.one_hot(rank_ids, num_ranks, dtype=dtype)  # ids outside [0, K) give a zero row


def rank_level_ratio(logp, old_logp, rank_ids, *, num_ranks: int) -> Array:
    """Rank-level importance ratio: exp(mean log rho over the tokens of each rank), f32[N, K].

    rank_ids: i32[N, T], the rank (0-based) each token belongs to, -1 for
    tokens of no rank. A rank without tokens gets ratio 1.
    """
    check_token_inputs(logp=logp, old_logp=old_logp)
    one_hot = _rank_one_hot(rank_ids, num_ranks, logp.dtype)
    check_same_shape("rank_ids", one_hot[..., 0], "logp", logp)
    total = jnp.einsum("ntk,nt->nk", one_hot, log_ratio(logp, old_logp))
    count = one_hot.sum(1)
    return jnp.exp(total / jnp.maximum(count, 1))


def rank_token_values(rank_values, rank_ids) -> Array:
    """Per-rank values f32[N, K] placed on each rank's tokens, f32[N, T] (0 for rank id -1)."""
    rank_values = check_floating("rank_values", rank_values)
    check_rank("rank_values", rank_values, 2, "[N, K]")
    one_hot = _rank_one_hot(rank_ids, rank_values.shape[1], rank_values.dtype)
    return jnp.einsum("ntk,nk->nt", one_hot, rank_values)


# -------------------------------------------------------------------- segments


@register("credit", "segment_advantages", paper=_SEGMENT,
          loop="needs a segmenter of reasoning steps (segment boundaries), which the loop does not run")
def segment_advantages(boundaries, values, mask) -> Array:
    """Segment advantages scattered to tokens: A_t = V_{k+1} - V_k for t in segment k.

    Segment k of row i covers tokens b_k <= t < b_{k+1} (the last one runs to
    the end); V_k is the value at the start of segment k (an MC value,
    P(answer | prefix), ...) and V_{k+1} at its end. Tokens before b_0 and
    masked tokens get 0. Pad unused segments with a boundary >= T.
    (SPO-chain applies A only at low-probability "cutpoint" tokens: multiply
    by that mask.)

    Args:
      boundaries: i32[N, K] increasing start positions of the segments.
      values: f32[N, K + 1], V_0 ... V_K.
      mask: f32[N, T] response mask (fixes T).

    Papers: Guo et al., "Segment Policy Optimization" (SPO, 2025); GRPO-VPS
    (2025). Thresholds and the combination with outcome advantages are left
    to the caller (the papers leave them unspecified).
    """
    boundaries = check_integer("boundaries", boundaries)
    check_rank("boundaries", boundaries, 2, "[N, K]")
    values = check_floating("values", values)
    n, k = boundaries.shape
    if values.shape != (n, k + 1):
        raise ValueError(f"values must have shape [N, K+1]=[{n}, {k + 1}] for boundaries [N, K]=[{n}, {k}], got {values.shape}")
    mask = jnp.asarray(mask)
    check_rank("mask", mask, 2, "[N, T]")
    if mask.shape[0] != n:
        raise ValueError(f"mask has {mask.shape[0]} rows but boundaries has {n}; they must match")
    t = jnp.arange(mask.shape[1])
    segment = (t[None, :, None] >= boundaries[:, None, :]).sum(-1) - 1  # [N, T], -1 before b_0
    gains = values[:, 1:] - values[:, :-1]
    per_token = jnp.take_along_axis(gains, jnp.clip(segment, 0, k - 1), axis=1)
    return jnp.where((segment >= 0) & (mask > 0), per_token, 0.0)


# ----------------------------------------------------------- GRPO-VPS progress


_VPS = "GRPO-VPS: Enhancing Group Relative Policy Optimization with Verifiable Process Supervision for Effective Reasoning (2026)"


@register("credit", "experimental/grpo_vps_progress", paper=_VPS,
          loop="needs a probing pass (the answer probability after each reasoning segment, GRPO-VPS)",
          ranges={"progress_coef": ("any", "c, the weight of each segment's probe progress")})
def grpo_vps_progress(
    advantages,
    probe_probs,
    segment_ids,
    mask,
    *,
    progress_coef: float = 1.0,
    center: bool = False,
    group_ids=None,
    num_groups: int | None = None,
) -> Array:
    """GRPO-VPS (reconstruction): outcome advantage plus each segment's probe progress, per token.

    Delta_{i,k} = P_{i,k+1} - P_{i,k}, where P_{i,k} = P(correct answer | prompt,
    first k segments of response i) is the probe probability at segment
    boundary k (P_{i,0}: prompt only); then
        A_{i,t} = A_i + c * Delta_{i, seg(t)}.
    With `center=True`, Delta is first centered by its mean over the valid
    segments of the same group (a group-relative progress).

    Reconstructed from the abstract of "GRPO-VPS: Enhancing Group Relative
    Policy Optimization with Verifiable Process Supervision" (2025) ("probe the
    probability of the correct answer at each segment; segment-wise progress
    refines the trajectory-level advantage"). Unverified: the additive
    combination, c = 1, and the centering. c = 0 broadcasts A_i to its tokens.

    Args:
      advantages: f32[N] outcome advantages (e.g. GRPO's).
      probe_probs: f32[N, K+1] probe probabilities at the K+1 boundaries.
      segment_ids: i32[N, T] segment k in [0, K) of each token.
      mask: f32[N, T].
      group_ids, num_groups: needed only for `center=True`.

    Returns:
      f32[N, T] token advantages, zero where masked.
    """
    mask = jnp.asarray(mask)
    check_token_inputs(mask=mask.astype(jnp.float32))
    mask = mask.astype(jnp.float32)
    advantages = check_floating("advantages", advantages)
    n, t = mask.shape
    if advantages.shape != (n,):
        raise ValueError(f"advantages must have shape [N]=[{n}], got {tuple(advantages.shape)}")
    probe_probs = check_floating("probe_probs", probe_probs)
    check_rank("probe_probs", probe_probs, 2, "[N, K+1]")
    if probe_probs.shape[0] != n or probe_probs.shape[1] < 2:
        raise ValueError(f"probe_probs must have shape [N, K+1]=[{n}, >=2], got {tuple(probe_probs.shape)}")
    segment_ids = check_integer("segment_ids", segment_ids)
    if segment_ids.shape != (n, t):
        raise ValueError(f"segment_ids must have shape [N, T]=[{n}, {t}] like mask, got {tuple(segment_ids.shape)}")
    num_segments = probe_probs.shape[1] - 1
    delta = probe_probs[:, 1:] - probe_probs[:, :-1]  # [N, K]
    if center:
        if group_ids is None or num_groups is None:
            raise ValueError("center=True needs group_ids=i32[N] and num_groups")
        group_ids = check_integer("group_ids", group_ids)
        group_ids, in_range = check_group_ids(group_ids, check_num_groups(num_groups))
        # Mean progress of segment k over the group's rows (segments are aligned by index); a row whose
        # group id is out of range (under jit) neither enters a mean nor is centered.
        group_mean = segments.sum(delta, group_ids, num_groups, in_range) / jnp.maximum(
            segments.count(group_ids, num_groups, in_range)[:, None], 1
        )
        delta = delta - jnp.where(in_range[:, None], group_mean[group_ids], 0.0)
    seg = jnp.clip(segment_ids, 0, num_segments - 1)
    token_delta = jnp.take_along_axis(delta, seg, axis=1)
    return jnp.where(mask > 0, advantages[:, None] + progress_coef * token_delta, 0.0)
