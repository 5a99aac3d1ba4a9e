"""Stratified GRPO (SAN): normalization inside strata (the task's examples carry 'strata_id')."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "stratified_grpo"
    c.advantage_kwargs = {"num_strata": 2, "blend": 1.0}
    c.run_dir = "runs/stratified_grpo"
    return c
