"""`jaxgrpo.kernels.reward_scaling`, an old module name kept for code written against it: it only re-exports.

`grpo_batch_std` (Lite PPO) lives in `jaxgrpo.kernels.advantages.group_normalized`.

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.advantages.group_normalized import grpo_batch_std

__all__ = [
    "grpo_batch_std",
]
