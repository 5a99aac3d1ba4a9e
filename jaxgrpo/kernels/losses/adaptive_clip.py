"""Clipped surrogates whose clip range adapts: to the batch (BAPO), to each token (HAPO), to each sample (ETR).

Each is PPO's clipped token-ratio loss (`clipped.ppo_clip`) with the range [1 - eps_low, 1 + eps_high]
replaced by bounds computed from the batch: BAPO searches them so that positive and negative updates balance,
HAPO widens them with the token's normalized entropy, ETR (a reconstruction) scales them by |A| and the
group's reward variance. The bounds are constants of the loss: no gradient flows through them.

Every loss follows the policy-loss contract of `jaxgrpo.kernels.losses`.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import papers, segments
from jaxgrpo.kernels.losses.common import CLIP_RATIO_C, EPS_HIGH, EPS_LOW, log_ratio, prepare, ratio_metrics
from jaxgrpo.kernels.registry import register, register_loss
from jaxgrpo.kernels.segments import masked_mean
from jaxgrpo.kernels.validation import check_floating, check_same_shape, check_token_inputs

Array = jax.Array


def _dual_clip(loss: Array, adv: Array, clip_ratio_c: float | None) -> Array:
    """Dual clip (Ye et al. 2020): for A < 0 the loss is at most -c A."""
    if clip_ratio_c is None:
        return loss
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (the dual-clip bound), got {clip_ratio_c}")
    return jnp.where(adv < 0, jnp.minimum(loss, -adv * clip_ratio_c), loss)


# ------------------------------------------------------------------------ BAPO


_BAPO = (
    "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy Optimization "
    "with Adaptive Clipping (2025)"
)


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


# ------------------------------------------------------------------------ HAPO

# HAPO's advantage, `hapo`, is in `jaxgrpo.kernels.advantages.group_normalized`.


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


@register_loss("hapo_clip", paper=papers.HAPO, ranges={
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


# ------------------------------------------------------------------------- ETR


_ETR = "ETR: Outcome-Guided Elastic Trust Regions for Policy Optimization (2026)"


def _clipped_surrogate(ratio, adv, low, high):
    """-min(rho A, clip(rho, low, high) A) and whether the clipped branch is active."""
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, low, high)
    return jnp.maximum(unclipped, clipped), clipped > unclipped


@register("loss", "experimental/etr_clip", paper=_ETR, ranges={
    "eps_low": EPS_LOW, "eps_high": EPS_HIGH,
    "advantage_elasticity": (">= 0", "a, the micro slope of the clip scale in |A|"),
    "variance_elasticity": (">= 0", "b, the macro slope of the clip scale in the group variance"),
    "max_variance": ("> 0", "v_max, the largest group variance of the reward"),
    "min_scale": ("in (0, max_scale]", "the least clip scale s"),
    "max_scale": (">= min_scale", "the largest clip scale s"),
})
def etr_clip(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    group_variance=None,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    advantage_elasticity: float = 0.5,
    variance_elasticity: float = 0.5,
    max_variance: float = 0.25,
    min_scale: float = 0.5,
    max_scale: float = 2.0,
):
    """ETR (reconstruction): PPO clipping with a clip range scaled per sample by |A| and group variance.

    l_t = -min(rho_t A_t, clip(rho_t, 1 - s_t eps_low, 1 + s_t eps_high) A_t), with
    s_t = clip(micro_t * macro_i, min_scale, max_scale),
    micro_t = 1 + a (|A_t| - 1)  and  macro_i = 1 + b (2 v_i / v_max - 1).

    A z-scored advantage of magnitude 1 keeps the base range; larger |A|
    (confident outcome signal) widens it. A group at the maximum reward variance
    v_max (p = 0.5 for 0/1 rewards, the "optimal learning zone") gets 1 + b,
    half of it gets 1, a constant group 1 - b.

    Reconstructed from the abstract of Zhang et al., "ETR: Outcome-Guided
    Elastic Trust Regions for Policy Optimization" (2026): "at the micro level,
    it scales clipping boundaries based on advantage magnitude; at the macro
    level, it leverages group variance to allocate larger update budgets".
    Unverified: the linear forms of micro and macro, their product, the bounds,
    and every default (a = b = 0.5, scale in [0.5, 2], v_max = 0.25 for 0/1
    rewards) are ours, not the paper's. With a = b = 0 it is exactly `ppo_clip`.

    Args:
      group_variance: optional f32[N], the reward variance of each row's group
        (e.g. `segments.gather(segments.variance(r, g, G, valid), g)`); None
        disables the macro factor.
      eps_low, eps_high: base clip range (eps_high defaults to eps_low; 0.2 as GRPO).
      advantage_elasticity: a, the micro slope.
      variance_elasticity: b, the macro slope.
      max_variance: v_max, the largest group variance of the reward (0.25 for 0/1).
      min_scale, max_scale: bounds on s.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    eps_high = eps_low if eps_high is None else eps_high
    if not 0 < min_scale <= max_scale:
        raise ValueError(f"need 0 < min_scale <= max_scale, got {min_scale}, {max_scale}")
    micro = 1.0 + advantage_elasticity * (jnp.abs(adv) - 1.0)
    if group_variance is None:
        macro = jnp.ones((logp.shape[0], 1), logp.dtype)
    else:
        group_variance = check_floating("group_variance", group_variance)
        if group_variance.shape != (logp.shape[0],):
            raise ValueError(
                f"group_variance must have shape [N]=[{logp.shape[0]}], got {tuple(group_variance.shape)}"
            )
        macro = (1.0 + variance_elasticity * (2.0 * group_variance / max_variance - 1.0))[:, None]
    # The clip range is a function of the (constant) advantages only: no gradient flows through it.
    scale = jax.lax.stop_gradient(jnp.clip(micro * macro, min_scale, max_scale))
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    loss, is_clipped = _clipped_surrogate(ratio, adv, 1.0 - scale * eps_low, 1.0 + scale * eps_high)
    metrics = {
        "clip_fraction": masked_mean(is_clipped.astype(logp.dtype), mask),
        "clip_scale_mean": masked_mean(scale * jnp.ones_like(logp), mask),
    }
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics
