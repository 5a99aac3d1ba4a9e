"""REINFORCE++ with a group baseline (Hu, 2025): group mean removed, then global-batch whitening."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "reinforce_pp_baseline"
    c.loss = "ppo_clip"
    c.aggregation = "token_mean"
    c.kl_coef, c.kl_kind = 0.001, "k3"
    c.run_dir = "runs/reinforce_pp"
    return c
