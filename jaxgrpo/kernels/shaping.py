"""DAPO's reward shaping and dynamic-sampling filter, as pure kernels."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.validation import check_outcome_inputs, check_rank

Array = jax.Array

_DAPO = "DAPO: An Open-Source LLM Reinforcement Learning System at Scale (2025)"


@register("reward", "overlong_penalty", paper=_DAPO, ranges={
    "max_len": (">= cache_len", "L_max, the length in tokens beyond which the penalty is -1"),
    "cache_len": ("in (0, max_len]", "L_cache, the window in tokens before max_len where the penalty grows"),
})
def overlong_penalty(lengths, *, max_len: int = 20480, cache_len: int = 4096) -> Array:
    """DAPO's soft overlong punishment, measured in tokens.

    R(y) = 0 if |y| <= max_len - cache_len; ((max_len - cache_len) - |y|) / cache_len
    inside the cache window; -1 beyond max_len. Add it to the task reward.

    Args:
      lengths: [N] completion lengths in tokens.
      max_len, cache_len: L_max and L_cache; 20480 and 4096 from the paper.

    Paper: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025).
    """
    check_rank("lengths", lengths, 1, "[N]")
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    lengths = jnp.asarray(lengths, jnp.float32)
    soft_start = max_len - cache_len
    penalty = (soft_start - lengths) / cache_len
    return jnp.where(lengths <= soft_start, 0.0, jnp.where(lengths <= max_len, penalty, -1.0))


@register("selection", "dynamic_sampling_filter", paper=_DAPO,
          ranges={"atol": (">= 0", "the spread of rewards up to which a group counts as all-equal")})
def dynamic_sampling_filter(rewards, group_ids, *, num_groups: int, valid=None, atol: float = 0.0) -> Array:
    """DAPO's dynamic sampling: keep groups whose raw rewards are not all equal.

    A group whose valid rows all have the same reward (all right or all wrong)
    gives zero advantage and no gradient; DAPO drops it and samples more. Use
    the raw correctness (before shaping) as `rewards`.

    keep_i = valid_i and (max_g r - min_g r > atol), max and min over the valid
    rows of i's group.

    Returns:
      bool[N]: True for valid rows of groups with at least two distinct rewards.

    Paper: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    spread = segments.max(rewards, group_ids, num_groups, valid) - segments.min(rewards, group_ids, num_groups, valid)
    keep_group = jnp.isfinite(spread) & (spread > atol)
    return valid & segments.gather(keep_group, group_ids)
