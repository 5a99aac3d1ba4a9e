"""RLOO (Ahmadian et al., 2024): leave-one-out baseline."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "rloo"
    c.loss = "ppo_clip"
    c.aggregation = "seq_mean_token_mean"
    c.run_dir = "runs/rloo"
    return c
