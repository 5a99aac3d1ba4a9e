"""NGRPO: a virtual max-reward sample in each group (all-wrong groups still learn) and asymmetric clipping."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "ngrpo"
    c.advantage_kwargs = {"r_max": 1.0}
    c.loss = "ppo_clip"
    c.loss_kwargs = {"eps_low": 0.16, "eps_high": 0.24}  # the authors' script
    c.aggregation = "seq_mean_token_mean"
    c.kl_coef = 0.0
    c.run_dir = "runs/ngrpo"
    return c
