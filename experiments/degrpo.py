"""DeGRPO (Thinkless): the mode token's loss weighted apart from the response's."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.loss = "degrpo"
    c.loss_kwargs = {"mode_token_weight": 1e-3}
    c.run_dir = "runs/degrpo"
    return c
