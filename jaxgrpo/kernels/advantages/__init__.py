"""Outcome advantage estimators (kind "advantage"), one module per way of computing an advantage.

    group_normalized  against a group's center, scaled by a spread: GRPO, Dr. GRPO, Lite PPO's batch std
                      (grpo_batch_std), NGRPO, HAPO, BNPO, DGPO, MC-GRPO
    baselines         a baseline subtracted, no group std: RLOO, OPO, GPG, pass@k, ReMax, AsymRE, OPMD, KRPO
    whitened          whitened over the batch: REINFORCE++ (and with a group baseline), single-stream SPO
    structured        a structure inside or across the groups: GDPO (reward columns), GiGPO (agent steps),
                      Stratified GRPO (strata), SEED-GRPO (answer clusters), RiskPO (question bundles)
    reshaped          another estimator's advantage reshaped: XRPO, A-GRAE
    common            what they share: declared ranges, group centering, row-input checks

This package re-exports every estimator, so `from jaxgrpo.kernels.advantages import grpo` works for each.

Every estimator follows one contract::

    fn(rewards: f32[N], group_ids: i32[N], *, num_groups: int,
       valid: bool[N] | None = None, **hparams) -> f32[N]

with method-specific inputs (completion lengths, step returns, anchor ids, strata,
cluster ids, bundle ids, sequence log-likelihoods, a reward matrix f32[N, K])
passed as explicit keyword arrays. Rows with `valid=False` (padding, filtered
groups) get advantage 0 and do not enter their group's statistics; their
method-specific row inputs are ignored too. A group with a single valid row gets
0, except where an estimator's docstring says otherwise (verl keeps the raw
reward, group baseline 0, in `reinforce_pp_baseline`, `opo` and `gpg`; NGRPO
compares a single rollout with r_max).

Non-finite rewards: a row whose reward is NaN or +-inf is invalid (advantage 0,
left out of its group's statistics), in every registered estimator; the other
rows of its group get the advantages of the group without it. Large rewards:
group and batch statistics are computed on rewards scaled by a power of two
(`segments.unit_scale`), so the normalized estimators (GRPO, REINFORCE++, ...)
are finite for any finite reward, and the others overflow only where the
advantage itself exceeds the largest float.
"""

from __future__ import annotations

from jaxgrpo.kernels.advantages.baselines import (
    OPMD_BASELINES,
    _row_input,
    asymre,
    gpg,
    krpo,
    opmd,
    opo,
    pass_at_k,
    remax,
    rloo,
)
from jaxgrpo.kernels.advantages.common import STD_DDOF, STD_EPS, _finish, _group_count, checked_lengths, group_centered
from jaxgrpo.kernels.advantages.group_normalized import bnpo, dgpo, dr_grpo, grpo, grpo_batch_std, hapo, mc_grpo, ngrpo
from jaxgrpo.kernels.advantages.reshaped import XRPO_BASES, a_grae, xrpo
from jaxgrpo.kernels.advantages.structured import (
    SEED_SCALINGS,
    gdpo,
    gigpo,
    riskpo,
    seed_grpo,
    semantic_entropy_from_clusters,
    stratified_grpo,
)
from jaxgrpo.kernels.advantages.whitened import (
    WHITEN,
    WHITEN_EPS,
    WHITEN_MODES,
    batch_whiten,
    reinforce_pp,
    reinforce_pp_baseline,
    spo_advantage,
    whitened,
)

__all__ = [
    "OPMD_BASELINES",
    "SEED_SCALINGS",
    "STD_DDOF",
    "STD_EPS",
    "WHITEN",
    "WHITEN_EPS",
    "WHITEN_MODES",
    "XRPO_BASES",
    "_finish",
    "_group_count",
    "_row_input",
    "a_grae",
    "asymre",
    "batch_whiten",
    "bnpo",
    "checked_lengths",
    "dgpo",
    "dr_grpo",
    "gdpo",
    "gigpo",
    "gpg",
    "group_centered",
    "grpo",
    "grpo_batch_std",
    "hapo",
    "krpo",
    "mc_grpo",
    "ngrpo",
    "opmd",
    "opo",
    "pass_at_k",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
    "riskpo",
    "rloo",
    "seed_grpo",
    "semantic_entropy_from_clusters",
    "spo_advantage",
    "stratified_grpo",
    "whitened",
    "xrpo",
]
