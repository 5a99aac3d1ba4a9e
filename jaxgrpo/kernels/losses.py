"""Policy losses: PPO clip (GRPO, DAPO), GSPO, CISPO, REINFORCE, and the PPO value loss.

Every policy loss follows one contract::

    fn(logp: f32[N,T], old_logp: f32[N,T], advantages: f32[N] | f32[N,T],
       mask: f32[N,T], **hparams) -> (per_token_loss: f32[N,T], metrics: dict)

`per_token_loss` is zero where `mask` is zero; turn it into a scalar with
`jaxgrpo.aggregate`. `metrics` holds scalars (masked token means) such as the
clip fractions and ratio statistics.

Masked-out tokens: `prepare` replaces logp, old_logp and the advantages by 0
where `mask` is 0 before any arithmetic (`segments.fill_masked`), so NaN or
+-inf there (padding, a -inf log-probability of a pad token) gives neither a
NaN loss nor a NaN gradient; every registered loss goes through it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels.registry import register_loss
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


#: GSPO's bound on the sequence log-ratio, as verl's: s_i <= e^10, so |A| s_i stays below |A| e^10.
MAX_SEQUENCE_LOG_RATIO = 10.0
_GSPO_RANGES = {"eps_low": (">= 0", "the lower clip epsilon of the sequence ratio"),
                "eps_high": (">= 0", "the upper clip epsilon of the sequence ratio"),
                "max_seq_log_ratio": ("> 0", "the clamp of the sequence log-ratio")}


def _sequence_log_ratio(logp, old_logp, mask):
    """Mean token log-ratio of each sequence, f32[N, 1]."""
    log_r = log_ratio(logp, old_logp)
    return ((log_r * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1))[:, None]


def _gspo_surrogate(seq_ratio, adv, mask, eps_low, eps_high):
    unclipped = -adv * seq_ratio
    clipped = -adv * jnp.clip(seq_ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(unclipped, clipped)
    is_clipped = (clipped > unclipped).astype(seq_ratio.dtype)
    metrics = {"clip_fraction": masked_mean(is_clipped, mask)}
    metrics.update(ratio_metrics(seq_ratio, mask))
    return loss * mask, metrics


@register_loss("gspo", paper="Group Sequence Policy Optimization (2025)", ranges=_GSPO_RANGES)
def gspo(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_seq_log_ratio: float = MAX_SEQUENCE_LOG_RATIO,
):
    """GSPO: PPO clipping on the sequence-level geometric-mean ratio.

    s_i = exp(min((1/|o_i|) sum_t log rho_{i,t}, M)); every token of sequence i
    carries l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), so the
    `seq_mean_token_mean` aggregation gives the paper's -(1/G) sum_i min(...).

    The safety bound M (`max_seq_log_ratio`, 10 as verl) caps the sequence
    log-ratio: with A < 0 the clipped objective does not bound s_i from above,
    and token log-ratios clamped at +-20 alone would let the loss reach |A| e^20.
    Above M the loss is |A| e^M and its gradient is 0. The paper has no such bound.

    Paper: Zheng et al., "Group Sequence Policy Optimization" (2025);
    eps_low=3e-4, eps_high=4e-4 from the paper; max_seq_log_ratio=10 from verl.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    seq_log_r = jnp.minimum(_sequence_log_ratio(logp, old_logp, mask), max_seq_log_ratio)
    seq_ratio = jnp.exp(seq_log_r) * jnp.ones_like(logp)
    return _gspo_surrogate(seq_ratio, adv, mask, eps_low, eps_high)


@register_loss("gspo_token", paper="Group Sequence Policy Optimization (2025)", ranges=_GSPO_RANGES)
def gspo_token(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_seq_log_ratio: float = MAX_SEQUENCE_LOG_RATIO,
):
    """GSPO-token: the sequence ratio's value with per-token gradients.

    s_{i,t} = exp(min(sg[log s_i] + log pi(y_t) - sg[log pi(y_t)], M)): equal to
    s_i in value, so clipping is decided per sequence, while each token's
    gradient is its own (allowing token-level advantages A_{i,t}). This is
    verl's "gspo" loss.

    The safety bound M (`max_seq_log_ratio`, 10 as verl) caps the log-ratio,
    so with A < 0 the loss stays below |A| e^M instead of |A| e^20; a capped
    token has no gradient. The paper has no such bound.

    Paper: Zheng et al., "Group Sequence Policy Optimization" (2025); max_seq_log_ratio=10 from verl.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    seq_log_r = jax.lax.stop_gradient(_sequence_log_ratio(logp, old_logp, mask))
    seq_ratio = jnp.exp(jnp.minimum(seq_log_r + logp - jax.lax.stop_gradient(logp), max_seq_log_ratio))
    return _gspo_surrogate(seq_ratio, adv, mask, eps_low, eps_high)


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


# ---------------------------------------------------------------------------------------------------------
# The other policy losses of verl's registry (verl 1dda039): Clip-Cov and KL-Cov, GMPO ("geo_mean"), DPPO (TV and
# KL), DRO.
# verl's "gpg" loss is `reinforce` (-A log pi) and its "vanilla" is `ppo_clip` with clip_ratio_c=3.
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


@register_loss("gmpo", paper="Geometric-Mean Policy Optimization (2025)",
               ranges={"eps_low": (">= 0", "the lower log-space clip range"),
                       "eps_high": (">= 0", "the upper log-space clip range")})
def gmpo(logp, old_logp, advantages, mask, *, eps_low: float = 0.4, eps_high: float = 0.4):
    """GMPO: the geometric mean of token ratios, clipped per token in log space, times the sequence advantage.

    x_t = log rho_t, clipped on the side that would increase the objective:
    x'_t = sgn(A_t) min(sgn(A_t) x_t, sgn(A_t) clip(x_t, -eps_low, eps_high));
    r_i = exp(sum_t x'_t m_t / |o_i|), A_i = sum_t A_t m_t / |o_i| and every token of
    sequence i carries l_i = -A_i r_i, so `seq_mean_token_mean` gives the mean over
    sequences (verl's `geo_mean` averages over all rows, an empty row adding 0).

    Args:
      eps_low, eps_high: the log-space clip range, (e^-0.4, e^0.4) on the ratio
        as the paper. verl's `geo_mean` reads the PPO clip ratio, 0.2 by default
        (verl 1dda039): pass eps_low=eps_high=0.2 for verl's default.

    Difference from verl's `geo_mean`, deliberate: log rho is clamped to +-20
    before the clip (verl does not clamp it); it matters only on the side the
    sign of A leaves unclipped.

    Paper: Zhao et al., "Geometric-Mean Policy Optimization" (2025); verl's `geo_mean`.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    sign = jnp.sign(adv)
    bounded = jnp.clip(log_r, -eps_low, eps_high)
    log_r_min = sign * jnp.minimum(sign * log_r, sign * bounded)
    lengths = jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
    seq_ratio = jnp.exp((log_r_min * mask).sum(-1, keepdims=True) / lengths)
    seq_adv = (adv * mask).sum(-1, keepdims=True) / lengths
    loss = -seq_adv * seq_ratio * jnp.ones_like(logp)
    is_clipped = (bounded != log_r).astype(logp.dtype)
    metrics = {
        "clip_fraction_high": masked_mean(is_clipped * (adv > 0), mask),
        "clip_fraction_low": masked_mean(is_clipped * (adv < 0), mask),
    }
    metrics.update(ratio_metrics(jnp.exp(log_r), mask, log_r))
    return loss * mask, metrics


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
