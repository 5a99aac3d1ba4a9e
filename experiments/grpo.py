"""GRPO (DeepSeekMath, 2024): group-normalized advantages, token-ratio clipping, k3 KL to the reference."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "grpo"  # (r - mean_g) / (std_g + eps)
    c.loss = "ppo_clip"
    c.loss_kwargs = {"eps_low": 0.2}
    c.aggregation = "seq_mean_token_mean"
    c.kl_coef, c.kl_kind = 0.04, "k3"  # the paper's beta
    c.optimizer.lr = 1e-6
    c.run_dir = "runs/grpo"
    return c
