"""Scaf-GRPO on the main job: hints for the prompts whose samples all failed, from the concept to the steps.

Scaf-GRPO (Zhang et al., "Scaf-GRPO: Scaffolded Group Relative Policy Optimization for Enhancing LLM
Reasoning", 2025): after a stretch of independent learning, a prompt whose G samples are all wrong (a group
GRPO learns nothing from) is sampled again with a hint appended to its question, tier by tier (the arithmetic
task's `hints`: the order of operations, the first operation, the steps before the last), and the first correct
hinted sample replaces one of the group's. That sample trains on-policy with its hint in the prompt
(`jaxgrpo.train.guidance`); the held-out evaluation asks without hints. Metrics: `guidance_failed_groups`,
`guidance_solved_groups`, `guidance_mean_tier` per step.

    jaxgrpo-train experiments/scaf_grpo.py
"""

import os

from jaxgrpo.config import Config, GuidanceConfig, load_experiment

QUICKSTART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py")


def config() -> Config:
    c = load_experiment(QUICKSTART)  # its model, task, GRPO recipe, batch and learning-rate schedule
    c.guidance = GuidanceConfig(after_step=5, attempts=2)  # the paper guides after ~15% of training
    c.run_dir = "runs/scaf_grpo"
    return c
