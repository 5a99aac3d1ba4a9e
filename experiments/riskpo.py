"""RiskPO: mixed value-at-risk advantages over bundles of questions (the task's examples carry 'bundle_id')."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "riskpo"
    c.run_dir = "runs/riskpo"
    return c
