"""`jaxgrpo.kernels.catalog_advantages`, an old module name kept for code written against it: it only re-exports.

The catalog's advantage estimators live in `jaxgrpo.kernels.advantages` (`group_normalized`: BNPO,
NGRPO, DGPO, MC-GRPO; `baselines`: KRPO, AsymRE, OPMD; `structured`: GDPO, GiGPO, Stratified GRPO,
SEED-GRPO, RiskPO; `reshaped`: XRPO), the REC and OPMD losses in `jaxgrpo.kernels.losses.reinforce`,
`mc_grpo_pivot_mask` in `jaxgrpo.kernels.masks`, `dgpo_question_weights` in `jaxgrpo.kernels.selection`,
and the generic helpers (`sorted_rows_within_groups`, `lower_median_rows`, `joint_segment_ids`,
`rank_within_groups`, `quantile_within_groups`) in `jaxgrpo.kernels.segments`.

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.advantages.baselines import OPMD_BASELINES, asymre, krpo, opmd
from jaxgrpo.kernels.advantages.common import (
    _check_ids_in_range,
    _check_row_array,
    _group_count,
    _zero_invalid_and_singletons,
)
from jaxgrpo.kernels.advantages.group_normalized import _median_and_mad, bnpo, dgpo, mc_grpo, ngrpo
from jaxgrpo.kernels.advantages.reshaped import XRPO_BASES, xrpo
from jaxgrpo.kernels.advantages.structured import (
    SEED_SCALINGS,
    _grpo_normalize,
    _normalize_in_segments,
    gdpo,
    gigpo,
    riskpo,
    seed_grpo,
    semantic_entropy_from_clusters,
    stratified_grpo,
)
from jaxgrpo.kernels.losses.reinforce import REC_CLIP_MODES, opmd_loss, rec
from jaxgrpo.kernels.masks import mc_grpo_pivot_mask
from jaxgrpo.kernels.segments import (
    joint_segment_ids,
    lower_median_rows,
    quantile_within_groups,
    rank_within_groups,
    sorted_rows_within_groups,
)
from jaxgrpo.kernels.selection import dgpo_question_weights

__all__ = [
    "OPMD_BASELINES",
    "REC_CLIP_MODES",
    "SEED_SCALINGS",
    "XRPO_BASES",
    "_check_ids_in_range",
    "_check_row_array",
    "_group_count",
    "_grpo_normalize",
    "_median_and_mad",
    "_normalize_in_segments",
    "_zero_invalid_and_singletons",
    "asymre",
    "bnpo",
    "dgpo",
    "dgpo_question_weights",
    "gdpo",
    "gigpo",
    "joint_segment_ids",
    "krpo",
    "lower_median_rows",
    "mc_grpo",
    "mc_grpo_pivot_mask",
    "ngrpo",
    "opmd",
    "opmd_loss",
    "quantile_within_groups",
    "rank_within_groups",
    "rec",
    "riskpo",
    "seed_grpo",
    "semantic_entropy_from_clusters",
    "sorted_rows_within_groups",
    "stratified_grpo",
    "xrpo",
]
