"""REC: off-policy group REINFORCE, tokens outside the ratio range masked (no importance sampling)."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.loss = "rec"
    c.loss_kwargs = {"clip_mode": "one_sided", "eps_low": 0.2, "eps_high": 0.2}
    c.run_dir = "runs/rec"
    return c
