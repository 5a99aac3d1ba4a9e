"""Policy losses weighted by the whole sequence's importance ratio: VESPO.

GSPO (in `losses`) clips the length-normalized ratio (pi / pi_old)^(1/|o|).
The losses here instead reshape the *product* of the token ratios,
W_i = prod_t pi(y_t) / pi_old(y_t), with a smooth weight that is a constant of
the gradient (REINFORCE form), so no token's gradient is dropped.

Every loss follows the policy-loss contract of `jaxgrpo.kernels.losses`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxgrpo.kernels.losses import MAX_LOG_RATIO, log_ratio, prepare, ratio_metrics
from jaxgrpo.kernels.registry import register_loss
from jaxgrpo.kernels.segments import fill_masked, masked_mean
from jaxgrpo.kernels.validation import check_token_inputs

Array = jax.Array

_VESPO = "VESPO: Variational Sequence-Level Soft Policy Optimization for Stable Off-Policy LLM Training (2026)"

#: log(1e-8): the lower bound of VESPO's sequence log-ratio (a ratio below 1e-8 counts as 1e-8).
MIN_LOG_SEQUENCE_RATIO = math.log(1e-8)


def gamma_weight(log_w: Array, k: Array | float, lam: Array | float) -> Array:
    """VESPO's Gamma-shaped weight phi(W) = W^k exp(lam (1 - W)), computed in log space.

    phi(1) = 1; phi rises like W^k for W < 1 and decays like exp(-lam W) for
    W > 1 (its peak is at W = k / lam). Non-finite values (possible only for
    extreme k or lam) become 0, so a sequence is dropped rather than poisoning
    the batch.
    """
    phi = jnp.exp(lam + k * log_w - lam * jnp.exp(log_w))
    return jnp.where(jnp.isfinite(phi), phi, 0.0)


@register_loss("vespo", paper=_VESPO, ranges={
    "k_pos": (">= 0", "the power k of phi for non-negative advantages"),
    "lambda_pos": (">= 0", "the decay lambda of phi for non-negative advantages"),
    "k_neg": (">= 0", "the power k of phi for negative advantages"),
    "lambda_neg": (">= 0", "the decay lambda of phi for negative advantages"),
})
def vespo(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    importance_weights=None,
):
    """VESPO: REINFORCE weighted by a smooth Gamma function of the sequence ratio.

    l_t = -sg[phi(W_i)] A_t log pi(y_t), phi(W) = W^k exp(lam (1 - W)), with
    log W_i = clip(sum_t clip(log rho_t, +-20), log 1e-8, 20) over the unmasked
    tokens, and (k, lam) = (k_pos, lambda_pos) where A_t >= 0, else (k_neg,
    lambda_neg). Aggregate with `token_mean` over the whole batch.

    Args:
      k_pos, lambda_pos, k_neg, lambda_neg: the power and decay of phi for
        non-negative / negative advantages; lam is floored at 1e-4.
      importance_weights: optional f32[N, T] token weights pi_old / pi_sampler
        (e.g. `importance_correction`'s, for a sampler that differs from the
        trainer); their logs (clipped to [log 1e-8, 20]) are added to log W_i
        instead of multiplying the loss.

    Paper: "VESPO: Variational Sequence-Level Soft Policy Optimization for
    Stable Off-Policy LLM Training" (2026); defaults (2, 3, 3, 2) and the clip
    bounds are TRL's GRPOConfig values, which TRL matches to the authors' code.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    seq_log_w = (log_r * mask).sum(-1, keepdims=True)
    if importance_weights is not None:
        check_token_inputs(logp=logp, importance_weights=importance_weights)
        # log 1 = 0 at masked-out tokens, whatever the weights hold there.
        weights = fill_masked(mask, jnp.asarray(importance_weights, logp.dtype), value=1.0)
        log_is = jnp.clip(jnp.log(jnp.maximum(weights, 0.0)), MIN_LOG_SEQUENCE_RATIO, MAX_LOG_RATIO)
        seq_log_w = seq_log_w + (log_is * mask).sum(-1, keepdims=True)
    seq_log_w = jax.lax.stop_gradient(jnp.clip(seq_log_w, MIN_LOG_SEQUENCE_RATIO, MAX_LOG_RATIO))
    nonnegative = adv >= 0
    k = jnp.where(nonnegative, k_pos, k_neg).astype(logp.dtype)
    lam = jnp.maximum(jnp.where(nonnegative, lambda_pos, lambda_neg), 1e-4).astype(logp.dtype)
    phi = jax.lax.stop_gradient(gamma_weight(seq_log_w, k, lam))
    loss = -phi * adv * logp
    metrics = {
        "phi_mean": masked_mean(phi, mask),
        "sequence_log_ratio_mean": masked_mean(seq_log_w * jnp.ones_like(logp), mask),
    }
    metrics.update(ratio_metrics(jnp.exp(log_r), mask, log_r))
    return loss * mask, metrics
