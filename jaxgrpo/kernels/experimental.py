"""`jaxgrpo.kernels.experimental`, an old module name kept for code written against it: it only re-exports.

The documented reconstructions (registered under `experimental/` names) live in the module of their kind:

  experimental/etr_clip                loss             jaxgrpo.kernels.losses.adaptive_clip
  experimental/dhpo                    loss             jaxgrpo.kernels.losses.sequence
  experimental/aepo_entropy            loss             jaxgrpo.kernels.losses.reinforce (and aepo_temperature_update)
  experimental/spo_advantage           advantage        jaxgrpo.kernels.advantages.whitened
  experimental/a_grae                  advantage        jaxgrpo.kernels.advantages.reshaped
  experimental/spo_value_tracker       selection        jaxgrpo.kernels.selection (SPOTrackerState, spo_tracker_init)
  experimental/spo_priority            selection        jaxgrpo.kernels.selection
  experimental/trapo_selection         selection        jaxgrpo.kernels.selection
  experimental/t_ppo_egae              token_advantage  jaxgrpo.kernels.credit.returns
  experimental/grpo_vps_progress       credit           jaxgrpo.kernels.credit.assignment
  experimental/grpo_lambda             reward           jaxgrpo.kernels.reward_shaping
  experimental/conciser_length_reward  reward           jaxgrpo.kernels.reward_shaping

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.advantages.reshaped import _AGRAE, a_grae
from jaxgrpo.kernels.advantages.whitened import spo_advantage
from jaxgrpo.kernels.credit.assignment import _VPS, grpo_vps_progress
from jaxgrpo.kernels.credit.returns import _TPPO, _last_token_onehot, t_ppo_egae
from jaxgrpo.kernels.losses.adaptive_clip import _ETR, _clipped_surrogate, etr_clip
from jaxgrpo.kernels.losses.reinforce import _AEPO, aepo_entropy, aepo_temperature_update
from jaxgrpo.kernels.losses.sequence import _DHPO, dhpo
from jaxgrpo.kernels.reward_shaping import _CONCISER, _LAMBDA, _length_rewards, conciser_length_reward, grpo_lambda
from jaxgrpo.kernels.selection import (
    _TRAPO,
    SPOTrackerState,
    spo_priority,
    spo_tracker_init,
    spo_value_tracker,
    trapo_selection,
)

__all__ = [
    "SPOTrackerState",
    "_AEPO",
    "_AGRAE",
    "_CONCISER",
    "_DHPO",
    "_ETR",
    "_LAMBDA",
    "_TPPO",
    "_TRAPO",
    "_VPS",
    "_clipped_surrogate",
    "_last_token_onehot",
    "_length_rewards",
    "a_grae",
    "aepo_entropy",
    "aepo_temperature_update",
    "conciser_length_reward",
    "dhpo",
    "etr_clip",
    "grpo_lambda",
    "grpo_vps_progress",
    "spo_advantage",
    "spo_priority",
    "spo_tracker_init",
    "spo_value_tracker",
    "t_ppo_egae",
    "trapo_selection",
]
