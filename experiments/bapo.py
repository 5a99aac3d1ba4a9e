"""BAPO: ratio bounds searched each step to balance positive and negative contributions."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.loss = "bapo"
    c.run_dir = "runs/bapo"
    return c
