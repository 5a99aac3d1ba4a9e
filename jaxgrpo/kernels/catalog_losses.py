"""Catalog policy losses and trust regions: SAPO, BAPO, DisCO, HAPO, DeGRPO, Critique-GRPO.

Every loss follows the policy-loss contract of `jaxgrpo.kernels.losses`::

    fn(logp: f32[N,T], old_logp: f32[N,T], advantages: f32[N] | f32[N,T],
       mask: f32[N,T], **hparams) -> (per_token_loss: f32[N,T], metrics: dict)

Inputs a method needs beyond that (token entropies, group ids, prefix masks)
are explicit keyword array arguments. Where the paper's loss is not a plain
token average, the docstring says which `aggregate` mode reproduces it exactly.
Token inputs (logp, old_logp, advantages, entropies) are replaced by 0 where
`mask` is 0 before any arithmetic, so NaN or inf at masked-out tokens gives
neither a NaN loss nor a NaN gradient.

The HAPO advantage (`hapo`, kind "advantage") lives here too, beside the HAPO
loss it is designed for.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.advantages import grpo
from jaxgrpo.kernels.losses import CLIP_RATIO_C, EPS_HIGH, EPS_LOW, log_ratio, ppo_clip, prepare, ratio_metrics
from jaxgrpo.kernels.registry import register_advantage, register_loss
from jaxgrpo.kernels.segments import masked_mean
from jaxgrpo.kernels.validation import (
    check_floating,
    check_outcome_inputs,
    check_same_shape,
    check_token_inputs,
)

Array = jax.Array

_SAPO = "Soft Adaptive Policy Optimization (2025)"
_BAPO = (
    "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy Optimization "
    "with Adaptive Clipping (2025)"
)
_DISCO = "DisCO: Reinforcing Large Reasoning Models with Discriminative Constrained Optimization (2025)"
_HAPO = "From Uniform to Heterogeneous: Tailoring Policy Optimization to Every Token's Nature (2025)"
_THINKLESS = "Thinkless: LLM Learns When to Think (2025)"
_CRITIQUE = "Critique-GRPO: Advancing LLM Reasoning with Natural Language and Numerical Feedback (2025)"


def _dual_clip(loss: Array, adv: Array, clip_ratio_c: float | None) -> Array:
    """Dual clip (Ye et al. 2020): for A < 0 the loss is at most -c A."""
    if clip_ratio_c is None:
        return loss
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (the dual-clip bound), got {clip_ratio_c}")
    return jnp.where(adv < 0, jnp.minimum(loss, -adv * clip_ratio_c), loss)


# --------------------------------------------------------------------------- SAPO


def sapo_gate(ratio: Array, tau: Array | float) -> Array:
    """SAPO's soft gate f(rho) = sigmoid(tau (rho - 1)) * 4 / tau.

    f(1) = 2 / tau and f'(1) = 1: near rho = 1 it moves like the unclipped
    surrogate rho, and its slope 4 sigma (1 - sigma) decays smoothly away from 1.
    """
    return jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@register_loss("sapo", paper=_SAPO, ranges={"tau_pos": ("> 0", "the gate temperature for positive advantages"),
                                            "tau_neg": ("> 0", "the gate temperature for non-positive advantages")})
def sapo(logp, old_logp, advantages, mask, *, tau_pos: float = 1.0, tau_neg: float = 1.05):
    """SAPO: a temperature-controlled soft gate in place of hard ratio clipping.

    l_t = -f(rho_t) A_t, f(rho) = sigmoid(tau (rho - 1)) * 4 / tau, with
    tau = tau_pos if A_t > 0 else tau_neg; rho_t = exp(logp_t - old_logp_t).
    The gradient weight 4 sigma (1 - sigma) equals 1 at rho = 1 (the unclipped
    surrogate's) and fades for off-policy tokens instead of dropping to 0.
    The paper aggregates with `seq_mean_token_mean`.

    Args:
      tau_pos, tau_neg: gate temperatures for positive / non-positive
        advantages; 1.0 and 1.05 as in the paper and verl/TRL.

    Paper: Gao et al., "Soft Adaptive Policy Optimization" (2025); defaults
    checked in verl and TRL.
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    tau = jnp.where(adv > 0, tau_pos, tau_neg).astype(logp.dtype)
    gate = sapo_gate(ratio, tau)
    metrics = {"gate_mean": masked_mean(gate, mask)}
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return -gate * adv * mask, metrics


# --------------------------------------------------------------------------- BAPO


def _bound_grid(start: float, stop: float, step: float) -> list[float]:
    """start, start + step, ..., stop (the last step clipped to stop), as BAPO's search walks it."""
    grid = [float(start)]
    if step > 0:
        k = 1
        while grid[-1] < stop:
            grid.append(float(min(round(start + k * step, 10), stop)))
            k += 1
    return grid


def bapo_clip_bounds(
    ratio,
    advantages,
    mask,
    *,
    lower_start: float = 0.6,
    lower_max: float = 0.8,
    lower_step: float = 0.05,
    upper_start: float = 1.2,
    upper_max: float = 2.0,
    upper_step: float = 0.05,
    target: float = 1.0,
    eps: float = 1e-8,
):
    """BAPO's per-batch search for the ratio bounds [c_low, c_high].

    With bounds (c_low, c_high), the positive contribution is
    P = sum_{A>=0} min(rho, c_high) A and the negative one
    Q = sum_{A<0} max(rho, c_low) |A| (masked token sums over the whole batch,
    so under jit on a sharded batch every device picks the same bounds).
    Starting from (lower_start, upper_start), c_low is raised in steps of
    lower_step up to lower_max, then c_high in steps of upper_step up to
    upper_max, stopping at the first pair with P / (Q + eps) >= target (P/Q is
    +inf without negative contribution). If none reaches the target, the last
    pair (lower_max, upper_max) is used.

    The walk is a fixed grid of candidates (static from the Python floats),
    evaluated with `lax.map`, so the search jits; it is exactly the reference
    code's two while-loops.

    Args:
      ratio: f32[N, T] importance ratios (treated as constants).
      advantages: f32[N] or f32[N, T].
      mask: f32[N, T].
      lower_*, upper_*: explicit ratio bounds (not 1 +- eps) of the search;
        start [0.6, 1.2], maxima [0.8, 2.0], step 0.05 are the BAPO recipe's
        documented example values.
      target: the required P / Q; 1.0 is the recipe's default.

    Returns:
      (c_low, c_high, pos_neg_ratio): scalars.

    Paper: Xi et al., "BAPO" (2025); the search follows the official recipe
    (`recipe/bapo/policy_loss.py`).
    """
    ratio = check_floating("ratio", ratio)
    mask = jnp.asarray(mask, ratio.dtype)
    check_token_inputs(ratio=ratio, mask=mask)
    advantages = check_floating("advantages", advantages)
    adv = jnp.broadcast_to(advantages[:, None], ratio.shape) if advantages.ndim == 1 else advantages
    check_same_shape("advantages", adv, "ratio", ratio)
    ratio = jax.lax.stop_gradient(ratio)
    adv = jax.lax.stop_gradient(adv)

    lows = _bound_grid(lower_start, lower_max, lower_step)
    highs = _bound_grid(upper_start, upper_max, upper_step)
    candidates = [(lows[0], highs[0])] + [(lo, highs[0]) for lo in lows[1:]] + [(lows[-1], hi) for hi in highs[1:]]
    cand = jnp.asarray(np.array(candidates, np.float32), ratio.dtype)

    positive = (adv >= 0) & (mask > 0)
    negative = (adv < 0) & (mask > 0)

    def contributions(bounds):
        c_low, c_high = bounds[0], bounds[1]
        pos = jnp.sum(jnp.where(positive, jnp.minimum(ratio, c_high) * adv, 0.0))
        neg = jnp.sum(jnp.where(negative, -jnp.maximum(ratio, c_low) * adv, 0.0))
        return jnp.where(neg <= 0, jnp.inf, pos / (neg + eps))

    pos_neg = jax.lax.map(contributions, cand)
    met = pos_neg >= target
    index = jnp.where(jnp.any(met), jnp.argmax(met), cand.shape[0] - 1)
    return cand[index, 0], cand[index, 1], pos_neg[index]


@register_loss("bapo", paper=_BAPO, ranges={
    "lower_start": ("in (0, 1]", "the first lower ratio bound c_low of the search"),
    "lower_max": ("in [lower_start, 1]", "the largest lower ratio bound c_low"),
    "lower_step": (">= 0", "the step of c_low"),
    "upper_start": (">= 1", "the first upper ratio bound c_high of the search"),
    "upper_max": (">= upper_start", "the largest upper ratio bound c_high"),
    "upper_step": (">= 0", "the step of c_high"),
    "target": ("> 0", "the positive-to-negative contribution ratio the search looks for"),
    "clip_ratio_c": CLIP_RATIO_C,
})
def bapo(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    lower_start: float = 0.6,
    lower_max: float = 0.8,
    lower_step: float = 0.05,
    upper_start: float = 1.2,
    upper_max: float = 2.0,
    upper_step: float = 0.05,
    target: float = 1.0,
    clip_ratio_c: float | None = 3.0,
):
    """BAPO: PPO clipping with ratio bounds searched per batch to balance positive and negative updates.

    [c_low, c_high] come from `bapo_clip_bounds` (widened until the positive
    advantages' clipped contribution is at least `target` times the negative
    one's); then l_t = -min(rho A, clip(rho, c_low, c_high) A), with the dual
    clip -c A for A < 0 (c = 3 as in the recipe, which inherits verl's).
    The bounds are constants of the loss (no gradient through the search).

    Paper: Xi et al., "BAPO" (2025); defaults from the official recipe's
    documented example bounds and its target 1.0.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    c_low, c_high, pos_neg = bapo_clip_bounds(
        ratio, adv, mask, lower_start=lower_start, lower_max=lower_max, lower_step=lower_step,
        upper_start=upper_start, upper_max=upper_max, upper_step=upper_step, target=target,
    )
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, c_low, c_high)
    loss = _dual_clip(jnp.maximum(unclipped, clipped), adv, clip_ratio_c)
    metrics = {
        "clip_low": c_low,
        "clip_high": c_high,
        "pos_neg_ratio": jnp.minimum(pos_neg, jnp.finfo(logp.dtype).max),
        "clip_fraction": masked_mean((clipped > unclipped).astype(logp.dtype), mask),
    }
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


# --------------------------------------------------------------------------- DisCO


def _log_mean_exp_per_group(x: Array, group_ids: Array, num_groups: int, rows: Array) -> Array:
    """log mean_{rows of g} exp(x) per group, 0 for a group without rows; max-shifted for stability."""
    peak = segments.max(x, group_ids, num_groups, rows)
    peak = jax.lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))
    shifted = jnp.where(rows, jnp.exp(x - segments.gather(peak, group_ids)), 0.0)
    total = segments.sum(shifted, group_ids, num_groups, rows)
    n = segments.count(group_ids, num_groups, rows, x.dtype)
    safe = jnp.where(n > 0, total / jnp.maximum(n, 1), 1.0)
    return jnp.where(n > 0, peak + jnp.log(safe), 0.0)


# Over 80 lines (105) on purpose, the longest kernel: DisCO's objective (scores, the negatives' log-mean-exp, the
# KL trust region and its squared hinge) reads as the paper's equations, in one place.
@register_loss("disco", paper=_DISCO, ranges={
    "score": ("one of logL, Lratio", "the score function of a completion"),
    "tau": ("> 0", "the temperature of the negatives' log-mean-exp; None: the paper's for the score"),
    "delta": ("> 0", "the KL budget of the trust region"),
    "beta": (">= 0", "the penalty weight of the squared hinge"),
})
def disco(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    rewards,
    group_ids,
    num_groups: int,
    valid=None,
    score: str = "logL",
    tau: float | None = None,
    delta: float = 1e-4,
    beta: float = 1e3,
):
    """DisCO: a discriminative objective per question with a squared-hinge KL trust region.

    Score of response o: s(o) = mean_t log pi(o_t) ("logL") or mean_t rho_t
    ("Lratio"). Per question q with positives o+ and negatives o-:
        J_q = mean_{o+} s(o+) - tau * log mean_{o-} exp(s(o-) / tau),
        L = -(1/Q) sum_q J_q + sg(max(beta (KL - delta), 0)) * KL,
    Q the number of questions in the batch (groups with a valid row); questions
    whose responses are all positive or all negative give J_q = 0 (dropped).
    KL is the masked token mean of k3 = rho - 1 - log rho, an estimate of
    KL(pi_old || pi).

    Layout of `per_token_loss` (so that
    `aggregate(per_token_loss, mask, "seq_mean_token_mean")` equals L in value
    and gradient): with N_seq the rows that have tokens, every token of a
    positive row i of question q carries -(N_seq/Q) x_t / n+_q (x = log pi or
    rho, so its token mean is -(N_seq/Q) s_i / n+_q); every token of a negative
    row carries (N_seq/Q) tau lme_q / n-_q (lme_q the log-mean-exp term, with
    gradient); and every token carries the KL term scaled by N_seq |o_i| / sum m.
    Other aggregation modes compose but rescale the rows differently.

    Args:
      advantages: unused (DisCO has no advantage); accepted so the loss keeps
        the common signature. The labels come from `rewards`.
      rewards: f32[N] binary correctness; rows with reward > 0.5 are positives.
      group_ids, num_groups, valid: the question of each row, as for the
        advantage estimators; invalid rows are neither positive nor negative.
      score: "logL" (default, tau = 10) or "Lratio" (tau = 1).
      tau: temperature of the negatives' log-mean-exp; None picks the paper's
        recommendation for `score`.
      delta, beta: KL budget 1e-4 and penalty 1e3 (paper and verl recipe).

    The reference code evaluates the log-mean-exp as S / sg(S) (value 1, the
    same gradient); here the loss value is the true objective.

    Paper: Li et al., "DisCO" (2025); checked against the official repo.
    """
    if score not in ("logL", "Lratio"):
        raise ValueError(f"score must be 'logL' or 'Lratio', got {score!r}")
    tau = (10.0 if score == "logL" else 1.0) if tau is None else float(tau)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    mask = jnp.asarray(mask)
    check_token_inputs(logp=logp, old_logp=old_logp, mask=mask.astype(jnp.float32))
    logp, old_logp = segments.fill_masked(mask, logp, old_logp)
    mask = mask.astype(logp.dtype)
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    if rewards.shape[0] != logp.shape[0]:
        raise ValueError(f"rewards has {rewards.shape[0]} rows but logp has {logp.shape[0]}; they must match")

    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    x = logp if score == "logL" else ratio
    lengths = mask.sum(-1)
    has_tokens = lengths > 0
    s = (x * mask).sum(-1) / jnp.maximum(lengths, 1)

    rows = valid & has_tokens
    positive = rows & (rewards > 0.5)
    negative = rows & ~(rewards > 0.5)
    n_pos = segments.count(group_ids, num_groups, positive, logp.dtype)
    n_neg = segments.count(group_ids, num_groups, negative, logp.dtype)
    question_ok = (n_pos > 0) & (n_neg > 0)
    num_questions = jnp.maximum((segments.count(group_ids, num_groups, rows) > 0).sum(), 1).astype(logp.dtype)

    lme = _log_mean_exp_per_group(s / tau, group_ids, num_groups, negative)
    pos_mean = segments.sum(s, group_ids, num_groups, positive) / jnp.maximum(n_pos, 1)
    objective = jnp.where(question_ok, pos_mean - tau * lme, 0.0)

    num_seqs = has_tokens.sum().astype(logp.dtype)
    scale = num_seqs / num_questions
    row_ok = segments.gather(question_ok, group_ids)
    pos_tok = jnp.where((positive & row_ok)[:, None], -scale * x / segments.gather(jnp.maximum(n_pos, 1), group_ids)[:, None], 0.0)
    neg_row = scale * tau * segments.gather(lme / jnp.maximum(n_neg, 1), group_ids)
    neg_tok = jnp.where((negative & row_ok)[:, None], neg_row[:, None], 0.0)

    k3 = ratio - 1.0 - log_r
    kl = masked_mean(k3, mask)
    coef = jax.lax.stop_gradient(jnp.maximum(beta * (kl - delta), 0.0))
    kl_tok = coef * k3 * (num_seqs * lengths / jnp.maximum(mask.sum(), 1))[:, None]

    per_token = (pos_tok + neg_tok + kl_tok) * mask
    metrics = {
        "objective": objective.sum() / num_questions,
        "kl": kl,
        "kl_penalty_coef": coef,
        "constraint_active": (kl > delta).astype(logp.dtype),
        "num_valid_questions": question_ok.sum().astype(logp.dtype),
    }
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return per_token, metrics


# --------------------------------------------------------------------------- HAPO


@register_advantage("hapo", paper=_HAPO, ranges={
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


def hapo_entropy_scale(entropy, mask, *, pivot_quantile: float = 0.8, eps: float = 1e-8) -> Array:
    """HAPO's normalized token entropy h_hat in [-1, 1].

    h = log H - q, q the `pivot_quantile` quantile (nearest rank) of log H over
    the masked tokens of the batch; h is divided by its root mean square
    sqrt(mean h^2), then positives by their maximum and negatives by the
    magnitude of their minimum, so h_hat in [-1, 1] keeps the sign of h.
    0 where masked.

    The reference code divides the negatives by their (negative) minimum,
    which flips their sign; we follow the paper ("rescaled to [-1, 1]",
    h = -1 widens the low clip) and keep the sign.
    """
    entropy = check_floating("entropy", entropy)
    check_token_inputs(entropy=entropy, mask=jnp.asarray(mask, entropy.dtype))
    on = jnp.asarray(mask) > 0
    entropy = segments.fill_masked(on, entropy)
    log_h = jnp.log(jnp.maximum(entropy, eps))
    flat = jnp.where(on, log_h, jnp.inf).reshape(-1)
    n = on.sum()
    position = jnp.round(pivot_quantile * (n - 1).astype(log_h.dtype)).astype(jnp.int32)
    pivot = jnp.sort(flat)[jnp.clip(position, 0, flat.shape[0] - 1)]
    pivot = jnp.where(n > 0, pivot, 0.0)
    h = jnp.where(on, log_h - pivot, 0.0)
    var = jnp.maximum((h * h).sum() / jnp.maximum(n, 1), eps)
    h = h * jax.lax.rsqrt(var)
    pos_max = jnp.maximum(jnp.max(jnp.where(on & (h > 0), h, 0.0)), eps)
    neg_mag = jnp.maximum(-jnp.min(jnp.where(on & (h < 0), h, 0.0)), eps)
    return jnp.where(on, jnp.where(h > 0, h / pos_max, h / neg_mag), 0.0)


def hapo_adaptive_clip_range(h_hat, eps_low: float = 0.2, eps_high: float = 0.2, *, clip_alpha: float = 1.0):
    """HAPO's asymmetric adaptive clip range per token.

    eps_low' = eps_low (1 - alpha h) where h <= 0 (low entropy: wider below),
    eps_high' = eps_high (1 + alpha h) where h > 0 (high entropy: wider above);
    the other side keeps its base value.
    """
    low = jnp.where(h_hat <= 0, eps_low * (1.0 - clip_alpha * h_hat), eps_low)
    high = jnp.where(h_hat > 0, eps_high * (1.0 + clip_alpha * h_hat), eps_high)
    return low, high


@register_loss("hapo_clip", paper=_HAPO, ranges={
    "eps_low": EPS_LOW, "eps_high": (">= 0", "the upper clip epsilon: the ratio is clipped above at 1 + eps_high"),
    "clip_alpha": (">= 0", "the strength of the entropy-adaptive clip range"),
    "adv_beta": (">= 0", "the strength of the entropy-adaptive advantage scaling"),
    "pivot_quantile": ("in [0, 1]", "the entropy quantile taken as the pivot"),
    "clip_ratio_c": CLIP_RATIO_C,
})
def hapo_clip(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    entropy,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_alpha: float = 1.0,
    adv_beta: float = 1.0,
    adaptive_advantage: bool = True,
    pivot_quantile: float = 0.8,
    clip_ratio_c: float | None = 3.0,
):
    """HAPO's entropy-adaptive asymmetric clipping with differential advantage redistribution.

    With h_hat the normalized token entropy (`hapo_entropy_scale`):
    clip range [1 - eps_low', 1 + eps_high'] from `hapo_adaptive_clip_range`;
    advantages A' = A (1 + beta h_hat) for high-entropy tokens (h_hat > 0)
    whose ratio is *outside* the neutral band (1 - eps_low'/2, 1 + eps_high'/2)
    and for low-entropy tokens *inside* it, A elsewhere; then
    l_t = -min(rho A', clip(rho, 1 - eps_low', 1 + eps_high') A'), dual clip
    -c A' for A' < 0. h_hat, the ranges and A' are constants (computed without
    gradient, as in the reference code).

    Args:
      entropy: f32[N, T] token entropies of the current policy (nats).
      eps_low, eps_high: base clip range, 0.2 (verl's default used by HAPO).
      clip_alpha, adv_beta: strengths, 1.0 in the paper ("no new hyper-parameters").
      pivot_quantile: the entropy quantile taken as the pivot, 0.8.
      clip_ratio_c: dual clip, 3.0 (verl).

    Paper: Liu et al., "From Uniform to Heterogeneous" (HAPO, 2025); checked
    against the official code (see `hapo_entropy_scale` for one deviation).
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    entropy = check_floating("entropy", entropy)
    check_same_shape("entropy", entropy, "logp", logp)
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    h_hat = jax.lax.stop_gradient(hapo_entropy_scale(entropy, mask, pivot_quantile=pivot_quantile))
    low, high = hapo_adaptive_clip_range(h_hat, eps_low, eps_high, clip_alpha=clip_alpha)
    if adaptive_advantage:
        r = jax.lax.stop_gradient(ratio)
        in_band = (r > 1.0 - low / 2) & (r < 1.0 + high / 2)
        boosted = adv * (1.0 + adv_beta * h_hat)
        adv = jnp.where(h_hat > 0, jnp.where(in_band, adv, boosted), jnp.where(in_band, boosted, adv))
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - low, 1.0 + high)
    loss = _dual_clip(jnp.maximum(unclipped, clipped), adv, clip_ratio_c)
    metrics = {
        "clip_fraction": masked_mean((clipped > unclipped).astype(logp.dtype), mask),
        "entropy_scale_mean": masked_mean(h_hat, mask),
        "eps_low_mean": masked_mean(low, mask),
        "eps_high_mean": masked_mean(high, mask),
    }
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


# --------------------------------------------------------------------------- DeGRPO


def first_token_mask(mask) -> Array:
    """bool[N, T]: the first unmasked token of each row (Thinkless's mode token)."""
    on = jnp.asarray(mask) > 0
    return on & (jnp.cumsum(on, axis=-1) == 1)


@register_loss("degrpo", paper=_THINKLESS, ranges={
    "mode_token_weight": (">= 0", "alpha, the weight of the mode token's loss"),
    "eps_low": EPS_LOW, "eps_high": EPS_HIGH, "clip_ratio_c": CLIP_RATIO_C,
})
def degrpo(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    mode_token_weight: float = 1e-3,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    clip_ratio_c: float | None = None,
):
    """Decoupled GRPO (Thinkless): the mode token and the response are averaged separately.

    L = alpha * mean_{t = mode token} l + mean_{t >= 1} l, l the PPO-clip token
    loss; the mode (control) token is the first unmasked token of each row,
    and each mean runs over the whole batch. Decoupling stops long responses
    from drowning the one <short>/<think> token's gradient; alpha = 1e-3 keeps
    mode selection from collapsing early.

    Layout: tokens are rescaled by counts of the mask so that
    `aggregate(per_token_loss, mask, "token_mean")` equals L exactly
    (mode tokens by alpha * sum m / n_mode, the others by sum m / n_response).

    Paper: Fang et al., "Thinkless: LLM Learns When to Think" (2025); alpha
    from the paper and official code.
    """
    per_token, metrics = ppo_clip(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high, clip_ratio_c=clip_ratio_c)
    mask = jnp.asarray(mask, per_token.dtype)
    mode = first_token_mask(mask)
    response = (mask > 0) & ~mode
    total = mask.sum()
    n_mode = mode.sum().astype(per_token.dtype)
    n_response = response.sum().astype(per_token.dtype)
    weight = jnp.where(mode, mode_token_weight * total / jnp.maximum(n_mode, 1), total / jnp.maximum(n_response, 1))
    metrics = dict(metrics)
    metrics["mode_token_loss"] = (jnp.where(mode, per_token, 0.0)).sum() / jnp.maximum(n_mode, 1)
    metrics["response_loss"] = (jnp.where(response, per_token, 0.0)).sum() / jnp.maximum(n_response, 1)
    return per_token * weight * mask, metrics


# --------------------------------------------------------------------------- Critique-GRPO


def policy_shaping(p: Array, gamma: float = 0.1) -> Array:
    """f(p) = p / (p + gamma): the off-policy shaping of LUFFY / Critique-GRPO.

    f'(p) = gamma / (p + gamma)^2 boosts low-probability tokens' gradients.
    """
    return p / (p + gamma)


@register_loss("critique_grpo", paper=_CRITIQUE,
          loop=("needs critique-guided refinements (the prefix_mask of an off-policy refined prefix), which no "
                "critic in the loop writes"),
          ranges={"shaping_gamma": ("> 0", "gamma of the policy shaping p / (p + gamma)"),
                  "eps_low": (">= 0", "the lower clip epsilon of on-policy tokens; None: no clip"),
                  "eps_high": (">= 0", "the upper clip epsilon of on-policy tokens; None: no clip")})
def critique_grpo(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    prefix_mask,
    shaping_gamma: float = 0.1,
    eps_low: float | None = None,
    eps_high: float | None = None,
):
    """Critique-GRPO: on-policy surrogate plus shaped likelihood on critique-guided refinement tokens.

    Refinement tokens (prefix_mask = 1, off-policy): l_t = -A_t f(pi_theta(y_t)),
    f(p) = p / (p + 0.1), p = exp(logp_t) (no ratio to the sampler).
    On-policy tokens: l_t = -A_t rho_t, unclipped as in the paper's script;
    give eps_low (and eps_high) to clip them PPO-style instead.
    The script sums token losses and divides by the maximum length: aggregate
    with `seq_mean_token_sum_norm`.

    Args:
      prefix_mask: f32[N, T] (or bool), 1 on off-policy refinement tokens.
      shaping_gamma: the 0.1 of f (paper and code).

    Paper: Zhang et al., "Critique-GRPO" (2025); checked against the official code.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    prefix = jnp.asarray(prefix_mask)
    check_same_shape("prefix_mask", prefix, "logp", logp)
    off_policy = prefix > 0
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    if eps_low is None:
        on_loss = -adv * ratio
    else:
        high = eps_low if eps_high is None else eps_high
        on_loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + high))
    # exp of logp <= 0 is a probability; clamp keeps a stray positive logp finite.
    shaped = policy_shaping(jnp.exp(jnp.minimum(logp, 0.0)), shaping_gamma)
    loss = jnp.where(off_policy, -adv * shaped, on_loss)
    on_mask = mask * (~off_policy).astype(mask.dtype)
    metrics = {
        "off_policy_fraction": masked_mean(off_policy.astype(logp.dtype), mask),
        "off_policy_shaped_mean": masked_mean(shaped, mask * off_policy.astype(mask.dtype)),
    }
    metrics.update(ratio_metrics(ratio, on_mask, log_r))
    return loss * mask, metrics


__all__ = [
    "bapo",
    "bapo_clip_bounds",
    "critique_grpo",
    "degrpo",
    "disco",
    "first_token_mask",
    "hapo",
    "hapo_adaptive_clip_range",
    "hapo_clip",
    "hapo_entropy_scale",
    "policy_shaping",
    "sapo",
    "sapo_gate",
]
