"""DAPO (Yu et al., 2025): clip-higher, token-level loss, dynamic sampling, overlong shaping, no KL.

The authors' release (verl's DAPO recipe) also bounds the loss of negative-advantage tokens with the
dual clip at c = 10, which `ppo_clip` leaves off by default; this port sets it.
"""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "grpo"
    c.loss = "ppo_clip"
    c.loss_kwargs = {"eps_low": 0.2, "eps_high": 0.28, "clip_ratio_c": 10.0}  # clip-higher; verl recipe's dual clip
    c.aggregation = "token_mean"  # sum over all tokens / number of tokens
    c.group_filter = "dynamic_sampling_filter"  # drop all-right / all-wrong groups and sample more
    c.max_sampling_rounds = 3
    c.reward_penalty = "overlong_penalty"  # soft penalty in the last 32 tokens before sampling.max_new_tokens
    c.reward_penalty_kwargs = {"cache_len": 32}
    c.kl_coef = 0.0
    c.run_dir = "runs/dapo"
    return c
