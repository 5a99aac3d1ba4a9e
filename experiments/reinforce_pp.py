"""REINFORCE++ with a group baseline (Hu, 2025), as verl's recipe: group mean removed, then whitening over tokens.

verl's PPO loss always applies the dual clip (c = 3) that `ppo_clip` leaves off by default, so this
port sets it, and verl's clamp of k3 (`low_var_kl`) at 10.
"""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.advantage = "reinforce_pp_baseline"
    c.advantage_kwargs = {"whiten": "tokens"}  # the trainer passes each row's completion length
    c.loss = "ppo_clip"
    c.loss_kwargs = {"eps_low": 0.2, "clip_ratio_c": 3.0}  # verl's dual clip
    c.aggregation = "token_mean"
    c.kl_coef, c.kl_kind = 0.001, "k3"
    c.kl_kwargs = {"clamp": 10.0}  # verl's k3 (low_var_kl) clamps the estimate to [-10, 10]
    c.run_dir = "runs/reinforce_pp"
    return c
