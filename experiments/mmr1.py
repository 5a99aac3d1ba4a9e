"""MMR1 variance-aware sampling weights on prompt groups (OVS = p(1 - p))."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.row_weights = "mmr1_vas_weights"
    c.run_dir = "runs/mmr1"
    return c
