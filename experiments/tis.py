"""GRPO with truncated importance sampling (TIS) between the trainer's and the sampler's log-probs."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.token_credit = "importance_correction"
    c.token_credit_kwargs = {"level": "token", "mode": "truncate", "threshold": 2.0}
    c.run_dir = "runs/tis"
    return c
