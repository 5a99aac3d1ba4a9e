"""KL estimators between the policy and a reference, per token (Schulman's k1, k2, k3).

With samples y ~ pi and x = log pi_ref(y) - log pi(y):

    k1 = -x                 unbiased, high variance, can be negative
    k2 = x^2 / 2            biased, low variance; its gradient is that of KL(pi || pi_ref)
    k3 = exp(x) - x - 1     unbiased, low variance, always >= 0 (x clamped to +-20)
    abs = |x|               biased; the "abs" penalty of verl and TRL's PPO

Straight-through variants `k1+`, `k3+`, `abs+` take the value of k1/k3/abs and
the gradient of k2. `k3_unbiased` weights k3 by the importance ratio pi / pi_old,
which keeps the estimate of KL(pi || pi_ref) unbiased when the samples came from
pi_old.

`clamp` bounds the value only. For the straight-through kinds the clamp acts on
the forward value (clip(k_n, -c, c)) before the straight-through step, so the
gradient stays that of k2 at every token, including those whose k_n exceeds the
clamp; verl's "k3+" (low_var_kl clamped at 10, gradient of k2) does the same.

Defaults that differ from verl: `clamp` is None (no bound, Schulman's k3),
while verl's `low_var_kl` / `k3` always clamps k3 to [-10, 10]. Pass `clamp=10`
for verl's value.

Pass `mask` to get 0 (value and gradient) at masked-out tokens whatever the
log-probabilities hold there: NaN or -inf at a pad token would otherwise turn
`kl * mask` and its gradient into NaN.

Reference: J. Schulman, "Approximating KL Divergence" (2020).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels.losses.common import MAX_LOG_RATIO
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.segments import fill_masked
from jaxgrpo.kernels.validation import check_token_inputs

Array = jax.Array

KL_KINDS = ("k1", "k2", "k3", "abs", "k1+", "k3+", "abs+", "k3_unbiased")
_PAPER = "Approximating KL Divergence, J. Schulman (2020)"


def _k1(log_r):
    return -log_r


def _k2(log_r):
    return 0.5 * jnp.square(log_r)


def _abs(log_r):
    # |x| with gradient sign(x): 0 at x = 0, as torch's abs in verl (jnp.abs would give 1 there).
    return log_r * jnp.sign(log_r)


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


#: The straight-through kinds: the value of the estimator named here, the gradient of k2.
_STRAIGHT_THROUGH = {"k1+": _k1, "k3+": _k3, "abs+": _abs}


def kl_penalty(logp, ref_logp, kind: str = "k3", *, clamp: float | None = None, old_logp=None, mask=None) -> Array:
    """Per-token KL estimate between the policy and a reference.

    Args:
      logp: f32[N, T] log pi(y_t) under the policy being trained.
      ref_logp: f32[N, T] log pi_ref(y_t) under the reference (frozen) policy.
      kind: one of `KL_KINDS` (see the module docstring). GRPO uses k3.
      clamp: if set, clamps the estimate's value to [-clamp, clamp]; None (the
        default, Schulman's estimators) leaves it unbounded, whereas verl's
        `low_var_kl` always clamps k3 at 10 (pass clamp=10 for verl's value).
        The straight-through kinds clamp their forward value only: their
        gradient is k2's at every token.
      old_logp: f32[N, T] log pi_old(y_t) of the sampling policy; required for
        `k3_unbiased`.
      mask: optional f32[N, T] (or bool) token mask; where it is 0 the inputs are
        replaced by 0 before any arithmetic and the estimate is 0, so NaN or
        -inf there reaches neither the value nor the gradient.

    Returns:
      f32[N, T] per-token estimate (not multiplied by the mask).

    With x = log pi_ref - log pi: k1 = -x, k2 = x^2 / 2, k3 = exp(x) - x - 1,
    abs = |x|; "+" kinds: k2 + sg(clip(k_n) - k2).

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
    bound = (lambda x: x) if clamp is None else (lambda x: jnp.clip(x, -clamp, clamp))
    if kind in _STRAIGHT_THROUGH:
        # The clamp bounds the forward value only; the gradient is k2's everywhere.
        return _straight_through(bound(_STRAIGHT_THROUGH[kind](log_r)), _k2(log_r))
    if kind == "k3_unbiased":
        if old_logp is None:
            raise ValueError("kind='k3_unbiased' needs old_logp (log-probs of the sampling policy)")
        kl = jnp.exp(jnp.clip(logp - old_logp, -MAX_LOG_RATIO, MAX_LOG_RATIO)) * _k3(log_r)
    else:
        kl = {"k1": _k1, "k2": _k2, "k3": _k3, "abs": _abs}[kind](log_r)
    return bound(kl)


_SUMMARIES = {
    "k1": "k1 = log pi - log pi_ref: unbiased KL estimate, high variance.",
    "k2": "k2 = (log pi - log pi_ref)^2 / 2: low variance; its gradient is the KL's.",
    "k3": "k3 = pi_ref/pi - log(pi_ref/pi) - 1: unbiased, non-negative (GRPO's KL term).",
    "k1+": "k1+ = k2 + sg(k1 - k2): the value of k1 with the gradient of k2 (straight-through).",
    "k3+": "k3+ = k2 + sg(k3 - k2): the value of k3 with the gradient of k2 (straight-through).",
    "abs": "abs = |log pi - log pi_ref|: the absolute log-ratio penalty (verl's \"abs\").",
    "abs+": "abs+ = k2 + sg(abs - k2): the value of abs with the gradient of k2 (straight-through).",
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
    register("kl", _kind, paper=_PAPER,
             ranges={"clamp": ("> 0", "the bound of the estimate's absolute value; None: no bound")})(_registered_estimator(_kind))
