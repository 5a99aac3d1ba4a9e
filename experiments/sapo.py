"""SAPO: a soft sigmoid gate on the ratio instead of a hard clip."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.loss = "sapo"
    c.run_dir = "runs/sapo"
    return c
