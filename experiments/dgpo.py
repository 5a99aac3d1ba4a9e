"""DGPO (MathForge): mean-absolute-deviation group scaling and difficulty-aware question weights."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "dgpo"
    c.row_weights = "dgpo_question_weights"  # w_q = N_valid softmax_q(-accuracy / T)
    c.run_dir = "runs/dgpo"
    return c
