"""PPO with a value head and GAE (verl's defaults: gamma = lambda = 1, value clip 0.2, dual clip 3)."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "gae"  # advantages from GAE over a value head, whitened over the batch
    c.advantage_kwargs = {"gamma": 1.0, "lam": 1.0}
    c.value_coef = 0.5
    c.loss = "ppo_clip"
    c.loss_kwargs = {"eps_low": 0.2, "clip_ratio_c": 3.0}
    c.aggregation = "token_mean"
    c.group_size = 1
    c.prompts_per_step = 32
    c.run_dir = "runs/ppo"
    return c
