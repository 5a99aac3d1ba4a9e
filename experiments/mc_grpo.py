"""MC-GRPO: median baseline with a MAD scale over G+1 samples; the median (pivot) sample is left out of the loss."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.group_size = 9  # G + 1 with G = 8, so the median is one of the samples
    c.advantage = "mc_grpo"
    c.loss_mask = "mc_grpo_pivot_mask"
    c.loss = "ppo_clip"
    c.aggregation = "seq_mean_token_mean"
    c.kl_coef = 0.04
    c.run_dir = "runs/mc_grpo"
    return c
