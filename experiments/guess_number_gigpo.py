"""The number game of experiments/guess_number.py trained with GiGPO: credit per guess, not only per episode.

GiGPO (Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training", 2025) adds to the episode-level
group advantage a step-level one: the turns of a prompt's episodes that act from the same environment state (an
"anchor": for this game, what the feedback so far has revealed, `GuessNumber.state()`) are compared by their
discounted returns from that turn (`environment.discount`). The advantage stage gets one row per policy turn
(`jaxgrpo.train.inputs.Steps`), and each turn's tokens train with its turn's advantage.

    jaxgrpo-train experiments/guess_number_gigpo.py
"""

import os

from jaxgrpo.config import Config, load_experiment

GUESS_NUMBER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guess_number.py")


def config() -> Config:
    c = load_experiment(GUESS_NUMBER)
    c.advantage = "gigpo"
    c.advantage_kwargs = {"step_weight": 1.0, "normalization": "mean_norm"}  # omega = 1, F = 1: the paper's defaults
    c.environment.discount = 0.95
    c.run_dir = "runs/guess_number_gigpo"
    return c
