"""`jaxgrpo.kernels.group_rewards`, an old module name kept for code written against it: it only re-exports.

Pref-GRPO's win rates, S-GRPO's serial rewards and advantages, GRPO-CARE's bonus and AdaptThink's
reward live in `jaxgrpo.kernels.reward_shaping`.

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.reward_shaping import (
    _ADAPTTHINK,
    _CARE,
    _PREF_GRPO,
    _S_GRPO,
    adaptthink_reward,
    grpo_care_bonus,
    pref_grpo_win_rate,
    s_grpo_serial_advantages,
    s_grpo_serial_rewards,
)

__all__ = [
    "_ADAPTTHINK",
    "_CARE",
    "_PREF_GRPO",
    "_S_GRPO",
    "adaptthink_reward",
    "grpo_care_bonus",
    "pref_grpo_win_rate",
    "s_grpo_serial_advantages",
    "s_grpo_serial_rewards",
]
