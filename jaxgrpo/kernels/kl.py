"""KL estimators between the policy and a reference, per token (Schulman's k1, k2, k3).

With samples y ~ pi and x = log pi_ref(y) - log pi(y):

    k1 = -x                 unbiased, high variance, can be negative
    k2 = x^2 / 2            biased, low variance; its gradient is that of KL(pi || pi_ref)
    k3 = exp(x) - x - 1     unbiased, low variance, always >= 0 (x clamped to +-20)

Straight-through variants `k1+`, `k3+` take the value of k1/k3 and the gradient
of k2. `k3_unbiased` weights k3 by the importance ratio pi / pi_old, which keeps
the estimate of KL(pi || pi_ref) unbiased when the samples came from pi_old.

Pass `mask` to get 0 (value and gradient) at masked-out tokens whatever the
log-probabilities hold there: NaN or -inf at a pad token would otherwise turn
`kl * mask` and its gradient into NaN.

Reference: J. Schulman, "Approximating KL Divergence" (2020).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels.losses import MAX_LOG_RATIO
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.segments import fill_masked
from jaxgrpo.kernels.validation import check_token_inputs

Array = jax.Array

KL_KINDS = ("k1", "k2", "k3", "k1+", "k3+", "k3_unbiased")
_PAPER = "Approximating KL Divergence, J. Schulman (2020)"


def _k1(log_r):
    return -log_r


def _k2(log_r):
    return 0.5 * jnp.square(log_r)


@jax.custom_jvp
def _expm1_minus_identity(x):
    """exp(x) - 1 - x >= 0, accurate near 0 (where exp(x) - x - 1 in float32 is rounding noise of
    ~1e-7 against a true value of x^2 / 2), with the derivative expm1(x) computed without cancellation."""
    return jnp.maximum(jnp.expm1(x) - x, 0.0)


@_expm1_minus_identity.defjvp
def _expm1_minus_identity_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return _expm1_minus_identity(x), jnp.expm1(x) * dx


def _k3(log_r):
    # exp overflows float32 past 88 (e.g. garbage log-probs at masked positions),
    # and inf * 0 in the backward pass is NaN; clamp first, as verl's low_var_kl.
    return _expm1_minus_identity(jnp.clip(log_r, -MAX_LOG_RATIO, MAX_LOG_RATIO))


def _straight_through(value: Array, gradient_of: Array) -> Array:
    """`value` in the forward pass, the gradient of `gradient_of` in the backward pass."""
    return gradient_of + jax.lax.stop_gradient(value - gradient_of)


def kl_penalty(logp, ref_logp, kind: str = "k3", *, clamp: float | None = None, old_logp=None, mask=None) -> Array:
    """Per-token KL estimate between the policy and a reference.

    Args:
      logp: f32[N, T] log pi(y_t) under the policy being trained.
      ref_logp: f32[N, T] log pi_ref(y_t) under the reference (frozen) policy.
      kind: one of `KL_KINDS` (see the module docstring). GRPO uses k3.
      clamp: if set, clamps the estimate to [-clamp, clamp] (verl's
        `low_var_kl` clamps k3 at 10).
      old_logp: f32[N, T] log pi_old(y_t) of the sampling policy; required for
        `k3_unbiased`.
      mask: optional f32[N, T] (or bool) token mask; where it is 0 the inputs are
        replaced by 0 before any arithmetic and the estimate is 0, so NaN or
        -inf there reaches neither the value nor the gradient.

    Returns:
      f32[N, T] per-token estimate (not multiplied by the mask).

    With x = log pi_ref - log pi: k1 = -x, k2 = x^2 / 2, k3 = exp(x) - x - 1.

    Paper: J. Schulman, "Approximating KL Divergence" (2020).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; valid kinds: {', '.join(KL_KINDS)}")
    check_token_inputs(logp=logp, ref_logp=ref_logp, old_logp=old_logp)
    if mask is not None:
        mask = jnp.asarray(mask)
        check_token_inputs(logp=logp, mask=mask.astype(jnp.float32))
        logp, ref_logp = fill_masked(mask, logp, ref_logp)
        old_logp = None if old_logp is None else fill_masked(mask, old_logp)
    log_r = jnp.asarray(ref_logp) - logp  # log(pi_ref / pi)
    if kind == "k1":
        kl = _k1(log_r)
    elif kind == "k2":
        kl = _k2(log_r)
    elif kind == "k3":
        kl = _k3(log_r)
    elif kind == "k1+":
        kl = _straight_through(_k1(log_r), _k2(log_r))
    elif kind == "k3+":
        kl = _straight_through(_k3(log_r), _k2(log_r))
    else:
        if old_logp is None:
            raise ValueError("kind='k3_unbiased' needs old_logp (log-probs of the sampling policy)")
        kl = jnp.exp(jnp.clip(logp - old_logp, -MAX_LOG_RATIO, MAX_LOG_RATIO)) * _k3(log_r)
    if clamp is not None:
        kl = jnp.clip(kl, -clamp, clamp)
    return kl


_SUMMARIES = {
    "k1": "k1 = log pi - log pi_ref: unbiased KL estimate, high variance.",
    "k2": "k2 = (log pi - log pi_ref)^2 / 2: low variance; its gradient is the KL's.",
    "k3": "k3 = pi_ref/pi - log(pi_ref/pi) - 1: unbiased, non-negative (GRPO's KL term).",
    "k1+": "k1+ = k2 + sg(k1 - k2): the value of k1 with the gradient of k2 (straight-through).",
    "k3+": "k3+ = k2 + sg(k3 - k2): the value of k3 with the gradient of k2 (straight-through).",
    "k3_unbiased": "k3_unbiased = (pi/pi_old) k3: unbiased when samples come from pi_old (needs old_logp).",
}


def _registered_estimator(kind: str):
    def estimator(logp, ref_logp, *, clamp: float | None = None, old_logp=None, mask=None):
        return kl_penalty(logp, ref_logp, kind, clamp=clamp, old_logp=old_logp, mask=mask)

    estimator.__name__ = "kl_" + kind.replace("+", "_straight_through")
    estimator.__doc__ = (
        _SUMMARIES[kind] + "\n\nSee `kl_penalty` for the arguments.\n\nPaper: J. Schulman, \"Approximating KL Divergence\" (2020)."
    )
    return estimator


for _kind in KL_KINDS:
    register("kl", _kind, paper=_PAPER)(_registered_estimator(_kind))
