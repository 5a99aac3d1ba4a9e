"""GHPO-style guidance on the main job: a prompt whose samples all failed is sampled again, as a whole group, with a hint.

GHPO (Liu et al., "GHPO: Adaptive Guidance for Stable and Efficient LLM Reinforcement Learning", 2025) refines
the prompts the policy cannot solve yet with part of the reference solution, and trains pure RL on the others.
Here the arithmetic task's tiers of hints (`ArithmeticTask.hints`: the order of operations, the first operation,
the steps before the last) stand for growing parts of the solution: the group is sampled again with each tier
in turn, and the first hinted group with a correct sample trains in place of the failed one
(`guidance.replace="group"`, `jaxgrpo.train.guidance`). The held-out evaluation asks without hints.

    jaxgrpo-train experiments/ghpo.py
"""

import os

from jaxgrpo.config import Config, GuidanceConfig, load_experiment

QUICKSTART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py")


def config() -> Config:
    c = load_experiment(QUICKSTART)  # its model, task, GRPO recipe, batch and learning-rate schedule
    c.guidance = GuidanceConfig(replace="group")  # from the first step: guidance is by difficulty, not by stage
    c.run_dir = "runs/ghpo"
    return c
