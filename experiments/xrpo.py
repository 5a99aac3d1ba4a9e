"""XRPO sharpening: a bonus for correct completions the policy found unlikely."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "xrpo"
    c.run_dir = "runs/xrpo"
    return c
