"""What every policy loss shares: the input checks of the contract, the clamped log-ratio, the ratio metrics.

`prepare` validates a loss's inputs and replaces logp, old_logp and the advantages by 0 where `mask` is 0,
before any arithmetic; `log_ratio` is log(pi / pi_old) clamped to +-MAX_LOG_RATIO; `ratio_metrics` gives the
masked statistics of an importance ratio. The declared ranges shared by the clipped losses are here too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels.segments import fill_masked, masked_mean
from jaxgrpo.kernels.validation import broadcast_advantages, check_token_inputs

Array = jax.Array


#: Log-ratios are clamped to this range before `exp`, so a stale sample cannot overflow.
MAX_LOG_RATIO = 20.0


# Declared ranges shared by the clipped losses (`jaxgrpo.kernels.hyperparameters`). A negative epsilon
# inverts the clip interval: every token is clipped and the loss pushes the ratio the wrong way.
EPS_LOW = (">= 0", "the lower clip epsilon: the ratio is clipped below at 1 - eps_low")
EPS_HIGH = (">= 0", "the upper clip epsilon: the ratio is clipped above at 1 + eps_high; None: eps_low")
CLIP_RATIO_C = ("> 1", "the dual-clip bound on the loss of negative advantages; None: no dual clip")


def prepare(logp, old_logp, advantages, mask):
    """Validates the loss inputs; returns (logp, old_logp, advantages [N,T], mask as logp's dtype).

    logp, old_logp and the advantages are 0 where the mask is 0, whatever they held there.
    """
    mask = jnp.asarray(mask)
    check_token_inputs(logp=logp, old_logp=old_logp, mask=mask.astype(jnp.float32))
    logp, old_logp, advantages = fill_masked(mask, logp, old_logp, broadcast_advantages(advantages, logp))
    return logp, old_logp, advantages, mask.astype(logp.dtype)


def log_ratio(logp: Array, old_logp: Array) -> Array:
    """log(pi / pi_old), clamped to +-MAX_LOG_RATIO."""
    return jnp.clip(logp - old_logp, -MAX_LOG_RATIO, MAX_LOG_RATIO)


def ratio_metrics(ratio: Array, mask: Array, log_r: Array | None = None) -> dict[str, Array]:
    """Masked statistics of an importance ratio, and the k3 estimate of KL(pi_old || pi)."""
    big = jnp.finfo(ratio.dtype).max
    log_r = jnp.log(ratio) if log_r is None else log_r
    any_token = mask.sum() > 0
    return {
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": jnp.where(any_token, jnp.max(jnp.where(mask > 0, ratio, -big)), 1.0),
        "ratio_min": jnp.where(any_token, jnp.min(jnp.where(mask > 0, ratio, big)), 1.0),
        # k3 with samples from pi_old: E[r - 1 - log r] = KL(pi_old || pi); expm1 keeps it accurate near r = 1.
        "approx_kl": masked_mean(jnp.expm1(log_r) - log_r, mask),
    }
