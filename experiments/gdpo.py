"""GDPO: two rewards (correctness and format), each normalized in its group, summed, then batch-normalized."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.rewards = {"correctness_reward": 1.0, "format_reward": 0.5}
    c.advantage = "gdpo"  # receives rewards [N, 2] and reward_weights [1.0, 0.5]
    c.loss = "ppo_clip"
    c.aggregation = "seq_mean_token_mean"
    c.run_dir = "runs/gdpo"
    return c
