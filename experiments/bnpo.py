"""BNPO: advantages normalized by a Beta density fitted over the batch's per-prompt success rates."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "bnpo"
    c.loss = "ppo_clip"
    c.aggregation = "seq_mean_token_mean"
    c.run_dir = "runs/bnpo"
    return c
