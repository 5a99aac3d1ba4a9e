"""GSPO (Zheng et al., 2025): clipping on the sequence-level geometric-mean ratio."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "grpo"
    c.loss = "gspo"
    c.loss_kwargs = {"eps_low": 3e-4, "eps_high": 4e-4}
    c.aggregation = "seq_mean_token_mean"
    c.num_minibatches = 2  # GSPO's ratio only departs from 1 off-policy: two updates per batch
    c.run_dir = "runs/gspo"
    return c
