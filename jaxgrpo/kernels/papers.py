"""Titles (and years) of the papers that kernels in more than one module cite, each written once.

A kernel registers its paper with `register(..., paper=...)`; where the kernels of one paper live in several
modules (an advantage here, its loss there), they name it from here.
"""

DAPO = "DAPO: An Open-Source LLM Reinforcement Learning System at Scale (2025)"
DGPO = (
    "Harder Is Better: Boosting Mathematical Reasoning via Difficulty-Aware GRPO and Multi-Aspect Question Reformulation (2026)"
)
HAPO = "From Uniform to Heterogeneous: Tailoring Policy Optimization to Every Token's Nature (2025)"
MC_GRPO = "MC-GRPO: Median-Centered Group Relative Policy Optimization for Small-Rollout Reinforcement Learning (2026)"
OFF_POLICY_REINFORCE = (
    "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some Myths About GRPO and Its Friends (2025)"
)
SPO = "Single-stream Policy Optimization (2025)"
