"""Advantages over structure inside or across the prompt groups: reward columns, steps, strata, clusters, bundles.

Beside the rewards and the prompt groups, each estimator reads a structure: K reward columns normalized one by
one (GDPO), agent steps that act from the same environment state (GiGPO), strata of trajectories (Stratified
GRPO), semantic clusters of answers (SEED-GRPO), or bundles of questions whose j-th rollouts form a "paper"
(RiskPO). Those inputs are explicit keyword arrays; sub-groups get dense segment ids
(`segments.joint_segment_ids`), so no static product of sizes is needed.

Every estimator follows the outcome-estimator contract of `jaxgrpo.kernels.advantages`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.advantages.common import (
    STD_DDOF,
    STD_EPS,
    _check_ids_in_range,
    _check_row_array,
    _group_count,
    _zero_invalid_and_singletons,
    checked_lengths,
)
from jaxgrpo.kernels.advantages.whitened import WHITEN, WHITEN_MODES, whitened
from jaxgrpo.kernels.registry import register_advantage
from jaxgrpo.kernels.segments import joint_segment_ids, quantile_within_groups, rank_within_groups
from jaxgrpo.kernels.validation import check_floating, check_outcome_inputs

Array = jax.Array


# ------------------------------------------------------------------------ GDPO


@register_advantage(
    "gdpo", paper="GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL Optimization (2026)",
    ranges={"std_ddof": STD_DDOF, "eps": STD_EPS, "whiten": WHITEN},
    group_relative=True,
)
def gdpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    reward_weights=None,
    std_ddof: int = 1,
    eps: float = 1e-4,
    whiten: str = "rows",
    lengths=None,
) -> Array:
    """Group reward-decoupled normalization (GDPO) of K rewards per rollout.

    A^k_i = (r^k_i - mean^k_g) / (std^k_g + eps) for each reward k inside the
    group; S_i = sum_k w_k A^k_i; then S is normalized over the batch. GRPO
    instead normalizes the weighted sum, which merges distinct reward
    combinations into one advantage. With K = 1 this is GRPO followed by batch
    normalization.

    The batch step differs between the two reference implementations:
    `whiten="rows"` (default, TRL, the paper's release) gives
    A_i = (S_i - mean S) / (std S + eps) over the valid rows, each row weighing 1;
    `whiten="tokens"` (verl) gives verl's `masked_whiten` over the completion
    tokens, A_i = (S_i - mean) / sqrt(var + 1e-8) with each row weighted by its
    length (`lengths`) and the unbiased variance over the batch's tokens. They
    agree only when every row has one token.

    Args:
      rewards: f32[N, K], one column per reward function.
      reward_weights: f32[K], default all ones.
      std_ddof: 1 (unbiased, `torch.std`) for group and batch std.
      eps: 1e-4 as TRL's normalization (verl's group step uses 1e-6).
      whiten: "rows" (TRL) or "tokens" (verl).
      lengths: f32[N] completion tokens per row, for `whiten="tokens"` (the
        trainer passes them); without them every row counts as one token.

    Paper: "GDPO: Group reward-Decoupled Normalization Policy Optimization for
    Multi-reward RL Optimization" (2026); checked against TRL, and verl for the token whitening.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(
        rewards, group_ids, num_groups, valid, reward_shape="[N, K]"
    )
    k = rewards.shape[1]
    weights = jnp.ones((k,), rewards.dtype) if reward_weights is None else check_floating("reward_weights", reward_weights)
    if weights.shape != (k,):
        raise ValueError(f"reward_weights must have shape [K]=[{k}] like rewards' second axis, got {tuple(weights.shape)}")
    per_reward = segments.standardize(rewards, group_ids, num_groups, valid, ddof=std_ddof, eps=eps)
    n = _group_count(group_ids, num_groups, valid)
    per_reward = jnp.where((valid & (n > 1))[:, None], per_reward, 0.0)
    summed = per_reward @ weights
    if whiten not in WHITEN_MODES:
        raise ValueError(f"whiten must be one of {', '.join(WHITEN_MODES)}, got {whiten!r}")
    if whiten == "tokens":
        lengths = checked_lengths(lengths, rewards.shape[0], valid)
        return jax.lax.stop_gradient(whitened(summed, valid, mode="tokens", lengths=lengths, eps=1e-8))
    return jax.lax.stop_gradient(segments.masked_standardize(summed, valid, ddof=std_ddof, eps=eps))


# ----------------------------------------------------------------------- GiGPO


def _normalize_in_segments(x, seg_ids, num_segments, valid, normalization, eps):
    if normalization == "mean_norm":
        return x - segments.gather(segments.mean(x, seg_ids, num_segments, valid), seg_ids)
    return segments.standardize(x, seg_ids, num_segments, valid, ddof=1, eps=eps)


@register_advantage("gigpo", paper="Group-in-Group Policy Optimization for LLM Agent Training (2025)",
                    ranges={"step_weight": ("any", "omega, the weight of the step-level advantage"),
                            "normalization": ("one of mean_norm, std", "the scale F of both levels: 1 or the std"),
                            "eps": STD_EPS},
                    group_relative=True)
def gigpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    step_returns,
    anchor_ids,
    num_anchors: int,
    step_weight: float = 1.0,
    normalization: str = "mean_norm",
    eps: float = 1e-6,
) -> Array:
    """Group-in-group advantage (GiGPO): A = A^E + omega A^S, one row per agent step.

    A^E_i = (R_tau(i) - mean_g) / F over the rows of prompt group g (the episode
    return of each row's trajectory, statistics across steps as in the code's
    default); A^S_i = (R_t(i) - mean_s) / F over the rows of g that act from the
    same anchor state s. F = 1 ("mean_norm", default) or std (ddof=1) + eps ("std").

    Args:
      rewards: f32[N] episode return of each row's trajectory.
      step_returns: f32[N] discounted return from the row's step,
        R_t = sum_k gamma^k r_{t+k} (gamma=0.95 in verl-agent; see `discounted_returns`).
      anchor_ids: i32[N] id of the environment state the step acts from; steps
        are grouped by (group, anchor), as the code clusters states per prompt.
      num_anchors: the range of anchor ids (static; only checked).
      step_weight: omega=1.

    Single-row episode groups get A^E = 0 (the code would keep R_tau).

    Paper: Feng et al., "Group-in-Group Policy Optimization for LLM Agent
    Training" (2025); code verl-agent `core_gigpo.py`.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    n = rewards.shape[0]
    step_returns = _check_row_array("step_returns", step_returns, n, valid=valid)
    anchor_ids = _check_row_array("anchor_ids", anchor_ids, n, integer=True)
    _check_ids_in_range("anchor_ids", anchor_ids, num_anchors, "num_anchors")
    if normalization not in ("mean_norm", "std"):
        raise ValueError(f"normalization must be 'mean_norm' or 'std', got {normalization!r}")
    episode = _normalize_in_segments(rewards, group_ids, num_groups, valid, normalization, eps)
    episode = _zero_invalid_and_singletons(episode, group_ids, num_groups, valid)
    step_groups = joint_segment_ids(group_ids, anchor_ids, valid)
    step = _normalize_in_segments(step_returns, step_groups, n, valid, normalization, eps)
    step = _zero_invalid_and_singletons(step, step_groups, n, valid)
    return jax.lax.stop_gradient(episode + step_weight * step)


# ------------------------------------------------------------- Stratified GRPO


def _grpo_normalize(rewards, seg_ids, num_segments, valid, ddof, eps):
    normalized = segments.standardize(rewards, seg_ids, num_segments, valid, ddof=ddof, eps=eps)
    return _zero_invalid_and_singletons(normalized, seg_ids, num_segments, valid)


@register_advantage(
    "stratified_grpo",
    paper="Stratified GRPO: Handling Structural Heterogeneity in Reinforcement Learning of LLM Search Agents (2025)",
    ranges={"num_strata": (">= 1", "the number of strata"),
            "blend": ("in [0, 1]", "alpha, the weight of the stratified normalization against the global one"),
            "std_ddof": STD_DDOF, "eps": STD_EPS},
    group_relative=True,
)
def stratified_grpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    strata_ids,
    num_strata: int,
    blend: float = 1.0,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> Array:
    """Stratified advantage normalization (SAN) blended with the group's global normalization.

    A^SAN_i = (R_i - mu_k) / (sigma_k + eps) inside stratum k of i's prompt group
    (e.g. k = number of search calls); A^global_i is GRPO's normalization over
    the whole group; A = alpha A^SAN + (1 - alpha) A^global. With one stratum
    both terms are GRPO's advantage.

    Reconstruction: the paper's abstract gives SAN and the blend; the default
    alpha = 1 (pure SAN) and the std convention (ddof=1, eps=1e-6, as GRPO in
    verl) are our choices, not verified against the authors' code.

    Args:
      strata_ids: i32[N] stratum of each trajectory, in [0, num_strata).
      num_strata: number of strata (static).
      blend: alpha.

    Paper: "Stratified GRPO: Handling Structural Heterogeneity in Reinforcement
    Learning of LLM Search Agents" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    strata_ids = _check_row_array("strata_ids", strata_ids, rewards.shape[0], integer=True)
    _check_ids_in_range("strata_ids", strata_ids, num_strata, "num_strata")
    strata = joint_segment_ids(group_ids, strata_ids, valid)
    within = _grpo_normalize(rewards, strata, rewards.shape[0], valid, std_ddof, eps)
    global_ = _grpo_normalize(rewards, group_ids, num_groups, valid, std_ddof, eps)
    return jax.lax.stop_gradient(blend * within + (1.0 - blend) * global_)


# ------------------------------------------------------------------- SEED-GRPO


SEED_SCALINGS = ("linear", "exp", "focal")


def semantic_entropy_from_clusters(group_ids, cluster_ids, num_groups: int, valid) -> Array:
    """Semantic entropy per group from answer clusters: SE = -(1/K) sum_k log p(C_k), f32[num_groups].

    p(C_k) = |C_k| / G over the group's valid rows, K the number of clusters in
    the group. One cluster gives 0; G singleton clusters give log G.
    Each row adds -log p(C)/|C| to the sum and 1/|C| to K, so no static number
    of clusters is needed.
    """
    clusters = joint_segment_ids(group_ids, cluster_ids, valid)
    n = group_ids.shape[0]
    cluster_size = segments.gather(segments.count(clusters, n, valid), clusters)
    group_size = _group_count(group_ids, num_groups, valid)
    safe_size = jnp.maximum(cluster_size, 1.0)
    p = safe_size / jnp.maximum(group_size, 1.0)
    neg_log_p = jnp.where(valid, -jnp.log(p) / safe_size, 0.0)
    inv_size = jnp.where(valid, 1.0 / safe_size, 0.0)
    total = jax.ops.segment_sum(neg_log_p, group_ids, num_segments=num_groups)
    k = jax.ops.segment_sum(inv_size, group_ids, num_segments=num_groups)
    return total / jnp.maximum(k, 1.0)


@register_advantage(
    "seed_grpo",
    paper="SEED-GRPO: Semantic Entropy Enhanced GRPO for Uncertainty-Aware Policy Optimization (2025)",
    experimental=True,  # the scaling functions f and alpha are reconstructed
    ranges={"alpha": (">= 0", "the strength of the semantic-entropy scaling"),
            "scaling": ("one of linear, exp, focal", "the scaling function f"),
            "focal_gamma": (">= 0", "the exponent of the focal scaling"), "eps": STD_EPS},
    group_relative=True,
    loop=("needs semantic clusters of each group's answers (SEED-GRPO's cluster_ids or semantic_entropy), "
          "which no answer clusterer in the loop computes"),
)
def seed_grpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    semantic_entropy=None,
    cluster_ids=None,
    alpha: float = 1.0,
    scaling: str = "linear",
    focal_gamma: float = 2.0,
    std_normalize: bool = False,
    eps: float = 1e-6,
) -> Array:
    """Semantic-entropy-scaled advantage (SEED-GRPO): A_i = (r_i - mean_g) f(alpha SE_q / SE_max).

    SE_q is the semantic entropy of prompt q's answers (given, or computed from
    `cluster_ids` by `semantic_entropy_from_clusters`), SE_max = log G. f is
    decreasing with f(0) = 1, so SE = 0 leaves the advantage unchanged and
    uncertain prompts get smaller updates. x = alpha SE / SE_max is clipped to
    [0, 1]; f(x) = 1 - x ("linear"), exp(-x) ("exp") or (1 - x)^gamma ("focal").

    Reconstruction: the scaling form comes from the paper's abstract and a
    review; f's three shapes, alpha = 1 and gamma = 2 are our choices, not
    verified against the authors' code. `std_normalize=True` divides the centered
    reward by the group std (ddof=1) first, i.e. scales GRPO's advantage.

    Args:
      semantic_entropy: f32[num_groups] or None.
      cluster_ids: i32[N] semantic cluster of each answer within its group, or None.

    Paper: "SEED-GRPO: Semantic Entropy Enhanced GRPO for Uncertainty-Aware
    Policy Optimization" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    if scaling not in SEED_SCALINGS:
        raise ValueError(f"scaling must be one of {SEED_SCALINGS}, got {scaling!r}")
    if (semantic_entropy is None) == (cluster_ids is None):
        raise ValueError("pass exactly one of semantic_entropy f32[num_groups] or cluster_ids i32[N]")
    if semantic_entropy is not None:
        semantic_entropy = check_floating("semantic_entropy", semantic_entropy)
        if semantic_entropy.shape != (num_groups,):
            raise ValueError(
                f"semantic_entropy must have shape [num_groups]=[{num_groups}], got {tuple(semantic_entropy.shape)}"
            )
    else:
        cluster_ids = _check_row_array("cluster_ids", cluster_ids, rewards.shape[0], integer=True)
        semantic_entropy = semantic_entropy_from_clusters(group_ids, cluster_ids, num_groups, valid)
    n = segments.count(group_ids, num_groups, valid)
    se_max = jnp.log(jnp.maximum(n, 1.0))
    x = jnp.clip(alpha * semantic_entropy / jnp.where(se_max > 0, se_max, 1.0), 0.0, 1.0)
    x = jnp.where(se_max > 0, x, 0.0)
    if scaling == "linear":
        factor = 1.0 - x
    elif scaling == "exp":
        factor = jnp.exp(-x)
    else:
        factor = jnp.power(1.0 - x, focal_gamma)
    if std_normalize:
        centered = segments.standardize(rewards, group_ids, num_groups, valid, ddof=1, eps=eps)
    else:
        centered = rewards - segments.gather(segments.mean(rewards, group_ids, num_groups, valid), group_ids)
    return _zero_invalid_and_singletons(centered * segments.gather(factor, group_ids), group_ids, num_groups, valid)


# ---------------------------------------------------------------------- RiskPO


@register_advantage(
    "riskpo", paper="RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM Post-Training (2025)",
    ranges={"num_bundles": (">= 1", "the range of bundle ids"),
            "quantile_low": ("in (0, 1)", "a, the lower quantile level (below quantile_high)"),
            "quantile_high": ("in (quantile_low, 1)", "b, the upper quantile level"),
            "cvar_weight": (">= 0", "w, the weight of the lower tail"), "eps": STD_EPS},
    group_relative=True,  # a bundle's papers are its questions' j-th rollouts: one per question, one paper
)
def riskpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    bundle_ids,
    num_bundles: int | None = None,
    quantile_low: float = 0.2,
    quantile_high: float = 0.9,
    cvar_weight: float = 1.5,
    tracked_quantiles=None,
    eps: float = 1e-6,
) -> Array:
    """Mixed value-at-risk advantage over question bundles (RiskPO).

    Questions (groups) are bundled by `bundle_ids`; the j-th valid rollout of
    every question of a bundle (batch order) forms "paper" j, with score S_j the
    sum of its rewards (a bundle has as many papers as its smallest question
    has rollouts; other rollouts get 0). With q_a, q_b the quantile_low /
    quantile_high quantiles (linear) of the bundle's paper scores:
      RVaR_j = [(S_j - q_a)+ - (S_j - q_b)+ + q_a - q_b] / (b - a),
      CVaR_j = -(q_a - S_j)+ / a,
      A_j = (w CVaR_j + RVaR_j) / (w + 1) / (std(S) + eps), std with ddof=1
      (1 for a single paper), copied to every rollout of paper j.

    Args:
      bundle_ids: i32[N] bundle of each row (all rows of a question share it).
      num_bundles: range of bundle ids (static); defaults to num_groups.
      quantile_low, quantile_high: a=0.2, b=0.9 (the authors' training scripts).
      cvar_weight: w=1.5.
      tracked_quantiles: optional (q_a, q_b) tracked across steps by the
        trainer; averaged with the batch quantiles (the code's "mix" mode).

    Paper: "RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM
    Post-Training" (2025); code RiskPO 65ec40c (uniform credit).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    n = rewards.shape[0]
    num_bundles = num_groups if num_bundles is None else num_bundles
    bundle_ids = _check_row_array("bundle_ids", bundle_ids, n, integer=True)
    _check_ids_in_range("bundle_ids", bundle_ids, num_bundles, "num_bundles")
    if not 0.0 < quantile_low < quantile_high < 1.0:
        raise ValueError(f"need 0 < quantile_low < quantile_high < 1, got {quantile_low}, {quantile_high}")

    rank = rank_within_groups(group_ids, num_groups, valid)
    question_size = _group_count(group_ids, num_groups, valid)
    big = jnp.asarray(n + 1, question_size.dtype)
    papers_per_bundle = jax.ops.segment_min(jnp.where(valid, question_size, big), bundle_ids, num_segments=num_bundles)
    in_paper = valid & (rank < jnp.take(papers_per_bundle, bundle_ids, mode="clip"))
    paper_ids = joint_segment_ids(bundle_ids, rank, in_paper)
    # Scores in units of 2^k per bundle (k from its largest |reward|), so sums and squares cannot
    # overflow; the advantage is a ratio of scores, and 1 and eps below are scaled alike.
    scaled, k = segments.unit_scale(rewards, bundle_ids, num_bundles, in_paper)
    unit = segments.power_of_two(-k, rewards.dtype)
    paper_score = segments.sum(scaled, paper_ids, n, in_paper)
    paper_exists = segments.count(paper_ids, n, in_paper) > 0
    paper_bundle = jax.ops.segment_max(jnp.where(in_paper, bundle_ids, -1), paper_ids, num_segments=n)
    paper_bundle = jnp.clip(paper_bundle, 0, num_bundles - 1)

    q_low = quantile_within_groups(paper_score, paper_bundle, num_bundles, paper_exists, quantile_low)
    q_high = quantile_within_groups(paper_score, paper_bundle, num_bundles, paper_exists, quantile_high)
    if tracked_quantiles is not None:
        tracked = jnp.asarray(tracked_quantiles, rewards.dtype)
        q_low, q_high = 0.5 * (q_low + tracked[0] * unit), 0.5 * (q_high + tracked[1] * unit)
    num_papers = segments.count(paper_bundle, num_bundles, paper_exists)
    std = segments.std(paper_score, paper_bundle, num_bundles, paper_exists, ddof=1)
    std = jnp.where(num_papers > 1, std, unit) + segments.scaled_eps(eps, k, rewards.dtype)

    s = paper_score
    a, b = q_low[paper_bundle], q_high[paper_bundle]
    rvar = (jnp.maximum(s - a, 0.0) - jnp.maximum(s - b, 0.0) + a - b) / (quantile_high - quantile_low + eps)
    cvar = -jnp.maximum(a - s, 0.0) / (quantile_low + eps)
    paper_adv = (cvar_weight * cvar + rvar) / (cvar_weight + 1.0) / std[paper_bundle]
    return jax.lax.stop_gradient(jnp.where(in_paper, paper_adv[paper_ids], 0.0))
