"""Group baselines with a batch-level scale: the group mean is subtracted, the batch std divides.

Same contract as `jaxgrpo.kernels.advantages`::

    fn(rewards f32[N], group_ids i32[N], *, num_groups, valid=None, **hparams) -> f32[N]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.advantages import group_centered
from jaxgrpo.kernels.registry import register_advantage
from jaxgrpo.kernels.validation import check_outcome_inputs

Array = jax.Array


@register_advantage("grpo_batch_std", paper="Tricks or Traps? A Deep Dive into RL for LLM Reasoning (2025)",
                    ranges={"std_ddof": ("in [0, batch_size)", "delta degrees of freedom of the batch std"),
                            "eps": ("> 0", "added to the batch std so that constant rewards do not divide by 0")}, group_relative=True)
def grpo_batch_std(rewards, group_ids, *, num_groups: int, valid=None, std_ddof: int = 1, eps: float = 1e-4) -> Array:
    """Group-mean baseline, batch-std scale (Lite PPO): A_i = (r_i - mean_g) / (std_batch + eps).

    mean_g is over the valid rows of i's group, std_batch over the valid rows
    of the whole batch (the raw rewards, not the centered ones). The group std
    of GRPO over-weights groups that are nearly all right or all wrong; the
    batch std keeps one scale for every group. A group with fewer than two
    valid rows gets 0.

    Args:
      std_ddof: 1 (unbiased, as `torch.std` / TRL's `nanstd`), 0 for the population std.
      eps: added to the std; 1e-4 as TRL's `scale_rewards="batch"`.

    Paper: Liu et al., "Tricks or Traps? A Deep Dive into RL for LLM Reasoning"
    (2025), "Lite PPO"; eps and ddof from TRL.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    one_group = jnp.zeros_like(group_ids)
    batch_std = segments.std(rewards, one_group, 1, valid, ddof=std_ddof)[0]
    centered = group_centered(rewards, group_ids, num_groups, valid)
    # Divide in the scale of the rewards' largest magnitude, so 1e30-sized rewards neither overflow nor lose eps.
    peak = jnp.max(jnp.where(valid, jnp.abs(rewards), 0.0))
    k = segments.scale_exponent(peak)
    scale = segments.power_of_two(-k, rewards.dtype)
    advantages = (centered * scale) / (batch_std * scale + segments.scaled_eps(eps, k, rewards.dtype))
    n = segments.gather(segments.count(group_ids, num_groups, valid), group_ids)
    return jnp.where(valid & (n > 1), advantages, 0.0)
