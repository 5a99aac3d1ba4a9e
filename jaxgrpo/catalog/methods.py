"""The status of every method of the GRPO-family method catalog in jaxgrpo: the source of `docs/methods.md`.

Each entry says whether a method is a **kernel** (the registry names that
implement it; rendered "kernel" only when every one of them runs from an experiment, else "kernel,
not in the loop" with the reason its registration declares), **built in** (implemented by the model or the trainer rather
than as a kernel: where, and how to turn it on), **needs rollout support**
(which part of the system beyond the kernels it needs), or is
**out of scope** (and why).
`tests/catalog/test_method_catalog.py` checks that every method of the catalog is
listed, that every registry name cited exists, and that `docs/methods.md` is
up to date. Regenerate the document with::

    python -m jaxgrpo.catalog.methods
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

KERNEL = "kernel"
BUILT_IN = "built in"
ROLLOUT = "needs rollout support"
OUT = "out of scope"
STATUSES = (KERNEL, BUILT_IN, ROLLOUT, OUT)
#: The rendered status of a KERNEL method one of whose kernels declares why it cannot run in the loop.
KERNEL_NOT_IN_LOOP = "kernel, not in the loop"

CATEGORIES = {
    "A": "Advantage estimators / group normalization",
    "B": "Policy loss, clipping, trust region",
    "C": "KL and regularizers",
    "D": "Token/segment credit assignment and weighting",
    "E": "Sampling, filtering, curriculum, budget allocation",
    "F": "Reward shaping (length, format, consistency, pairwise, process)",
    "G": "Rollout structure (multi-turn, tree/branch, shared prefix, early exit, hints)",
    "H": "Other (diffusion/flow, preference, misc.)",
}

# The capabilities beyond the kernels that a method needs.
SAMPLER = "sampler"
TRAINER = "trainer loop"
REWARDS = "tasks and rewards"
MODEL = "policy model"
ENV = "multi-turn / tool-use environment"

# Reasons for leaving a method out.
DIFFUSION = "diffusion or flow-matching generative models; jaxgrpo trains autoregressive language models"
MULTIMODAL = "needs a vision-language (image/video/GUI) policy; jaxgrpo's policies are text-only"
LEARNED_RM = "needs a learned reward, judge or process-reward model, which jaxgrpo does not ship"
ABSTRACT_ONLY = (
    "abstract-only description without a formula to check; "
    "write it as a user kernel with jaxgrpo.register when the rule is known"
)
EXTRA_MODELS = "trains or queries several models (teachers, companions, hinters); jaxgrpo trains one policy"
OFFLINE = "offline preference optimization, not online RL with rollouts"


class Method(NamedTuple):
    """One catalog method and its status in jaxgrpo.

    name: the method's name as in the catalog.
    title: the beginning of its paper's title.
    category: the §1 category letter (A-H).
    status: KERNEL, BUILT_IN, ROLLOUT or OUT.
    kernels: registry names that implement it (or the parts that are kernels).
    note: for BUILT_IN where it lives and how to turn it on, for ROLLOUT the area it needs, for OUT
      the reason, for KERNEL how the kernels compose.
    bold: whether the catalog describes it in full (a bold entry).
    """

    name: str
    title: str
    category: str
    status: str
    kernels: tuple[str, ...] = ()
    note: str = ""
    bold: bool = False


def _k(name, title, cat, kernels, note="", bold=False):
    return Method(name, title, cat, KERNEL, tuple(kernels), note, bold)


def _b(name, title, cat, where, kernels=(), bold=False):
    return Method(name, title, cat, BUILT_IN, tuple(kernels), where, bold)


def _r(name, title, cat, area, kernels=(), bold=False):
    return Method(name, title, cat, ROLLOUT, tuple(kernels), area, bold)


def _o(name, title, cat, reason, kernels=(), bold=False):
    return Method(name, title, cat, OUT, tuple(kernels), reason, bold)


#: The catalog's baselines (GRPO and its direct variants, CISPO, and KRPO, which the catalog adds
#: although it is not one of its papers). `functions` are public functions of `jaxgrpo.kernels`
#: that are not registry entries (aggregation modes and the value loss).
class Baseline(NamedTuple):
    name: str
    kernels: tuple[str, ...]
    functions: tuple[str, ...]
    note: str


BASELINES: tuple[Baseline, ...] = (
    Baseline("GRPO", ("grpo", "ppo_clip", "k3"), ("aggregate",), "seq_mean_token_mean aggregation; KL penalty k3 (low_var_kl)"),
    Baseline("Dr. GRPO", ("dr_grpo", "ppo_clip"), ("aggregate",), "seq_mean_token_sum_norm aggregation (constant G·L_max), no KL"),
    Baseline(
        "DAPO",
        ("ppo_clip", "dynamic_sampling_filter", "overlong_penalty"),
        ("aggregate",),
        "ppo_clip with eps_low=0.2, eps_high=0.28; token_mean aggregation; dynamic sampling and overlong shaping",
    ),
    Baseline("GSPO", ("gspo", "gspo_token"), ("aggregate",), "sequence-ratio clipping eps 3e-4/4e-4; seq_mean_token_mean"),
    Baseline("RLOO", ("rloo",), (), "leave-one-out baseline"),
    Baseline(
        "REINFORCE++",
        ("reinforce_pp", "reinforce_pp_baseline", "reinforce_pp_returns"),
        (),
        "global-batch whitening; the baseline variant subtracts the group mean first",
    ),
    Baseline("PPO + GAE", ("gae", "ppo_clip"), ("clipped_value_loss", "masked_whiten"), "value head in the trainer; dual clip c=3"),
    Baseline("CISPO", ("cispo",), (), "clipped stop-gradient importance weight, eps_high=5"),
    Baseline("KRPO", ("krpo",), (), "Kalman-filtered group baseline (not a catalog paper)"),
)


METHODS: tuple[Method, ...] = (
    # ------------------------------------------------------------------ A
    _k("MC-GRPO", "MC-GRPO: Median-Centered Group Relative Policy Optimization for", "A", ("mc_grpo", "mc_grpo_pivot_mask"), "multiply the loss mask by mc_grpo_pivot_mask", bold=True),
    _k("BNPO", "BNPO: Beta Normalization Policy Optimization", "A", ("bnpo",), bold=True),
    _k("GDPO", "GDPO: Group reward-Decoupled Normalization Policy Optimization for", "A", ("gdpo",), "takes rewards f32[N, K]", bold=True),
    _k("NGRPO", "NGRPO: Negative-enhanced Group Relative Policy Optimization", "A", ("ngrpo", "ppo_clip"), "ppo_clip with eps_low=0.16, eps_high=0.24", bold=True),
    _k("DGPO (MathForge)", "Harder Is Better: Boosting Mathematical Reasoning via Difficulty-Aware", "A", ("dgpo", "dgpo_question_weights"), bold=True),
    _k("Stratified GRPO (SAN)", "Stratified GRPO: Handling Structural Heterogeneity in Reinforcement", "A", ("stratified_grpo",), "strata ids (e.g. number of search calls) from the rollout", bold=True),
    _k("SEED-GRPO", "SEED-GRPO: Semantic Entropy Enhanced GRPO for Uncertainty-Aware Policy", "A", ("seed_grpo",), "answer cluster ids from the reward side", bold=True),
    _k("GiGPO", "Group-in-Group Policy Optimization for LLM Agent Training", "A", ("gigpo",), "an environment run provides the anchor states and step returns: experiments/guess_number_gigpo.py", bold=True),
    _k("RiskPO", "RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM", "A", ("riskpo",), bold=True),
    _k("XRPO", "XRPO: Pushing the limits of GRPO with Targeted Exploration and", "A", ("xrpo",), f"advantage sharpening only; the rollout allocator and in-context seeding need the {SAMPLER}", bold=True),
    _k("SPO (single-stream)", "Single-stream Policy Optimization", "A", ("experimental/spo_value_tracker", "experimental/spo_priority", "experimental/spo_advantage"), "experimental reconstruction; value_tracker=experimental/spo_value_tracker keeps the tracker's state in the train state and provides spo_advantage's baseline", bold=True),
    _k("A-GRAE", "Unveiling Implicit Advantage Symmetry: Why GRPO", "A", ("experimental/a_grae",), "experimental reconstruction"),
    _o("ADORA", "ADORA: Training Reasoning Models with Dynamic", "A", ABSTRACT_ONLY),
    _r("ASPO", "Understanding Tool-Integrated Reasoning", "A", ENV),
    _o("DRPO", "DRPO: Efficient Reasoning via Decoupled Reward", "A", ABSTRACT_ONLY),
    _o("COPO", "COPO: Consistency-Aware Policy Optimization", "A", ABSTRACT_ONLY),
    _o("MSSR", "Stable and Efficient Single-Rollout RL for", "A", ABSTRACT_ONLY + "; the nearest kernel is experimental/spo_advantage", ("experimental/spo_advantage",)),
    _r("Weighted GRPO + pos/neg pairing", "Beyond Variance: Prompt-Efficient RLVR via", "A", f"{TRAINER}: minibatches built from one hard and one easy prompt; the pair reweighting is unverified"),
    _o("Pair-GPRO", "PairUni: Pairwise Training for Unified Multimodal", "A", MULTIMODAL),
    _o("SRPO (GREAM)", "Generative Reasoning Recommendation via LLMs", "A", "generative recommendation with a residual-sensitive reward; formula unverified"),
    _o("G²RPO (Gaussian GRPO)", "OpenVLThinkerV2: A Generalist Multimodal", "A", MULTIMODAL),
    _o("VGPO", "Anchoring Values in Temporal and Group Dimensions", "A", DIFFUSION),
    _o("FGRPO", "Faithful GRPO: Improving Visual Spatial Reasoning", "A", MULTIMODAL),
    _o("REAL", "Rewards as Labels: Revisiting RLVR from a", "A", ABSTRACT_ONLY),
    _o("LOOP (diffusion)", "A Simple and Effective Reinforcement Learning", "A", DIFFUSION + "; its language-model analogue is rloo + ppo_clip", ("rloo", "ppo_clip")),
    _k("LOOP (AppWorld)", "Reinforcement Learning for Long-Horizon", "A", ("rloo", "ppo_clip"), f"value-free PPO with a leave-one-out baseline; AppWorld itself needs a {ENV}"),
    # ------------------------------------------------------------------ B
    _k("SAPO", "Soft Adaptive Policy Optimization", "B", ("sapo",), "seq_mean_token_mean aggregation", bold=True),
    _k("BAPO", "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via", "B", ("bapo",), bold=True),
    _k("DisCO", "DisCO: Reinforcing Large Reasoning Models with Discriminative", "B", ("disco",), bold=True),
    _k("NGRPO asym. clip", "NGRPO: Negative-enhanced Group Relative Policy Optimization", "B", ("ppo_clip",), "eps_low=0.16, eps_high=0.24", bold=True),
    _k("REC / OPMD / AsymRE", "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm:", "B", ("rec", "opmd", "asymre"), bold=True),
    _k("DeGRPO (Thinkless)", "Thinkless: LLM Learns When to Think", "B", ("degrpo",), bold=True),
    _k("AdaptThink", "AdaptThink: Reasoning Models Can Learn When to Think", "B", ("adaptthink_reward", "ppo_clip"), f"forcing 50% NoThinking first tokens needs the {SAMPLER}", bold=True),
    _k("ETR", "ETR: Outcome-Guided Elastic Trust Regions for", "B", ("experimental/etr_clip",), "experimental reconstruction"),
    _k("DHPO", "Orchestrating Tokens and Sequences: Dynamic", "B", ("experimental/dhpo",), "experimental reconstruction"),
    _o("R²VPO", "Ratio-Variance Regularized Policy Optimization", "B", ABSTRACT_ONLY),
    _r("ReMix", "Squeeze the Soaked Sponge: Efficient Off-policy", "B", f"{TRAINER}: off-policy replay, update-to-data ratio and the on-policy switch", ("importance_correction",)),
    _o("Reg-GRPO", "DeepVideo-R1: Video Reinforcement Fine-Tuning via", "B", MULTIMODAL + "; exact loss unverified"),
    _o("GRAO", "Learning to Align, Aligning to Learn: A Unified", "B", ABSTRACT_ONLY),
    _o("NFT", "Bridging Supervised Learning and Reinforcement", "B", ABSTRACT_ONLY),
    _o("CoPG", "Contrastive Policy Gradient: Aligning LLMs on", "B", OFFLINE),
    _o("CGPO", "The Perfect Blend: Redefining RLHF with Mixture", "B", LEARNED_RM),
    _r("AHPO", "MM-HELIX: Boosting Multimodal Long-Chain", "B", f"{TRAINER}: switching between SFT on expert data and RL"),
    _r("TAPO", "Tool-Augmented Policy Optimization: Synergizing", "B", ENV, ("ppo_clip", "dynamic_sampling_filter", "overlong_penalty")),
    # ------------------------------------------------------------------ C
    _r("GRPO-D", "OThink-MR1: Stimulating multimodal generalized", "C", f"{TRAINER}: a schedule for the KL coefficient (the KL estimators are kernels)", ("k3",)),
    _o("LLDS", "On GRPO Collapse in Search-R1: The Lazy", "C", ABSTRACT_ONLY),
    _o("PAPO", "Perception-Aware Policy Optimization for", "C", MULTIMODAL),
    _k("AEPO (arbitrary entropy)", "Arbitrary Entropy Policy Optimization: Entropy Is", "C", ("experimental/aepo_entropy",), f"experimental reconstruction; tempered samples come from the {SAMPLER}, the temperature controller (aepo_temperature_update) runs in the {TRAINER}"),
    _r("KDRL", "KDRL: Post-Training Reasoning LLMs via Unified", "C", f"{TRAINER}: a teacher model's log-probs for the reverse-KL term", ("k1", "k3")),
    _r("1-shot RLVR", "Reinforcement Learning for Reasoning in Large", "C", f"{TRAINER}: the entropy loss from entropy_from_logits and one-example data"),
    _o("RPO", "Provably Mitigating Overoptimization in RLHF:", "C", OFFLINE),
    _o("A²GRPO", "GeoZero: Incentivizing Reasoning from Scratch on", "C", MULTIMODAL),
    # ------------------------------------------------------------------ D
    _k("SPO (segment)", "Segment Policy Optimization: Effective Segment-Level Credit Assignment", "D", ("segment_advantages",), f"Monte-Carlo segment values from cutpoint or tree rollouts need the {SAMPLER}", bold=True),
    _k("GRPO-VPS", "GRPO-VPS: Enhancing Group Relative Policy Optimization with Verifiable", "D", ("segment_advantages", "experimental/grpo_vps_progress"), f"experimental combination; probe probabilities need the {SAMPLER}", bold=True),
    _o("CAPO (credit)", "CAPO: Towards Enhancing LLM Reasoning through Verifiable Generative", "D", LEARNED_RM + " (an LLM used as a generative process-reward model)", bold=True),
    _k("PURE", "Stop Summation: Min-Form Credit Assignment Is All Process Reward Model", "D", ("pure_min_form",), "step rewards come from a process-reward model, which jaxgrpo does not ship", bold=True),
    _k("TW-GRPO", "Reinforcing Video Reasoning with Focused Thinking", "D", ("tw_grpo_weights",), bold=True),
    _k("HAPO", "From Uniform to Heterogeneous: Tailoring Policy Optimization to Every", "D", ("hapo", "hapo_clip"), bold=True),
    _k("Rank-GRPO", "Rank-GRPO: Training LLM-based Conversational Recommender Systems with", "D", ("rank_grpo",), bold=True),
    _o("HICRA", "Emergent Hierarchical Reasoning in LLMs through", "D", ABSTRACT_ONLY),
    _o("D³S", "Learning More with Less: A Dynamic Dual-Level", "D", ABSTRACT_ONLY),
    _o("OPRL", "Online Process Reward Leanring for Agentic", "D", LEARNED_RM + " (an implicit PRM trained alongside the policy)"),
    _r("MatchTIR", "MatchTIR: Fine-Grained Supervision for", "D", ENV),
    _o("ProRAG", "ProRAG: Process-Supervised Reinforcement Learning", "D", LEARNED_RM),
    _r("IGPO", "Information Gain-based Policy Optimization: A", "D", f"{ENV}: per-turn answer probabilities (the scatter into tokens is a kernel)", ("segment_advantages",)),
    _o("TP-GRPO", "Good Learners Think Their Thinking: Generative", "D", LEARNED_RM),
    _o("Implicit PRM", "Free Process Rewards without Process Labels", "D", LEARNED_RM),
    _o("PRM Clip / Delta", "On Designing Effective RL Reward at Training Time", "D", LEARNED_RM),
    _r("POAD (BAD)", "Reinforcing Language Agents via Policy", "D", f"{ENV} and a token-level critic"),
    _r("R³L", "R^3L: Reflect-then-Retry Reinforcement Learning", "D", f"{SAMPLER}: retries from the shared prefix of a failed trajectory"),
    _o("DaGRPO", "DaGRPO: Rectifying Gradient Conflict in Reasoning", "D", ABSTRACT_ONLY),
    _o("Graph-GRPO", "Graph-GRPO: Stabilizing Multi-Agent Topology", "D", "optimizes multi-agent communication graphs, not a language-model policy"),
    _r("Step-GRPO (R1-Router)", "Learning to Route Queries Across Knowledge Bases", "D", ENV),
    _o("GCPO", "GeometryZero: Improving Geometry Solving for LLM", "D", ABSTRACT_ONLY),
    _o("CAPO (curvature)", "Stabilizing Policy Gradients for Sample-Efficient", "D", ABSTRACT_ONLY),
    # ------------------------------------------------------------------ E
    _k("Knapsack RL", "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget", "E", ("knapsack_allocation",), f"the per-prompt rollout counts are consumed by the {SAMPLER}", bold=True),
    _k("MMR1 VAS", "MMR1: Enhancing Multimodal Reasoning with Variance-Aware Sampling and", "E", ("mmr1_vas_weights",), bold=True),
    _r("Balanced online difficulty filtering", "Online Difficulty Filtering for Reasoning Oriented Reinforcement", "E", f"{TRAINER}: keep prompts of intermediate accuracy and resample", ("dynamic_sampling_filter",), bold=True),
    _k("DUMP", "DUMP: Automated Distribution-Level Curriculum Learning for RL-based LLM", "E", ("dump_ucb_weights",), bold=True),
    _k("TraPO", "TraPO: A Semi-Supervised Reinforcement Learning Framework for Boosting", "E", ("experimental/trapo_selection",), f"majority-vote pseudo-labels of unlabeled prompts come from the {REWARDS}", bold=True),
    _r("GAIN-RL", "Angles Don't Lie: Unlocking Training-Efficient RL", "E", f"{MODEL} hidden states and {TRAINER} data selection"),
    _r("CLPO", "CLPO: Curriculum Learning meets Policy", "E", f"{TRAINER}: the policy rewrites medium and hard problems"),
    _o("V₀", "V_0: A Generalist Value Model for Any Policy at", "E", LEARNED_RM + " (a generalist value model)"),
    _o("Temporal-R1", "Reinforcement Learning Tuning for VideoLLMs:", "E", MULTIMODAL),
    _o("ARPO (GUI)", "ARPO:End-to-End Policy Optimization for GUI", "E", MULTIMODAL),
    _r("SSR + Forced Rethinking", "VL-Rethinker: Incentivizing Self-Reflection of", "E", f"{TRAINER}: replay of non-zero-advantage samples; {SAMPLER}: rethinking trigger"),
    _o("CRAFT-GUI", "CRAFT-GUI: Curriculum-Reinforced Agent For GUI", "E", MULTIMODAL),
    _r("GRPO-ATS", "Thyme: Think Beyond Images", "E", f"{SAMPLER}: different temperatures for text and code tokens"),
    _r("APO (A²FM)", "A^2FM: An Adaptive Agent Foundation Model for", "E", ENV),
    _r("DR-PO", "Dataset Reset Policy Optimization for RLHF", "E", f"{SAMPLER}: rollouts started from states of the offline dataset"),
    # ------------------------------------------------------------------ F
    _k("GRPO-λ", "Stable Reinforcement Learning for Efficient Reasoning", "F", ("experimental/grpo_lambda",), "experimental reconstruction", bold=True),
    _k("ConciseR (GRPO++ / L-GRPO)", "Walk Before You Run! Concise LLM Reasoning via Reinforcement Learning", "F", ("experimental/conciser_length_reward", "ppo_clip", "dynamic_sampling_filter"), "stage 1: clip-higher + dynamic sampling; stage 2: experimental length reward", bold=True),
    _r("Curriculum length budget", "Train Long, Think Short: Curriculum Learning for Efficient Reasoning", "F", f"{TRAINER}: a decaying token budget; {REWARDS}: length-efficiency reward", ("overlong_penalty",), bold=True),
    _r("HBPO", "Hierarchical Budget Policy Optimization for Adaptive Reasoning", "F", f"{SAMPLER}: sub-groups with different token budgets", bold=True),
    _r("ARES / AEPO", "ARES: Multimodal Adaptive Reasoning via Difficulty-Aware Token-Level", "F", f"{TRAINER}: per-difficulty KL coefficients by dual ascent; the windowed-entropy reward is not yet a kernel", bold=True),
    _k("GRPO-CARE", "GRPO-CARE: Consistency-Aware Reinforcement Learning for Multimodal", "F", ("grpo_care_bonus",), f"answer likelihoods under an EMA reference model come from the {TRAINER}", bold=True),
    _o("Trust-GRPO", "SophiaVL-R1: Reinforcing MLLMs Reasoning with Thinking Reward", "F", LEARNED_RM + " (a thinking-reward model)", bold=True),
    _k("Pref-GRPO", "Pref-GRPO: Pairwise Preference Reward-based GRPO for Stable", "F", ("pref_grpo_win_rate", "grpo"), "pairwise preferences come from a preference model, which jaxgrpo does not ship", bold=True),
    _r("TLDR", "Making Small Language Models Efficient Reasoners:", "F", f"{REWARDS}: multi-level length rewards"),
    _r("AutoThink", "Learning When to Think: Shaping Adaptive", "F", f"{SAMPLER}: ellipsis-prompted think/no-think rollouts; multi-stage rewards"),
    _r("ThinkDial", "ThinkDial: An Open Recipe for Controlling", "F", f"{TRAINER}: budget-mode SFT then budget-aware RL"),
    _o("Ada-GRPO (ARM)", "ARM: Adaptive Reasoning Model", "F", ABSTRACT_ONLY),
    _r("HGPO (LHRM)", "Think Only When You Need with Large", "F", f"{SAMPLER}: think and no-think responses per query"),
    _o("PixelThink", "PixelThink: Towards Efficient Chain-of-Pixel", "F", MULTIMODAL),
    _r("Format/length surrogate", "Surrogate Signals from Format and Length:", "F", f"{REWARDS}: format and length rewards"),
    _r("OTC-GRPO", "OTC: Optimal Tool Calls via Reinforcement Learning", "F", ENV),
    _r("G-RA", "Stabilizing Long-term Multi-turn Reinforcement", "F", ENV),
    _k("SPO (self-play, minimax winner)", "A Minimaximalist Approach to Reinforcement", "F", ("pref_grpo_win_rate",), "win proportion against same-policy samples; needs a preference judge"),
    _o("BRPO (Writing-Zero)", "Writing-Zero: Bridge the Gap Between", "F", LEARNED_RM),
    _o("Think-RM pairwise RLHF", "Think-RM: Enabling Long-Horizon Reasoning in", "F", LEARNED_RM),
    _o("Pairwise-RL", "A Unified Pairwise Framework for RLHF: Bridging", "F", LEARNED_RM),
    _o("SGRPO (supergroup)", "Pushing Biomolecular Utility-Diversity Frontiers", "F", "biomolecular design with a set-level diversity reward"),
    _r("Consistency GRPO", "Information-Consistent Language Model", "F", f"{REWARDS}: groups of equivalent prompt variants and entropy-based rewards"),
    _o("Listener-augmented GRPO", "Listener-Rewarded Thinking in VLMs for Image", "F", MULTIMODAL),
    _o("RLCCF", "Wisdom of the Crowd: Reinforcement Learning from", "F", EXTRA_MODELS),
    _r("SCOPE", "Beyond Majority Voting: Towards Fine-grained and", "F", f"{REWARDS}: confidence-weighted voting pseudo-labels"),
    _b("MM-UPT", "Unsupervised Post-Training for Multi-Modal LLM", "F",
       "the majority-vote reward of `jaxgrpo.rewards.consensus` (TTRL's too), "
       "`rewards={'majority_vote_reward': 1.0, ...}`: experiments/ttrl.py"),
    _r("EMPO", "Right Question is Already Half the Answer: Fully", "F", f"{REWARDS}: semantic clusters of answers as reward"),
    _o("RM-NLHF", "Reward Modeling from Natural Language Human", "F", LEARNED_RM),
    _o("S2J", "S2J: Bridging the Gap Between Solving and Judging", "F", LEARNED_RM),
    _o("RGR-GRPO", "Reward and Guidance through Rubrics: Promoting", "F", LEARNED_RM + " (a rubric judge)"),
    _o("WCO / UWO", "Reward Model Ensembles Help Mitigate", "F", LEARNED_RM),
    _o("MPO", "Toward Evaluative Thinking: Meta Policy", "F", LEARNED_RM),
    _o("CALM", "Assessing the Zero-Shot Capabilities of LLMs for", "F", LEARNED_RM + " (LLM-decomposed subgoals)"),
    _o("Multi-objective GRPO", "Optimizing Safe and Aligned Language Generation:", "F", LEARNED_RM + "; several rewards combine with gdpo", ("gdpo",)),
    _o("DeconfoundLM", "Aligning Language Models with Observational Data:", "F", LEARNED_RM),
    _r("Reasoning-SQL", "Reasoning-SQL: Reinforcement Learning with SQL", "F", f"{REWARDS}: SQL execution and schema-linking rewards"),
    _o("Mixed-R1 / BMAS", "Mixed-R1: Unified Reward Perspective For", "F", MULTIMODAL),
    _o("Atom-Searcher", "Atom-Searcher: Enhancing Agentic Deep Research", "F", LEARNED_RM + " and a search environment"),
    _r("GraphRAG-R1", "GraphRAG-R1: Graph Retrieval-Augmented Generation", "F", ENV),
    _o("PTA-GRPO", "Plan Then Action:High-Level Planning Guidance", "F", LEARNED_RM + " (plan-quality judge)"),
    _o("SRPO (reflection)", "SRPO: Enhancing Multimodal LLM Reasoning via", "F", MULTIMODAL),
    _r("DW-GRPO", "Deep GraphRAG: A Balanced Approach to", "F", f"{REWARDS}: dynamically weighted multi-objective reward", ("gdpo",)),
    _o("S-GRPO (GUI-Critic)", "Look Before You Leap: A GUI-Critic-R1 Model for", "F", MULTIMODAL),
    _o("GUI-G1", "GUI-G1: Understanding R1-Zero-Like Training for", "F", MULTIMODAL),
    _o("CapRL", "CapRL: Stimulating Dense Image Caption", "F", MULTIMODAL),
    _r("RetroAgent", "RetroAgent: From Solving to Evolving via", "F", ENV),
    _r("Dyna-GRPO", "Dyna-Mind: Learning to Simulate from Experience", "F", ENV),
    _r("Critique-RL", "Critique-RL: Training Language Models for", "F", f"{SAMPLER}: critique then refinement rollouts"),
    _o("HiLL", "Learning to Hint for Reinforcement Learning", "F", EXTRA_MODELS),
    _r("GroupRank", "GroupRank: A Groupwise Reranking Paradigm Driven", "F", f"{REWARDS}: ranking-metric and distributional rewards"),
    _o("PRLCoder", "Process-Supervised Reinforcement Learning for", "F", LEARNED_RM + " (line-level PRM)"),
    _r("HILA dual-loop", "Adaptive Collaboration with Humans: Metacognitive", "F", ENV),
    _o("RL-Text2Vis", "Aligning Text, Code, and Vision: A", "F", MULTIMODAL),
    _o("MM-Zero", "MM-Zero: Self-Evolving Multi-Model Vision", "F", MULTIMODAL),
    _o("GRPO-GR (GRIT)", "GRIT: Teaching MLLMs to Think with Images", "F", MULTIMODAL),
    _o("R-GRPO (VLM-R³)", "VLM-R^3: Region Recognition, Reasoning, and", "F", MULTIMODAL),
    _o("Ctrl-U", "Ctrl-U: Robust Conditional Image Generation via", "F", DIFFUSION),
    _o("VLAA-Thinker", "SFT or RL? An Early Investigation into Training", "F", MULTIMODAL),
    _o("RLHS", "RLHS: Mitigating Misalignment in RLHF with", "F", LEARNED_RM + " (simulated hindsight feedback)"),
    _o("RLUF", "Reinforcement Learning from User Feedback", "F", LEARNED_RM + " (a user-feedback model)"),
    _o("FLR", "Aligning Language Models Using Follow-up", "F", LEARNED_RM + " (a follow-up likelihood model)"),
    _r("ToTRL", "ToTRL: Unlock LLM Tree-of-Thoughts Reasoning", "F", f"{REWARDS}: rule-based puzzle tasks"),
    # ------------------------------------------------------------------ G
    _k("S-GRPO", "S-GRPO: Early Exit via Reinforcement Learning in Reasoning Models", "G", ("s_grpo_serial_rewards",), f"early-exit rollouts along one path need the {SAMPLER}", bold=True),
    _b("Prefix Grouper", "Prefix Grouper: Efficient GRPO Training through Shared-Prefix Forward", "G",
       "the trainer's `packing=True` (the default) runs each prompt once for its G completions "
       "(`jaxgrpo.models.packing`); `jaxgrpo.models.prefix` is the shared-prefix forward on its own", bold=True),
    _r("iGRPO", "iGRPO: Self-Feedback-Driven LLM Reasoning", "G", f"{SAMPLER}: draft then draft-conditioned refinement", bold=True),
    _k("Critique-GRPO", "Critique-GRPO: Advancing LLM Reasoning with Natural Language and", "G", ("critique_grpo",), f"critique-guided refinements need the {SAMPLER} and a critique source", bold=True),
    _b("Scaf-GRPO", "Scaf-GRPO: Scaffolded Group Relative Policy Optimization for Enhancing", "G",
       "`jaxgrpo.train.guidance`: tiered hints for all-wrong groups, the first correct hinted sample replacing one of "
       "the group's, `guidance=GuidanceConfig(...)`: experiments/scaf_grpo.py", bold=True),
    _r("Flow-GRPO (AgentFlow)", "In-the-Flow Agentic System Optimization for Effective Planning and Tool", "G", ENV, ("grpo",), bold=True),
    _r("ARPO (agentic)", "Agentic Reinforced Policy Optimization", "G", f"{SAMPLER}: entropy-triggered branching after tool calls, in a {ENV}", bold=True),
    _r("AnytimeReasoner / BRPO", "Optimizing Anytime Reasoning via Budget Relative Policy Optimization", "G", f"{SAMPLER}: thinking truncated at sampled budgets, with summaries", bold=True),
    _k("T-PPO", "Truncated Proximal Policy Optimization", "G", ("experimental/t_ppo_egae", "ppo_clip"), f"experimental EGAE; truncated generation needs the {SAMPLER}", bold=True),
    _r("SAGE", "Self-Hinting Language Models Enhance", "G", f"{SAMPLER}: a self-hint then a hint-conditioned solution"),
    _b("GHPO", "GHPO: Adaptive Guidance for Stable and Efficient", "G",
       "`jaxgrpo.train.guidance`, `guidance=GuidanceConfig(replace='group')`: an all-wrong group sampled again with the task's hint "
       "tiers (for parts of the reference solution): experiments/ghpo.py"),
    _r("ICPO", "Think Outside the Policy: In-Context Steered", "G", f"{SAMPLER}: in-context expert demonstrations", ("importance_correction",)),
    _o("AMPO", "More Than One Teacher: Adaptive Multi-Guidance", "G", EXTRA_MODELS),
    _o("ThinkTuning", "ThinkTuning: Instilling Cognitive Reflections", "G", EXTRA_MODELS),
    _r("Cog-Rethinker", "Cog-Rethinker: Hierarchical Metacognitive", "G", f"{SAMPLER}: re-rolling zero-accuracy problems by decomposition and refinement"),
    _o("M-GRPO", "Multi-Agent Deep Research: Training Multi-Agent", "G", EXTRA_MODELS),
    _r("Delethink", "The Markovian Thinker", "G", f"{SAMPLER}: fixed-size chunks with context reset"),
    _r("Elastic Reasoning", "Scalable Chain of Thoughts via Elastic Reasoning", "G", f"{SAMPLER}: separate thinking and solution budgets"),
    _r("PDR", "Rethinking Thinking Tokens: LLMs as Improvement", "G", f"{SAMPLER}: parallel drafts, distillation, refinement"),
    _r("Parallel-R1", "Parallel-R1: Towards Parallel Thinking via", "G", f"{SAMPLER}: parallel thinking paths"),
    _r("REX-RAG", "REX-RAG: Reasoning Exploration with Policy", "G", ENV, ("importance_correction",)),
    _r("RLTF-SD / RLTF-FM", "Expanding the Capabilities of Reinforcement", "G", ENV),
    _r("Didactic multi-turn RL", "Improving Interactive In-Context Learning from", "G", ENV),
    _o("Long⊗Short", "Not All Thoughts are Generated Equal: Efficient", "G", EXTRA_MODELS),
    _o("PolicyRollout (TriMPI)", "Multimodal Policy Internalization for", "G", MULTIMODAL),
    _r("TON", "Think or Not? Selective Reasoning via", "G", f"{TRAINER}: thought-dropout SFT before GRPO"),
    _r("AdaSearch", "AdaSearch: Balancing Parametric Knowledge and", "G", ENV),
    _r("EPO", "EPO: Explicit Policy Optimization for Strategic", "G", ENV),
    # ------------------------------------------------------------------ H
    _o("TempFlow-GRPO", "TempFlow-GRPO: When Timing Matters for GRPO in Flow Models", "H", DIFFUSION, bold=True),
    _o("BranchGRPO", "BranchGRPO: Stable and Efficient GRPO with", "H", DIFFUSION),
    _o("GRPO-Guard", "GRPO-Guard: Mitigating Implicit Over-Optimization", "H", DIFFUSION),
    _o("Euphonium", "Euphonium: Steering Video Flow Matching via", "H", DIFFUSION),
    _o("AC-Flow", "Fine-tuning Flow Matching Generative Models with", "H", DIFFUSION),
    _o("Co-GRPO", "Co-GRPO: Co-Optimized Group Relative Policy", "H", DIFFUSION + " (masked diffusion)"),
    _o("coupled-GRPO", "DiffuCoder: Understanding and Improving Masked", "H", DIFFUSION + " (masked diffusion)"),
    _o("PRDP", "PRDP: Proximal Reward Difference Prediction for", "H", DIFFUSION),
    _o("VerIPO", "VerIPO: Cultivating Long Reasoning in Video-LLMs", "H", MULTIMODAL),
    _o("HRPO", "Hybrid Latent Reasoning via Reinforcement Learning", "H", "latent (hidden-state) reasoning changes the model architecture"),
    _o("AdaCoT (SLM)", "AdaCoT: Pareto-Optimal Adaptive Chain-of-Thought", "H", ABSTRACT_ONLY),
    _o("SPPO", "Self-Play Preference Optimization for Language", "H", OFFLINE),
    _o("InT", "InT: Self-Proposed Interventions Enable Credit", "H", "an SFT stage on self-proposed interventions before RL"),
    _k("TÜLU 3 RLVR", "TÜLU 3: Pushing Frontiers in Open Language Model", "H", ("gae", "ppo_clip"), f"PPO with verifiable rewards; the value head and clipped_value_loss live in the {TRAINER}"),
)


def _names(kernels: tuple[str, ...]) -> str:
    return ", ".join(f"`{k}`" for k in kernels)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def not_in_loop(m: Method) -> list[tuple[str, str]]:
    """(kernel, reason) for each kernel of `m` whose registration declares why it cannot run in the loop."""
    from jaxgrpo import kernels

    return [(k.name, k.loop) for name in m.kernels for k in kernels.list_kernels() if k.name == name and k.loop]


def rendered_status(m: Method) -> tuple[str, str]:
    """(status, note) as docs/methods.md shows them: "kernel" means every kernel runs from an experiment."""
    reasons = not_in_loop(m) if m.status == KERNEL else []
    if not reasons:
        return m.status, m.note
    why = "; ".join(f"`{name}` {reason}" for name, reason in reasons)
    return KERNEL_NOT_IN_LOOP, f"{m.note}; {why}" if m.note else why


def render() -> str:
    """docs/methods.md as a string (a pure function of BASELINES, METHODS and the registry's declared reasons)."""
    statuses = [rendered_status(m)[0] for m in METHODS]
    counts = {s: statuses.count(s) for s in (*STATUSES, KERNEL_NOT_IN_LOOP)}
    out = [
        "# Methods of the catalog and their status in jaxgrpo",
        "",
        "<!-- Generated by `python -m jaxgrpo.catalog.methods` from jaxgrpo/catalog/methods.py; do not edit. -->",
        "",
        "Every method of the GRPO-family method catalog with its status:",
        "",
        "- **kernel**: implemented as registered kernels (names below; `jaxgrpo.get(kind, name)`), each of",
        "  which runs from an experiment file (tests/train/test_train_every_kernel.py runs every one two steps).",
        "  Names starting with `experimental/` are documented reconstructions of methods whose formula",
        "  could not be verified; their docstrings say what is reconstructed.",
        "- **kernel, not in the loop**: implemented as registered kernels, at least one of which needs an",
        "  input jaxgrpo's training loop cannot produce; the reason its registration declares is in the notes.",
        "- **built in**: implemented by the model or the trainer rather than as a kernel; where, and how",
        "  to turn it on.",
        "- **needs rollout support**: the method changes what is sampled, rewarded or trained beyond a pure",
        "  kernel; the capability it needs is named.",
        "- **out of scope**: with the reason.",
        "",
        f"{len(METHODS)} methods: {counts[KERNEL]} kernel, {counts[KERNEL_NOT_IN_LOOP]} kernel not in the loop, "
        f"{counts[BUILT_IN]} built in, {counts[ROLLOUT]} needs rollout support, "
        f"{counts[OUT]} out of scope. Methods in bold have a full description in the catalog.",
        "",
        "## Baselines",
        "",
        "| Baseline | Kernels | Other functions | Notes |",
        "|---|---|---|---|",
    ]
    for b in BASELINES:
        out.append(f"| {b.name} | {_names(b.kernels)} | {_names(b.functions)} | {_cell(b.note)} |")
    for letter, title in CATEGORIES.items():
        out += ["", f"## {letter}. {title}", "", "| Method | Paper | Status | Kernels | Notes |", "|---|---|---|---|---|"]
        for m in METHODS:
            if m.category != letter:
                continue
            name = f"**{m.name}**" if m.bold else m.name
            status, note = rendered_status(m)
            out.append(f"| {_cell(name)} | *{_cell(m.title)}…* | {status} | {_names(m.kernels)} | {_cell(note)} |")
    return "\n".join(out) + "\n"


DOC_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "methods.md")


def main(argv: list[str] | None = None) -> int:
    """Writes docs/methods.md (or the path given as the only argument)."""
    argv = sys.argv[1:] if argv is None else argv
    path = os.path.abspath(argv[0] if argv else DOC_PATH)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render())
    print(f"wrote {path} ({len(METHODS)} methods)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
