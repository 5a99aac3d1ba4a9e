"""DisCO: a discriminative objective (logL score) with a KL trust region, no clipping."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.loss = "disco"
    c.loss_kwargs = {"score": "logL"}
    c.run_dir = "runs/disco"
    return c
