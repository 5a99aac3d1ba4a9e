"""Clipped token-ratio surrogates: PPO's clip (GRPO, DAPO) and the losses built on it, and PPO's value loss.

l_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t), rho_t = pi / pi_old at each token, and its
variants with a fixed clip range: SAPO's soft gate in place of the clip, DeGRPO's separate averages of the mode
token and the response, Clip-Cov and KL-Cov (the tokens of highest covariance between A and log pi lose their
gradient or pay a KL penalty). Clip ranges computed from the batch are in `adaptive_clip`.

Every loss follows the policy-loss contract of `jaxgrpo.kernels.losses`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels.losses.common import CLIP_RATIO_C, EPS_HIGH, EPS_LOW, log_ratio, prepare, ratio_metrics
from jaxgrpo.kernels.registry import register_loss
from jaxgrpo.kernels.segments import fill_masked, masked_mean
from jaxgrpo.kernels.validation import check_token_inputs

Array = jax.Array


@register_loss("ppo_clip", paper="Proximal Policy Optimization Algorithms (2017); DAPO (2025) for clip-higher",
               ranges={"eps_low": EPS_LOW, "eps_high": EPS_HIGH, "clip_ratio_c": CLIP_RATIO_C})
def ppo_clip(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    clip_ratio_c: float | None = None,
):
    """Clipped surrogate loss with token ratios (PPO, GRPO, DAPO).

    l_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t),
    rho_t = exp(logp_t - old_logp_t). With `clip_ratio_c` (dual clip, Ye et al.
    2020), tokens with A_t < 0 are further bounded: l_t = min(l_t, -c A_t).

    Args:
      eps_low, eps_high: clip range; eps_high defaults to eps_low (symmetric,
        0.2 as in PPO). DAPO's clip-higher uses eps_low=0.2, eps_high=0.28.
      clip_ratio_c: dual-clip bound or None (default: no dual clip, as PPO and
        DAPO). verl always applies the dual clip with c = 3.0; pass
        clip_ratio_c=3.0 for verl's loss.

    Papers: Schulman et al., "Proximal Policy Optimization Algorithms" (2017);
    Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025).
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    eps_high = eps_low if eps_high is None else eps_high
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    metrics = {
        "clip_fraction": masked_mean(is_clipped.astype(logp.dtype), mask),
        "clip_fraction_low": masked_mean((is_clipped & (ratio < 1.0)).astype(logp.dtype), mask),
        "clip_fraction_high": masked_mean((is_clipped & (ratio > 1.0)).astype(logp.dtype), mask),
    }
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (the dual-clip bound), got {clip_ratio_c}")
        dual = -adv * clip_ratio_c
        dual_active = (adv < 0) & (dual < loss)
        loss = jnp.where(adv < 0, jnp.minimum(loss, dual), loss)
        metrics["dual_clip_fraction"] = masked_mean(dual_active.astype(logp.dtype), mask)
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


# ------------------------------------------------------------------------ SAPO


_SAPO = "Soft Adaptive Policy Optimization (2025)"


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


# ---------------------------------------------------------------------- DeGRPO


_THINKLESS = "Thinkless: LLM Learns When to Think (2025)"


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


# ---------------------------------------------------------------------------------------------------------
# Clip-Cov and KL-Cov, from verl's registry (verl 1dda039).
# verl's "vanilla" loss is `ppo_clip` with clip_ratio_c=3.
# ---------------------------------------------------------------------------------------------------------


def _centered_covariance(adv, logp, mask):
    """(A_t - mean A) (log pi_t - mean log pi) over the unmasked tokens of the batch, without gradient."""
    adv, logp = jax.lax.stop_gradient(adv), jax.lax.stop_gradient(logp)
    return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))


def _first_k(priority, chosen, k):
    """bool[N, T]: the `k` entries (a traced count) of largest `priority` among `chosen`; ties by position."""
    flat = jnp.where(chosen, priority, -jnp.inf).reshape(-1)
    order = jnp.argsort(-flat, stable=True)
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))
    return (rank < k).reshape(chosen.shape) & chosen


def _token_count_fraction(mask, fraction):
    """max(floor(fraction * number of unmasked tokens), 1), as verl's int(ratio * n) with at least one token."""
    return jnp.maximum(jnp.floor(fraction * mask.sum()), 1.0)


@register_loss("clip_cov", paper="The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models (2025)",
               ranges={"eps_low": EPS_LOW, "eps_high": EPS_HIGH,
                       "clip_cov_ratio": ("in [0, 1]", "the fraction of tokens whose gradient is cut"),
                       "clip_cov_lb": ("< clip_cov_ub", "the lower covariance bound of the candidates"),
                       "clip_cov_ub": ("> clip_cov_lb", "the upper covariance bound of the candidates")})
def clip_cov(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    key=None,
):
    """Clip-Cov: PPO clipping, plus no gradient for a few tokens of high covariance between A and log pi.

    cov_t = (A_t - mean A)(log pi_t - mean log pi) over the batch's tokens; among
    the tokens PPO did not clip with clip_cov_lb < cov_t < clip_cov_ub,
    k = max(floor(clip_cov_ratio * #tokens), 1) are chosen and their loss
    (value and gradient) set to 0; every other token carries PPO's
    l_t = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A). These tokens
    drive the entropy collapse.

    Args:
      eps_low, eps_high: PPO's clip range (eps_high defaults to eps_low; 0.2 as verl).
      clip_cov_ratio, clip_cov_lb, clip_cov_ub: 2e-4, 1 and 5 as the paper's code and verl.
      key: a PRNG key for the paper's uniform choice among the candidates.
        Without it (default: a pure loss of its inputs) the k candidates of
        largest covariance are chosen. Statistics are those of the batch given,
        a micro-batch when the trainer accumulates (as verl).

    Differences from verl's `clip_cov` (verl 1dda039), deliberate: log rho is
    clamped to +-20 before exp (verl does not clamp it), and without `key` the
    choice among the candidates is by covariance, not random.

    Paper: Cui et al., "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models" (2025); verl's `clip_cov`.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    eps_high = eps_low if eps_high is None else eps_high
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clipped_by_ppo = clipped > unclipped
    cov = _centered_covariance(adv, logp, mask)
    candidates = (mask > 0) & ~clipped_by_ppo & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    priority = cov if key is None else jax.random.uniform(key, cov.shape)
    detached = _first_k(priority, candidates, _token_count_fraction(mask, clip_cov_ratio))
    loss = jnp.where(detached, 0.0, jnp.maximum(unclipped, clipped))
    metrics = {
        "clip_fraction": masked_mean(clipped_by_ppo.astype(logp.dtype), mask),
        "cov_detached_fraction": masked_mean(detached.astype(logp.dtype), mask),
    }
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


@register_loss("kl_cov", paper="The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models (2025)",
               ranges={"kl_cov_ratio": ("in [0, 1]", "the fraction of tokens given the KL penalty"),
                       "ppo_kl_coef": (">= 0", "the weight of the KL penalty on those tokens")})
def kl_cov(logp, old_logp, advantages, mask, *, kl_cov_ratio: float = 2e-4, ppo_kl_coef: float = 1.0):
    """KL-Cov: the unclipped ratio loss, plus a |log ratio| penalty on the tokens of highest covariance.

    l_t = -rho_t A_t, and for the k = max(floor(kl_cov_ratio * #tokens), 1) tokens of
    largest cov_t = (A_t - mean A)(log pi_t - mean log pi) (over the batch's
    tokens) l_t = -rho_t A_t + ppo_kl_coef |log rho_t|. No clipping.

    Args:
      kl_cov_ratio: 2e-4 as the paper's code and verl.
      ppo_kl_coef: 1 as the paper's code (its recipe sets ppo_kl_coef=1).
        verl's default config sets 0.1 (verl 1dda039, `policy_loss.ppo_kl_coef`;
        its code falls back to 1 only without a config): pass ppo_kl_coef=0.1
        for verl's default. Statistics are those of the batch given (a
        micro-batch when the trainer accumulates, as verl).

    Difference from verl's `kl_cov`, deliberate: log rho is clamped to +-20
    before exp and in the penalty (verl does not clamp it).

    Paper: Cui et al., "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models" (2025); verl's `kl_cov`.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    cov = _centered_covariance(adv, logp, mask)
    penalized = _first_k(cov, mask > 0, _token_count_fraction(mask, kl_cov_ratio))
    loss = -adv * ratio + jnp.where(penalized, ppo_kl_coef * jnp.abs(log_r), 0.0)
    metrics = {"kl_penalized_fraction": masked_mean(penalized.astype(logp.dtype), mask),
               "abs_log_ratio": masked_mean(jnp.abs(log_r), mask)}
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


# -------------------------------------------------------------- PPO value loss


def clipped_value_loss(values, old_values, returns, mask, *, clip_range: float = 0.2):
    """PPO's clipped value loss, per token.

    l_t = 0.5 max((V_t - R_t)^2, (clip(V_t, V_old - c, V_old + c) - R_t)^2), c = 0.2 as
    tunix's clip_range_value (verl's critic sets cliprange_value 0.5: pass
    clip_range=0.5 for verl's default). Masked-out tokens give 0 and no
    gradient, whatever their values.

    Returns:
      (per_token_loss f32[N,T], metrics with `value_clip_fraction`).

    Paper: Schulman et al., "Proximal Policy Optimization Algorithms" (2017).
    """
    mask = jnp.asarray(mask)
    check_token_inputs(values=values, old_values=old_values, returns=returns, mask=mask.astype(jnp.float32))
    values, old_values, returns = fill_masked(mask, values, old_values, returns)
    mask = mask.astype(values.dtype)
    clipped = old_values + jnp.clip(values - old_values, -clip_range, clip_range)
    unclipped_loss = jnp.square(values - returns)
    clipped_loss = jnp.square(clipped - returns)
    loss = 0.5 * jnp.maximum(unclipped_loss, clipped_loss)
    metrics = {"value_clip_fraction": masked_mean((clipped_loss > unclipped_loss).astype(values.dtype), mask)}
    return loss * mask, metrics
