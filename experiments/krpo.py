"""KRPO: a scalar Kalman filter over each group's rewards gives the baseline and the scale."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "krpo"
    c.run_dir = "runs/krpo"
    return c
