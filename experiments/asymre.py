"""AsymRE: REINFORCE with a baseline shifted below the group mean."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "asymre"
    c.loss = "reinforce"
    c.run_dir = "runs/asymre"
    return c
