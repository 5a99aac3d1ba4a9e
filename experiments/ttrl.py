"""Label-free GRPO (TTRL / MM-UPT): the main job's recipe rewarded by the majority answer of each prompt's samples.

Test-time reinforcement learning (Zuo et al., "TTRL: Test-Time Reinforcement Learning", 2025) and MM-UPT (Wei et
al., 2025) train without labels: the answer most of a prompt's G completions state is taken as its label, and a
completion is rewarded 1 when it agrees (`jaxgrpo.rewards.majority_vote_reward`, which never reads the examples'
answers). The format reward of the main job stays, and `correctness_reward` is kept with weight 0: it trains
nothing and still measures accuracy against the labels (`reward/correctness_reward`, held-out accuracy).

    jaxgrpo-train experiments/ttrl.py
"""

import os

from jaxgrpo.config import Config, load_experiment
from jaxgrpo.data.tasks import FORMAT_REWARD_WEIGHT

QUICKSTART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py")


def config() -> Config:
    c = load_experiment(QUICKSTART)  # its model, task, GRPO recipe, batch and learning-rate schedule
    c.rewards = {"majority_vote_reward": 1.0, "format_reward": FORMAT_REWARD_WEIGHT, "correctness_reward": 0.0}
    c.run_dir = "runs/ttrl"
    return c
