"""Policy losses (kind "loss"), one module per way of weighting the policy gradient.

    clipped        PPO's clipped token ratio (GRPO, DAPO) and losses built on it: SAPO, DeGRPO, Clip-Cov, KL-Cov;
                   PPO's clipped value loss
    adaptive_clip  a clip range computed from the batch: BAPO, HAPO, ETR
    sequence       sequence-level ratios and scores: GSPO, GSPO-token, GMPO, VESPO, DHPO, DisCO
    reinforce      -w A log pi with a constant weight: REINFORCE, CISPO, DPPO (TV, KL), DRO, REC, OPMD, AEPO,
                   Critique-GRPO
    common         what they share: `prepare`, `log_ratio`, `ratio_metrics`, declared ranges

This package re-exports every loss, so `from jaxgrpo.kernels.losses import ppo_clip` works for each.

Every policy loss follows one contract::

    fn(logp: f32[N,T], old_logp: f32[N,T], advantages: f32[N] | f32[N,T],
       mask: f32[N,T], **hparams) -> (per_token_loss: f32[N,T], metrics: dict)

`per_token_loss` is zero where `mask` is zero; turn it into a scalar with
`jaxgrpo.aggregate`. `metrics` holds scalars (masked token means) such as the
clip fractions and ratio statistics. Inputs a method needs beyond that (token
entropies, group ids, prefix masks) are explicit keyword array arguments. Where
the paper's loss is not a plain token average, the docstring says which
`aggregate` mode reproduces it exactly.

Masked-out tokens: `prepare` replaces logp, old_logp and the advantages by 0
where `mask` is 0 before any arithmetic (`segments.fill_masked`), so NaN or
+-inf there (padding, a -inf log-probability of a pad token) gives neither a
NaN loss nor a NaN gradient; every registered loss goes through it (DisCO, which
reads rewards rather than advantages, fills its inputs the same way).
"""

from __future__ import annotations

from jaxgrpo.kernels.losses.adaptive_clip import (
    bapo,
    bapo_clip_bounds,
    etr_clip,
    hapo_adaptive_clip_range,
    hapo_clip,
    hapo_entropy_scale,
)
from jaxgrpo.kernels.losses.clipped import (
    _centered_covariance,
    _first_k,
    _token_count_fraction,
    clip_cov,
    clipped_value_loss,
    degrpo,
    first_token_mask,
    kl_cov,
    ppo_clip,
    sapo,
    sapo_gate,
)
from jaxgrpo.kernels.losses.common import (
    CLIP_RATIO_C,
    EPS_HIGH,
    EPS_LOW,
    MAX_LOG_RATIO,
    log_ratio,
    prepare,
    ratio_metrics,
)
from jaxgrpo.kernels.losses.reinforce import (
    REC_CLIP_MODES,
    _DPPO_RANGES,
    _divergence_masked_loss,
    _probabilities,
    aepo_entropy,
    aepo_temperature_update,
    cispo,
    critique_grpo,
    dppo_kl,
    dppo_tv,
    dro,
    opmd_loss,
    policy_shaping,
    rec,
    reinforce,
)
from jaxgrpo.kernels.losses.sequence import (
    MAX_SEQUENCE_LOG_RATIO,
    MIN_LOG_SEQUENCE_RATIO,
    _GSPO_RANGES,
    _gspo_surrogate,
    _sequence_log_ratio,
    dhpo,
    disco,
    gamma_weight,
    gmpo,
    gspo,
    gspo_token,
    vespo,
)

__all__ = [
    "CLIP_RATIO_C",
    "EPS_HIGH",
    "EPS_LOW",
    "MAX_LOG_RATIO",
    "MAX_SEQUENCE_LOG_RATIO",
    "MIN_LOG_SEQUENCE_RATIO",
    "REC_CLIP_MODES",
    "_DPPO_RANGES",
    "_GSPO_RANGES",
    "_centered_covariance",
    "_divergence_masked_loss",
    "_first_k",
    "_gspo_surrogate",
    "_probabilities",
    "_sequence_log_ratio",
    "_token_count_fraction",
    "aepo_entropy",
    "aepo_temperature_update",
    "bapo",
    "bapo_clip_bounds",
    "cispo",
    "clip_cov",
    "clipped_value_loss",
    "critique_grpo",
    "degrpo",
    "dhpo",
    "disco",
    "dppo_kl",
    "dppo_tv",
    "dro",
    "etr_clip",
    "first_token_mask",
    "gamma_weight",
    "gmpo",
    "gspo",
    "gspo_token",
    "hapo_adaptive_clip_range",
    "hapo_clip",
    "hapo_entropy_scale",
    "kl_cov",
    "log_ratio",
    "opmd_loss",
    "policy_shaping",
    "ppo_clip",
    "prepare",
    "ratio_metrics",
    "rec",
    "reinforce",
    "sapo",
    "sapo_gate",
    "vespo",
]
