"""Dr. GRPO (Liu et al., 2025): no std normalization, constant length normalization, no KL."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "dr_grpo"  # r - mean_g
    c.loss = "ppo_clip"
    c.aggregation = "seq_mean_token_sum_norm"  # sum of token losses / (N * max_len)
    c.kl_coef = 0.0
    c.optimizer.lr = 1e-6
    c.run_dir = "runs/dr_grpo"
    return c
