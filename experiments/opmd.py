"""OPMD: online policy mirror descent, its baseline and its regularized loss."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "opmd"
    c.loss = "opmd"
    c.run_dir = "runs/opmd"
    return c
