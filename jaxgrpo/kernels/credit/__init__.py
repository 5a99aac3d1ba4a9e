"""Token credit: per-token advantages, returns and weights (kinds "token_advantage" and "credit").

    returns     kind "token_advantage": discounted returns, REINFORCE++ returns, GAE, the optimal token
                baseline, T-PPO's extended GAE; `masked_whiten`
    assignment  kind "credit": TW-GRPO token weights, PURE min-form returns, Rank-GRPO per-rank advantages,
                segment advantages, GRPO-VPS probe progress
    importance  kind "credit": importance weights of a sampler/trainer mismatch (TIS, MIS)

This package re-exports every kernel and helper of its modules, so `from jaxgrpo.kernels.credit import gae`
works for each. Arrays are [N, T] with a token mask (Rank-GRPO: [N, K] per rank); masked-out inputs are
replaced by 0 before any arithmetic, so NaN or inf there reaches neither the outputs nor the gradients.
"""

from __future__ import annotations

from jaxgrpo.kernels.credit.assignment import (
    _PURE,
    _RANK_GRPO,
    _SEGMENT,
    _TW_GRPO,
    _rank_one_hot,
    grpo_vps_progress,
    minmax_token_weights,
    pure_min_form,
    rank_grpo,
    rank_level_ratio,
    rank_rewards,
    rank_token_values,
    segment_advantages,
    tw_grpo_weights,
)
from jaxgrpo.kernels.credit.importance import importance_correction
from jaxgrpo.kernels.credit.returns import (
    GAMMA,
    LAMBDA,
    discounted_returns,
    gae,
    masked_whiten,
    optimal_token_baseline,
    reinforce_pp_returns,
    t_ppo_egae,
)

__all__ = [
    "GAMMA",
    "LAMBDA",
    "_PURE",
    "_RANK_GRPO",
    "_SEGMENT",
    "_TW_GRPO",
    "_rank_one_hot",
    "discounted_returns",
    "gae",
    "grpo_vps_progress",
    "importance_correction",
    "masked_whiten",
    "minmax_token_weights",
    "optimal_token_baseline",
    "pure_min_form",
    "rank_grpo",
    "rank_level_ratio",
    "rank_rewards",
    "rank_token_values",
    "reinforce_pp_returns",
    "segment_advantages",
    "t_ppo_egae",
    "tw_grpo_weights",
]
