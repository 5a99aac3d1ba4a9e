"""REINFORCE++ (Hu, 2025) without a group baseline: every completion token's reward whitened over the batch.

experiments/reinforce_pp.py is the baseline variant (the group mean removed first). The paper folds a
k1 KL penalty into the reward; the trainer adds the KL as a loss term instead, with verl's coefficient.
"""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "reinforce_pp"
    c.advantage_kwargs = {"whiten": "tokens"}  # the trainer passes each row's completion length
    c.loss = "ppo_clip"
    c.loss_kwargs = {"eps_low": 0.2, "clip_ratio_c": 3.0}  # verl's dual clip
    c.aggregation = "token_mean"
    c.kl_coef, c.kl_kind = 0.001, "k3"
    c.run_dir = "runs/reinforce_pp_no_baseline"
    return c
