"""Titles (and years) of the papers that kernels in more than one module cite, each written once.

A kernel registers its paper with `register(..., paper=...)`; where the kernels of one paper live in several
modules (an advantage here, its loss there), they name it from here.
"""

ADAPTTHINK = "AdaptThink: Reasoning Models Can Learn When to Think (2025)"
AEPO = "Arbitrary Entropy Policy Optimization: Entropy Is Controllable in Reinforcement Fine-tuning (2025)"
A_GRAE = "Unveiling Implicit Advantage Symmetry: Why GRPO Struggles with Exploration and Difficulty Adaptation (2026)"
BAPO = (
    "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy Optimization with Adaptive Clipping (2025)"
)
CONCISER = "Walk Before You Run! Concise LLM Reasoning via Reinforcement Learning (2025)"
CRITIQUE_GRPO = "Critique-GRPO: Advancing LLM Reasoning with Natural Language and Numerical Feedback (2025)"
DAPO = "DAPO: An Open-Source LLM Reinforcement Learning System at Scale (2025)"
DGPO = (
    "Harder Is Better: Boosting Mathematical Reasoning via Difficulty-Aware GRPO and Multi-Aspect Question Reformulation (2026)"
)
DHPO = "Orchestrating Tokens and Sequences: Dynamic Hybrid Policy Optimization for RLVR (2026)"
DISCO = "DisCO: Reinforcing Large Reasoning Models with Discriminative Constrained Optimization (2025)"
ETR = "ETR: Outcome-Guided Elastic Trust Regions for Policy Optimization (2026)"
GRPO_CARE = "GRPO-CARE: Consistency-Aware Reinforcement Learning for Multimodal Reasoning (2025)"
GRPO_LAMBDA = "Stable Reinforcement Learning for Efficient Reasoning (2025)"
GRPO_VPS = (
    "GRPO-VPS: Enhancing Group Relative Policy Optimization with Verifiable Process Supervision for Effective Reasoning (2026)"
)
HAPO = "From Uniform to Heterogeneous: Tailoring Policy Optimization to Every Token's Nature (2025)"
MC_GRPO = "MC-GRPO: Median-Centered Group Relative Policy Optimization for Small-Rollout Reinforcement Learning (2026)"
OFF_POLICY_REINFORCE = (
    "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some Myths About GRPO and Its Friends (2025)"
)
PREF_GRPO = "Pref-GRPO: Pairwise Preference Reward-based GRPO for Stable Text-to-Image Reinforcement Learning (2025)"
PURE = "Stop Summation: Min-Form Credit Assignment Is All Process Reward Model Needs for Reasoning (2025)"
RANK_GRPO = "Rank-GRPO: Training LLM-based Conversational Recommender Systems with Reinforcement Learning (2025)"
SAPO = "Soft Adaptive Policy Optimization (2025)"
SEGMENT_PO = (
    "Segment Policy Optimization: Effective Segment-Level Credit Assignment in RL for Large Language Models (2025); GRPO-VPS (2025)"
)
SPO = "Single-stream Policy Optimization (2025)"
S_GRPO = "S-GRPO: Early Exit via Reinforcement Learning in Reasoning Models (2025)"
THINKLESS = "Thinkless: LLM Learns When to Think (2025)"
TRAPO = "TraPO: A Semi-Supervised Reinforcement Learning Framework for Boosting LLM Reasoning (2025)"
TRUNCATED_IMPORTANCE_SAMPLING = (
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training, Yao et al. (2025)"
)
TW_GRPO = "Reinforcing Video Reasoning with Focused Thinking (2025)"
T_PPO = "Truncated Proximal Policy Optimization (2025)"
VESPO = "VESPO: Variational Sequence-Level Soft Policy Optimization for Stable Off-Policy LLM Training (2026)"
