"""HAPO: token-level group statistics and entropy-adaptive clipping."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "hapo"
    c.loss = "hapo_clip"
    c.run_dir = "runs/hapo"
    return c
