"""`jaxgrpo.kernels.catalog_losses`, an old module name kept for code written against it: it only re-exports.

SAPO and DeGRPO live in `jaxgrpo.kernels.losses.clipped`, BAPO and the HAPO loss in
`jaxgrpo.kernels.losses.adaptive_clip`, DisCO in `jaxgrpo.kernels.losses.sequence`, Critique-GRPO in
`jaxgrpo.kernels.losses.reinforce`, and the HAPO advantage (`hapo`) in
`jaxgrpo.kernels.advantages.group_normalized`.

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.advantages.group_normalized import hapo
from jaxgrpo.kernels.losses.adaptive_clip import (
    _BAPO,
    _bound_grid,
    _dual_clip,
    bapo,
    bapo_clip_bounds,
    hapo_adaptive_clip_range,
    hapo_clip,
    hapo_entropy_scale,
)
from jaxgrpo.kernels.losses.clipped import _SAPO, _THINKLESS, degrpo, first_token_mask, sapo, sapo_gate
from jaxgrpo.kernels.losses.reinforce import _CRITIQUE, critique_grpo, policy_shaping
from jaxgrpo.kernels.losses.sequence import _DISCO, _log_mean_exp_per_group, disco

__all__ = [
    "_BAPO",
    "_CRITIQUE",
    "_DISCO",
    "_SAPO",
    "_THINKLESS",
    "_bound_grid",
    "_dual_clip",
    "_log_mean_exp_per_group",
    "bapo",
    "bapo_clip_bounds",
    "critique_grpo",
    "degrpo",
    "disco",
    "first_token_mask",
    "hapo",
    "hapo_adaptive_clip_range",
    "hapo_clip",
    "hapo_entropy_scale",
    "policy_shaping",
    "sapo",
    "sapo_gate",
]
