"""Sampler/trainer mismatch correction (kind "credit"): truncated or masked importance weights (TIS/MIS).

The sampler's log-probs (an inference engine, another precision, a stale
policy) differ from the trainer's. Weighting the loss by w = pi_train / pi_sampler,
truncated (TIS) or with outliers masked out (MIS), corrects the bias.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.segments import fill_masked, masked_mean
from jaxgrpo.kernels.validation import check_token_inputs

Array = jax.Array


_PAPER = "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training, Yao et al. (2025)"


@register("credit", "importance_correction", paper=_PAPER, ranges={
    "level": ("one of token, sequence", "whether a weight is per token or per sequence"),
    "mode": ("one of truncate, mask", "truncate the weights (TIS) or drop those outside the bounds (MIS)"),
    "threshold": ("> 0", "the upper cap C of the importance weight"),
    "lower_threshold": ("in [0, threshold]", "MIS's lower bound of the weight; None: 1 / threshold"),
})
def importance_correction(
    trainer_logp,
    sampler_logp,
    mask,
    *,
    level: str = "token",
    mode: str = "truncate",
    threshold: float = 2.0,
    lower_threshold: float | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Importance weights w = pi_trainer / pi_sampler, truncated or masked, as constants.

    level="token": w_t per token; level="sequence": w_i = exp(sum_t log w_t),
    the same for every token of sequence i.
    mode="truncate" (TIS): min(w, threshold). mode="mask" (MIS): 1 if
    lower_threshold <= w <= threshold else 0 (the token or sequence is dropped).

    Multiply the per-token loss by the returned weights (a stop-gradient array).
    Masked-out tokens get weight 0 whatever their log-probabilities (NaN, -inf).

    Args:
      threshold: upper cap C; 2.0 as in the paper and verl.
      lower_threshold: MIS lower bound; defaults to 1 / threshold.

    Returns:
      (weights f32[N, T] zero where masked, metrics).

    Paper: Yao et al., "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training" (2025).
    """
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if mode not in ("truncate", "mask"):
        raise ValueError(f"mode must be 'truncate' or 'mask', got {mode!r}")
    mask = jnp.asarray(mask)
    check_token_inputs(trainer_logp=trainer_logp, sampler_logp=sampler_logp, mask=mask.astype(jnp.float32))
    trainer_logp, sampler_logp = fill_masked(mask, trainer_logp, sampler_logp)
    mask = mask.astype(trainer_logp.dtype)
    log_w = jnp.clip(jax.lax.stop_gradient(trainer_logp) - sampler_logp, -20.0, 20.0) * mask
    if level == "sequence":
        log_w = jnp.clip(log_w.sum(-1, keepdims=True), -20.0, 20.0) * jnp.ones_like(log_w)
    w = jnp.exp(log_w)
    if mode == "truncate":
        weights = jnp.minimum(w, threshold)
        rejected = w > threshold
    else:
        low = 1.0 / threshold if lower_threshold is None else lower_threshold
        rejected = (w > threshold) | (w < low)
        weights = jnp.where(rejected, 0.0, 1.0)
    metrics = {
        "is_weight_mean": masked_mean(w, mask),
        "is_clipped_fraction" if mode == "truncate" else "is_masked_fraction": masked_mean(
            rejected.astype(w.dtype), mask
        ),
    }
    return jax.lax.stop_gradient(weights * mask), metrics
