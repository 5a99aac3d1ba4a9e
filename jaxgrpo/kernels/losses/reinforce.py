"""REINFORCE-form losses: -w_t A_t log pi(y_t), the weight w_t a constant of the gradient, and close relatives.

Plain REINFORCE (w = 1; verl's "gpg" loss), CISPO (a clipped importance weight), DPPO (a capped weight on the
tokens that stay inside a divergence trust region), DRO (plus a quadratic penalty on the log-ratio), REC (a
ratio mask and no importance weight), OPMD (a mirror-descent factor 1 / (1 + tau)), AEPO's entropy regularizer
(a reconstruction: REINFORCE on samples of a tempered policy) and Critique-GRPO (a shaped likelihood on
off-policy refinement tokens, the unclipped ratio on the others). A token's gradient is dropped by a mask, not
by clipping the ratio.

Every loss follows the policy-loss contract of `jaxgrpo.kernels.losses`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import papers
from jaxgrpo.kernels.losses.common import log_ratio, prepare, ratio_metrics
from jaxgrpo.kernels.registry import register, register_loss
from jaxgrpo.kernels.segments import masked_mean
from jaxgrpo.kernels.validation import check_same_shape

Array = jax.Array


@register_loss("reinforce", paper="Simple Statistical Gradient-Following Algorithms for Connectionist Reinforcement Learning (1992)")
def reinforce(logp, old_logp, advantages, mask):
    """REINFORCE: l_t = -A_t log pi(y_t), no importance ratio.

    Exact for on-policy data; `old_logp` only feeds the ratio metrics.

    Paper: Williams, "Simple Statistical Gradient-Following Algorithms for
    Connectionist Reinforcement Learning" (1992).
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    return -adv * logp * mask, ratio_metrics(jnp.exp(log_r), mask, log_r)


@register_loss("cispo", paper="MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention (2025)",
               ranges={"eps_low": (">= 0", "the lower clip of the importance weight; None: unbounded below"),
                       "eps_high": (">= 0", "the upper clip of the importance weight")})
def cispo(logp, old_logp, advantages, mask, *, eps_low: float | None = None, eps_high: float = 5.0):
    """CISPO: REINFORCE with a clipped, stop-gradient importance weight.

    l_t = -sg[clip(rho_t, 1 - eps_low, 1 + eps_high)] A_t log pi(y_t). Unlike
    PPO clipping, no token's gradient is dropped; only its weight is bounded.

    Args:
      eps_low: lower clip; None (default) leaves the weight unbounded below, as
        MiniMax-M1 does.
      eps_high: upper clip; 5.0 as recommended by ScaleRL (Khatri et al., 2025),
        since MiniMax-M1 gives no number. TRL's `epsilon_high=5.0` caps the
        ratio itself at 5, which is `eps_high=4.0` here.

    Paper: MiniMax, "MiniMax-M1" (2025).
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    lower = 0.0 if eps_low is None else 1.0 - eps_low
    weight = jax.lax.stop_gradient(jnp.clip(ratio, lower, 1.0 + eps_high))
    loss = -weight * adv * logp
    metrics = {"clip_fraction": masked_mean((ratio > 1.0 + eps_high).astype(logp.dtype), mask)}
    if eps_low is not None:
        metrics["clip_fraction_low"] = masked_mean((ratio < lower).astype(logp.dtype), mask)
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


# ------------------------------------------------------------------------ DPPO


_DPPO_RANGES = {"delta_low": (">= 0", "the divergence threshold for tokens whose ratio fell"),
                "delta_high": (">= 0", "the divergence threshold for tokens whose ratio rose"),
                "max_ratio": ("> 0", "the cap of the importance weight")}


def _divergence_masked_loss(logp, adv, mask, ratio, log_r, keep, max_ratio):
    """-A sg(min(rho, max_ratio)) log pi on the tokens `keep` holds, 0 elsewhere (DPPO's surrogate)."""
    weight = jax.lax.stop_gradient(jnp.minimum(ratio, max_ratio))
    keep = jax.lax.stop_gradient(keep)
    loss = jnp.where(keep, -adv * weight * logp, 0.0)
    metrics = {
        "clip_fraction": masked_mean((~keep).astype(logp.dtype), mask),
        "ratio_capped_fraction": masked_mean(((ratio > max_ratio) & keep).astype(logp.dtype), mask),
    }
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


def _probabilities(logp, old_logp):
    """pi(y_t) and pi_old(y_t), with log-probabilities above 0 (not probabilities) read as 0."""
    return jnp.exp(jnp.minimum(logp, 0.0)), jnp.exp(jnp.minimum(old_logp, 0.0))


@register_loss("dppo_tv", paper="Rethinking the Trust Region in LLM Reinforcement Learning (2026)", ranges=_DPPO_RANGES)
def dppo_tv(logp, old_logp, advantages, mask, *, delta_low: float = 0.2, delta_high: float = 0.2,
            max_ratio: float = 20.0):
    """DPPO-Binary-TV: REINFORCE with a capped importance weight, masked by the token's probability change.

    l_t = -A_t sg(min(rho_t, max_ratio)) log pi(y_t) where the update stays in the
    trust region, 0 elsewhere: pi - pi_old <= delta_high for A_t > 0 and
    pi - pi_old >= -delta_low for A_t <= 0 (the binary total variation between
    pi_old and pi at the sampled token; only the side that the advantage pushes
    is bounded).

    Args:
      delta_low, delta_high: TV thresholds; 0.2 as verl's PPO clip ratio, which
        verl's `dppo_tv` reads.
      max_ratio: the cap of the importance weight; 20, the paper's advice of a
        large cap and verl's own fallback. verl caps at the actor's
        `clip_ratio_c`, which its default config sets to 3.0 (verl 1dda039):
        pass max_ratio=3.0 for verl's default.

    Paper: Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning" (2026); verl's `dppo_tv`.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    p, p_old = _probabilities(logp, old_logp)
    keep = jnp.where(adv > 0, p - p_old <= delta_high, p - p_old >= -delta_low)
    return _divergence_masked_loss(logp, adv, mask, ratio, log_r, keep, max_ratio)


@register_loss("dppo_kl", paper="Rethinking the Trust Region in LLM Reinforcement Learning (2026)", ranges=_DPPO_RANGES)
def dppo_kl(logp, old_logp, advantages, mask, *, delta_low: float = 0.2, delta_high: float = 0.2,
            max_ratio: float = 20.0):
    """DPPO-Binary-KL: as `dppo_tv`, with the binary KL between pi_old and pi at the sampled token.

    D_t = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)),
    p = pi(y_t), p_old = pi_old(y_t). A token is kept for A_t > 0 when
    D_t <= delta_high or p <= p_old, for A_t <= 0 when D_t <= delta_low or
    p >= p_old; l_t = -A_t sg(min(rho_t, max_ratio)) log pi(y_t) where kept, 0 elsewhere.

    Args:
      delta_low, delta_high: KL thresholds; 0.2 as verl's PPO clip ratio, which
        verl's `dppo_kl` reads.
      max_ratio: 20 as `dppo_tv` (verl's default config caps at clip_ratio_c = 3.0).

    Paper: Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning" (2026); verl's `dppo_kl`.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    p, p_old = _probabilities(logp, old_logp)
    binary_kl = p_old * (old_logp - logp) + (1.0 - p_old) * (jnp.log(1.0 - p_old + 1e-8) - jnp.log(1.0 - p + 1e-8))
    binary_kl = jax.lax.stop_gradient(binary_kl)
    keep = jnp.where(adv > 0, (binary_kl <= delta_high) | (p <= p_old), (binary_kl <= delta_low) | (p >= p_old))
    return _divergence_masked_loss(logp, adv, mask, ratio, log_r, keep, max_ratio)


# ------------------------------------------------------------------------- DRO


@register_loss("dro", paper="Direct Reward Optimization loss, Tinker by Thinking Machines (2025)",
               ranges={"beta": (">= 0", "the weight of the quadratic log-ratio penalty")})
def dro(logp, old_logp, advantages, mask, *, beta: float = 0.1):
    """DRO: the policy-gradient term with a quadratic penalty on the log-ratio, l_t = -(A_t log pi - beta/2 (log rho_t)^2).

    log rho_t = log pi(y_t) - log pi_old(y_t), not clamped. The penalty keeps the
    update near the sampling policy without clipping or a reference model. Here,
    unlike Tinker's, a masked-out token carries neither term.

    Args:
      beta: 0.1 as Tinker's. verl (1dda039, `policy_loss.dro_beta`) has no
        default: it requires a positive beta.

    Paper: the Direct Reward Optimization (DRO) loss as Tinker (Thinking Machines,
    2025) publishes it; the formula is verl's `dro` (verl 1dda039).
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    delta = logp - old_logp
    loss = -(adv * logp - 0.5 * beta * jnp.square(delta))
    metrics = ratio_metrics(jnp.exp(log_ratio(logp, old_logp)), mask, log_ratio(logp, old_logp))
    return loss * mask, metrics


# --------------------------------------- Off-policy group REINFORCE: REC, OPMD

# Their advantages, `asymre` and `opmd`, are in `jaxgrpo.kernels.advantages.baselines`.
REC_CLIP_MODES = ("one_sided", "two_sided", "none")


@register_loss("rec", paper=papers.OFF_POLICY_REINFORCE,
               ranges={"clip_mode": ("one of one_sided, two_sided, none", "which tokens the clip keeps"),
                       "eps_low": (">= 0", "the lower clip epsilon"), "eps_high": (">= 0", "the upper clip epsilon")})
def rec(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    clip_mode: str = "one_sided",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
):
    """REC: REINFORCE with a ratio mask and no importance weight.

    l_t = -A_t log pi(y_t) 1[rho_t in range], rho_t = sg[pi / pi_old]:
    "one_sided" keeps tokens with (A >= 0 and rho <= 1 + eps_high) or
    (A <= 0 and rho >= 1 - eps_low), the tokens PPO's clip would still move;
    "two_sided" keeps 1 - eps_low <= rho <= 1 + eps_high; "none" keeps all.
    Because rho is detached, a kept token's gradient is the on-policy
    REINFORCE gradient.

    Defaults: eps_low = eps_high = 0.2 (Trinity-RFT); "one_sided" is the paper's
    REC-OneSide-NoIS variant (Trinity-RFT's class default is "none").

    Paper: "Group-Relative REINFORCE Is Secretly an Off-Policy
    Algorithm" (2025); checked against Trinity-RFT `rec_policy_loss.py`.
    """
    if clip_mode not in REC_CLIP_MODES:
        raise ValueError(f"clip_mode must be one of {REC_CLIP_MODES}, got {clip_mode!r}")
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = jax.lax.stop_gradient(log_ratio(logp, old_logp))
    ratio = jnp.exp(log_r)
    if clip_mode == "two_sided":
        in_range = (ratio >= 1.0 - eps_low) & (ratio <= 1.0 + eps_high)
    elif clip_mode == "one_sided":
        in_range = ((adv >= 0) & (ratio <= 1.0 + eps_high)) | ((adv <= 0) & (ratio >= 1.0 - eps_low))
    else:
        in_range = jnp.ones_like(ratio, bool)
    loss = -adv * logp * in_range.astype(logp.dtype)
    metrics = {"clip_fraction": masked_mean((~in_range).astype(logp.dtype), mask)}
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


@register_loss("opmd", paper=papers.OFF_POLICY_REINFORCE,
               ranges={"tau": ("> -1", "the regularization strength; the loss is divided by 1 + tau")})
def opmd_loss(logp, old_logp, advantages, mask, *, tau: float = 1.0):
    """OPMD policy loss: l_t = -A_t log pi(y_t) / (1 + tau), no importance ratio.

    The 1/(1 + tau) factor is the mirror-descent step against the current
    policy (regularization strength tau=1, Trinity-RFT default). `old_logp`
    only feeds the ratio metrics. Aggregate with `token_mean` as Trinity-RFT.

    Paper: "Group-Relative REINFORCE Is Secretly an Off-Policy
    Algorithm" (2025); Trinity-RFT `opmd_policy_loss.py`.
    """
    if tau <= -1.0:
        raise ValueError(f"tau must be > -1, got {tau}")
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    return -adv * logp / (1.0 + tau) * mask, ratio_metrics(jnp.exp(log_r), mask, log_r)


# -------------------------------------------------------- Arbitrary-Entropy PO


_AEPO = "Arbitrary Entropy Policy Optimization: Entropy Is Controllable in Reinforcement Fine-tuning (2025)"


@register("loss", "experimental/aepo_entropy", paper=_AEPO,
          ranges={"coef": (">= 0", "c, the weight of the regularizer")})
def aepo_entropy(logp, old_logp, advantages, mask, *, coef: float = 1.0, positive_only: bool = False):
    """Arbitrary-Entropy PO regularizer (reconstruction): REINFORCE on samples of a tempered policy.

    l_t = -c A_t log pi_theta(y_t), where y is sampled from the temperature-T
    distribution softmax(z / T) of the current policy and `logp` is its
    log-probability under the training policy (T = 1). It replaces the entropy
    bonus: with T > 1 the samples are flatter than pi, so reinforcing them
    raises entropy, T < 1 lowers it. Hold entropy at a target by adapting T
    with `aepo_temperature_update`. Add this per-token term to the policy loss
    of the ordinary rollouts.

    Reconstructed from the abstract of "Arbitrary Entropy Policy Optimization:
    Entropy Is Controllable in Reinforcement Fine-tuning" (2025) ("replace the
    entropy bonus by REINFORCE on a temperature-adjusted distribution;
    temperature regulated to hold entropy at a target"). Unverified: the
    advantages used for the tempered samples (any estimator over them; all
    ones gives plain likelihood), the absence of importance correction, and
    c = 1. With c = 1 it equals `reinforce`. Title of arXiv 2510.08141 v1
    (later versions: "... Breaks The Exploration Bottleneck of Reinforcement Learning").

    Args:
      coef: c, the weight of the regularizer.
      positive_only: keep only tempered samples with A > 0; a third-party
        summary says negative samples are filtered ("unidirectional
        optimization"), which we could not check, so it is off by default.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    if positive_only:
        adv = jnp.maximum(adv, 0.0)
    log_r = log_ratio(logp, old_logp)
    return -coef * adv * logp * mask, ratio_metrics(jnp.exp(log_r), mask, log_r)


def aepo_temperature_update(
    temperature,
    entropy,
    *,
    target_entropy: float,
    step_size: float = 0.1,
    min_temperature: float = 0.5,
    max_temperature: float = 2.0,
) -> Array:
    """AEPO's temperature controller (reconstruction): log T <- log T + eta (H_target - H), clipped.

    Raises T while the policy's entropy H is below target, lowers it above.
    Multiplicative in T so it stays positive. Unverified: the update law and
    the defaults (eta = 0.1, T in [0.5, 2]); a pure scalar function for the trainer.
    """
    if not 0 < min_temperature <= max_temperature:
        raise ValueError(f"need 0 < min_temperature <= max_temperature, got {min_temperature}, {max_temperature}")
    log_t = jnp.log(jnp.asarray(temperature, jnp.float32)) + step_size * (target_entropy - jnp.asarray(entropy, jnp.float32))
    return jnp.clip(jnp.exp(log_t), min_temperature, max_temperature)


# --------------------------------------------------------------- Critique-GRPO


_CRITIQUE = "Critique-GRPO: Advancing LLM Reasoning with Natural Language and Numerical Feedback (2025)"


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
