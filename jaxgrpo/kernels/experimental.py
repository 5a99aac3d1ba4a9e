"""Experimental kernels: documented reconstructions of catalog methods whose formula is unverified.

These are the catalog's unverified methods: their papers' abstracts describe
the idea, but no formula could be checked against the authors' code. Each
kernel here implements one explicit reading of the abstract, is registered
under an `experimental/` name (so `KernelInfo.experimental` is True), and its
docstring says which parts are reconstructed. Every hyper-parameter that
switches the reconstruction off is tested to reduce to a verified baseline
kernel (e.g. DHPO with token weight 1 is `ppo_clip`).

Numerics follow the baseline kernels: a row with a NaN or +-inf reward is
invalid (advantage 0, out of every statistic), whitening is computed on values
scaled by a power of two (no overflow), and token inputs are replaced by 0
where the mask is 0 before any arithmetic (no NaN from masked-out tokens).

Kernels:
  experimental/etr_clip                loss   ETR elastic trust region
  experimental/dhpo                    loss   DHPO token/sequence ratio mix
  experimental/spo_value_tracker       selection  single-stream SPO Beta tracker (state in, state out)
  experimental/spo_priority            selection  single-stream SPO sampling weights
  experimental/spo_advantage           advantage  single-stream SPO advantage (r - v, batch whitened)
  experimental/a_grae                  advantage  A-GRAE asymmetric, difficulty-scheduled GRPO
  experimental/t_ppo_egae              token_advantage  T-PPO's extended GAE on truncated responses
  experimental/grpo_vps_progress       credit  GRPO-VPS probe-progress token advantages
  experimental/aepo_entropy            loss   Arbitrary-Entropy PO REINFORCE regularizer
  experimental/grpo_lambda             reward GRPO-λ group-switched length penalty
  experimental/conciser_length_reward  reward ConciseR length reward for all-correct groups
  experimental/trapo_selection         selection  TraPO unlabeled-prompt selector
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.advantages import STD_DDOF, STD_EPS, batch_whiten, grpo
from jaxgrpo.kernels.losses import EPS_HIGH, EPS_LOW, log_ratio, prepare, ratio_metrics
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.segments import masked_mean
from jaxgrpo.kernels.token import gae
from jaxgrpo.kernels.validation import (
    check_floating,
    check_group_ids,
    check_integer,
    check_num_groups,
    check_outcome_inputs,
    check_rank,
    check_token_inputs,
    check_valid,
)

Array = jax.Array

_ETR = "ETR: Outcome-Guided Elastic Trust Regions for Policy Optimization (2026)"
_DHPO = "Orchestrating Tokens and Sequences: Dynamic Hybrid Policy Optimization for RLVR (2026)"
_SPO = "Single-stream Policy Optimization (2025)"
_AGRAE = "Unveiling Implicit Advantage Symmetry: Why GRPO Struggles with Exploration and Difficulty Adaptation (2026)"
_TPPO = "Truncated Proximal Policy Optimization (2025)"
_VPS = "GRPO-VPS: Enhancing Group Relative Policy Optimization with Verifiable Process Supervision for Effective Reasoning (2026)"
_AEPO = "Arbitrary Entropy Policy Optimization: Entropy Is Controllable in Reinforcement Fine-tuning (2025)"
_LAMBDA = "Stable Reinforcement Learning for Efficient Reasoning (2025)"
_CONCISER = "Walk Before You Run! Concise LLM Reasoning via Reinforcement Learning (2025)"
_TRAPO = "TraPO: A Semi-Supervised Reinforcement Learning Framework for Boosting LLM Reasoning (2025)"


def _clipped_surrogate(ratio, adv, low, high):
    """-min(rho A, clip(rho, low, high) A) and whether the clipped branch is active."""
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, low, high)
    return jnp.maximum(unclipped, clipped), clipped > unclipped


# --------------------------------------------------------------------------- ETR


@register("loss", "experimental/etr_clip", paper=_ETR, ranges={
    "eps_low": EPS_LOW, "eps_high": EPS_HIGH,
    "advantage_elasticity": (">= 0", "a, the micro slope of the clip scale in |A|"),
    "variance_elasticity": (">= 0", "b, the macro slope of the clip scale in the group variance"),
    "max_variance": ("> 0", "v_max, the largest group variance of the reward"),
    "min_scale": ("in (0, max_scale]", "the least clip scale s"),
    "max_scale": (">= min_scale", "the largest clip scale s"),
})
def etr_clip(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    group_variance=None,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    advantage_elasticity: float = 0.5,
    variance_elasticity: float = 0.5,
    max_variance: float = 0.25,
    min_scale: float = 0.5,
    max_scale: float = 2.0,
):
    """ETR (reconstruction): PPO clipping with a clip range scaled per sample by |A| and group variance.

    l_t = -min(rho_t A_t, clip(rho_t, 1 - s_t eps_low, 1 + s_t eps_high) A_t), with
    s_t = clip(micro_t * macro_i, min_scale, max_scale),
    micro_t = 1 + a (|A_t| - 1)  and  macro_i = 1 + b (2 v_i / v_max - 1).

    A z-scored advantage of magnitude 1 keeps the base range; larger |A|
    (confident outcome signal) widens it. A group at the maximum reward variance
    v_max (p = 0.5 for 0/1 rewards, the "optimal learning zone") gets 1 + b,
    half of it gets 1, a constant group 1 - b.

    Reconstructed from the abstract of Zhang et al., "ETR: Outcome-Guided
    Elastic Trust Regions for Policy Optimization" (2026): "at the micro level,
    it scales clipping boundaries based on advantage magnitude; at the macro
    level, it leverages group variance to allocate larger update budgets".
    Unverified: the linear forms of micro and macro, their product, the bounds,
    and every default (a = b = 0.5, scale in [0.5, 2], v_max = 0.25 for 0/1
    rewards) are ours, not the paper's. With a = b = 0 it is exactly `ppo_clip`.

    Args:
      group_variance: optional f32[N], the reward variance of each row's group
        (e.g. `segments.gather(segments.variance(r, g, G, valid), g)`); None
        disables the macro factor.
      eps_low, eps_high: base clip range (eps_high defaults to eps_low; 0.2 as GRPO).
      advantage_elasticity: a, the micro slope.
      variance_elasticity: b, the macro slope.
      max_variance: v_max, the largest group variance of the reward (0.25 for 0/1).
      min_scale, max_scale: bounds on s.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    eps_high = eps_low if eps_high is None else eps_high
    if not 0 < min_scale <= max_scale:
        raise ValueError(f"need 0 < min_scale <= max_scale, got {min_scale}, {max_scale}")
    micro = 1.0 + advantage_elasticity * (jnp.abs(adv) - 1.0)
    if group_variance is None:
        macro = jnp.ones((logp.shape[0], 1), logp.dtype)
    else:
        group_variance = check_floating("group_variance", group_variance)
        if group_variance.shape != (logp.shape[0],):
            raise ValueError(
                f"group_variance must have shape [N]=[{logp.shape[0]}], got {tuple(group_variance.shape)}"
            )
        macro = (1.0 + variance_elasticity * (2.0 * group_variance / max_variance - 1.0))[:, None]
    # The clip range is a function of the (constant) advantages only: no gradient flows through it.
    scale = jax.lax.stop_gradient(jnp.clip(micro * macro, min_scale, max_scale))
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    loss, is_clipped = _clipped_surrogate(ratio, adv, 1.0 - scale * eps_low, 1.0 + scale * eps_high)
    metrics = {
        "clip_fraction": masked_mean(is_clipped.astype(logp.dtype), mask),
        "clip_scale_mean": masked_mean(scale * jnp.ones_like(logp), mask),
    }
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


# -------------------------------------------------------------------------- DHPO


@register("loss", "experimental/dhpo", paper=_DHPO, ranges={
    "token_weight": ("in [0, 1]", "w, the token ratio's weight in the average mode"),
    "token_eps_low": (">= 0", "the lower clip epsilon of the token branch"),
    "token_eps_high": (">= 0", "the upper clip epsilon of the token branch; None: token_eps_low"),
    "seq_eps_low": (">= 0", "the lower clip epsilon of the sequence branch"),
    "seq_eps_high": (">= 0", "the upper clip epsilon of the sequence branch"),
})
def dhpo(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    token_weight: float = 0.5,
    token_entropy=None,
    token_eps_low: float = 0.2,
    token_eps_high: float | None = None,
    seq_eps_low: float = 3e-4,
    seq_eps_high: float = 4e-4,
):
    """DHPO (reconstruction): one clipped surrogate on a weighted mix of token and sequence ratios.

    l_t = -min(r_t A_t, r^clip_t A_t), with the mixed ratio and its branch-clipped version
        r_t      = w_t rho_t + (1 - w_t) s_{i,t},
        r^clip_t = w_t clip(rho_t, 1 - eps_tok_low, 1 + eps_tok_high)
                   + (1 - w_t) clip(s_{i,t}, 1 - eps_seq_low, 1 + eps_seq_high),
    rho_t = pi/pi_old the token ratio (GRPO) and s_{i,t} = sg[s_i] pi(y_t)/sg[pi(y_t)],
    s_i = exp(mean_t log rho_t), the sequence ratio with per-token gradients
    (GSPO-token). Each branch is clipped in its own trust region before mixing.

    Weights: "average" mode (no entropy given) uses the constant w = token_weight;
    "entropy-guided" mode (token_entropy given) uses w_t = H_t / (H_t + mean_i H),
    the token's entropy against its sequence's mean, so uncertain tokens lean
    on their own token ratio and confident ones on the sequence ratio (equal
    entropies give w = 0.5).

    Reconstructed from the abstract of Min et al., "Orchestrating Tokens and
    Sequences: Dynamic Hybrid Policy Optimization for RLVR" (2026): "combines
    token-level and sequence-level importance ratios [...] within a single
    clipped surrogate objective", "averaged mixing and entropy-guided mixing",
    "branch-specific clipping [...] within separate trust regions before
    mixing". Unverified: the arithmetic (not geometric) mix, the
    entropy-weight formula and its direction, and the defaults: the token
    branch's 0.2 from GRPO, the sequence branch's 3e-4/4e-4 from GSPO, w = 0.5.
    w = 1 is exactly `ppo_clip`, w = 0 exactly `gspo_token`.

    Args:
      token_weight: w in [0, 1] for the "average" mode.
      token_entropy: optional f32[N, T] per-token policy entropy (treated as a
        constant); switches to the entropy-guided weights.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    if not 0.0 <= token_weight <= 1.0:
        raise ValueError(f"token_weight must lie in [0, 1], got {token_weight}")
    token_eps_high = token_eps_low if token_eps_high is None else token_eps_high
    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    seq_log_r = (log_r * mask).sum(-1, keepdims=True) / jnp.maximum(mask.sum(-1, keepdims=True), 1)
    seq_ratio = jnp.exp(jax.lax.stop_gradient(seq_log_r) + logp - jax.lax.stop_gradient(logp))
    token_clip = jnp.clip(ratio, 1.0 - token_eps_low, 1.0 + token_eps_high)
    seq_clip = jnp.clip(seq_ratio, 1.0 - seq_eps_low, 1.0 + seq_eps_high)

    if token_entropy is None:
        weight = jnp.full_like(logp, token_weight)
    else:
        check_token_inputs(logp=logp, token_entropy=token_entropy)
        entropy = jax.lax.stop_gradient(jnp.maximum(segments.fill_masked(mask, token_entropy), 0.0))
        seq_entropy = masked_mean(entropy, mask, axis=-1)[:, None]
        denom = entropy + seq_entropy
        weight = jnp.where(denom > 0, entropy / jnp.where(denom > 0, denom, 1.0), 0.5)
    mixed = weight * ratio + (1.0 - weight) * seq_ratio
    mixed_clip = weight * token_clip + (1.0 - weight) * seq_clip
    unclipped, clipped = -adv * mixed, -adv * mixed_clip
    loss = jnp.maximum(unclipped, clipped)
    metrics = {
        "clip_fraction": masked_mean((clipped > unclipped).astype(logp.dtype), mask),
        "token_clip_fraction": masked_mean((token_clip != ratio).astype(logp.dtype), mask),
        "seq_clip_fraction": masked_mean((seq_clip != seq_ratio).astype(logp.dtype), mask),
        "token_weight_mean": masked_mean(weight, mask),
    }
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return loss * mask, metrics


# ------------------------------------------------------------ single-stream SPO


class SPOTrackerState(NamedTuple):
    """Per-prompt Beta posterior of the success rate: v = alpha / (alpha + beta)."""

    alpha: Array  # f32[P]
    beta: Array  # f32[P]

    @property
    def value(self) -> Array:
        """The tracked success rate v(x) of every prompt, f32[P]."""
        return self.alpha / (self.alpha + self.beta)


def spo_tracker_init(num_prompts: int, initial_values=None, *, prior_count: float = 8.0) -> SPOTrackerState:
    """A tracker with prior alpha = n0 v0, beta = n0 (1 - v0) per prompt.

    Args:
      num_prompts: P, the number of prompts of the dataset (static).
      initial_values: optional f32[P] initial success estimates v0 (e.g. from a
        few offline rollouts); 0.5 when None.
      prior_count: n0, the effective number of observations of the prior
        (8 here; the paper's value is unverified).
    """
    if prior_count <= 0:
        raise ValueError(f"prior_count must be > 0, got {prior_count}")
    v0 = jnp.full((num_prompts,), 0.5, jnp.float32) if initial_values is None else jnp.asarray(initial_values, jnp.float32)
    if v0.shape != (num_prompts,):
        raise ValueError(f"initial_values must have shape [P]=[{num_prompts}], got {tuple(v0.shape)}")
    v0 = jnp.clip(v0, 1e-3, 1.0 - 1e-3)  # a Beta needs alpha, beta > 0
    return SPOTrackerState(prior_count * v0, prior_count * (1.0 - v0))


@register("selection", "experimental/spo_value_tracker", paper=_SPO, ranges={
    "kl_half_life": ("> 0", "D_half, the KL at which the forgetting factor halves"),
    "min_forget": ("in [0, max_forget]", "rho_min, the least forgetting factor"),
    "max_forget": ("in [min_forget, 1]", "rho_max, the largest forgetting factor"),
})
def spo_value_tracker(
    state: SPOTrackerState,
    prompt_ids,
    rewards,
    kl,
    *,
    valid=None,
    kl_half_life: float = 0.06,
    min_forget: float = 0.875,
    max_forget: float = 0.96,
) -> SPOTrackerState:
    """Single-stream SPO's KL-adaptive Beta value tracker (reconstruction): state in, state out.

    For every prompt x seen in the batch, with D(x) the KL between the current
    policy and the one that last saw x:
        rho(x) = clip(2^(-D(x) / D_half), rho_min, rho_max),
        alpha <- rho alpha + sum r,   beta <- rho beta + sum (1 - r).
    Prompts not in the batch keep their state. The baseline is v = alpha/(alpha+beta).

    Reconstructed from the abstract and secondary summaries of Xu & Ding,
    "Single-stream Policy Optimization" (2025) ("a persistent, KL-adaptive
    value tracker", a Bayesian Beta tracker whose forgetting grows with the
    policy's drift). Unverified: the exact forgetting law and the constants
    D_half = 0.06, rho in [0.875, 0.96], recalled from the paper but not checked
    against its code.

    Args:
      state: `SPOTrackerState` of P prompts.
      prompt_ids: i32[N] index of each row's prompt, in [0, P).
      rewards: f32[N] rewards in [0, 1] (0/1 correctness in the paper).
      kl: f32[N] the estimated KL D(x) for each row's prompt (rows of one prompt
        are averaged).
      valid: optional bool[N]; invalid rows do not update the state.
    """
    alpha = check_floating("state.alpha", state.alpha)
    beta = check_floating("state.beta", state.beta)
    check_rank("state.alpha", alpha, 1, "[P]")
    if beta.shape != alpha.shape:
        raise ValueError(f"state.beta has shape {tuple(beta.shape)} but state.alpha has {tuple(alpha.shape)}")
    num_prompts = alpha.shape[0]
    rewards, prompt_ids, valid, _ = check_outcome_inputs(rewards, prompt_ids, num_prompts, valid)
    kl = check_floating("kl", kl)
    if kl.shape != rewards.shape:
        raise ValueError(f"kl must have shape [N]=[{rewards.shape[0]}] like rewards, got {tuple(kl.shape)}")
    seen = segments.count(prompt_ids, num_prompts, valid) > 0
    drift = jnp.maximum(segments.mean(kl, prompt_ids, num_prompts, valid), 0.0)
    forget = jnp.clip(jnp.exp2(-drift / kl_half_life), min_forget, max_forget)
    successes = segments.sum(rewards, prompt_ids, num_prompts, valid)
    failures = segments.sum(1.0 - rewards, prompt_ids, num_prompts, valid)
    new_alpha = jnp.where(seen, forget * alpha + successes, alpha)
    new_beta = jnp.where(seen, forget * beta + failures, beta)
    return SPOTrackerState(new_alpha, new_beta)


@register("selection", "experimental/spo_priority", paper=_SPO,
          loop=("needs prioritized prompt sampling from the SPO tracker's values; the prompt stream draws prompts"
                " uniformly without replacement"),
          ranges={"floor": (">= 0", "added to every prompt's priority, so solved and hopeless prompts stay reachable")})
def spo_priority(values, *, valid=None, floor: float = 0.05) -> Array:
    """Single-stream SPO's prioritized-sampling weights (reconstruction).

    w(x) ∝ sqrt(v(x) (1 - v(x))) + floor over the valid prompts, normalized to sum 1;
    prompts near v = 0.5 (largest Bernoulli std) are sampled most, the floor
    keeps solved and hopeless prompts reachable.

    Reconstructed from the abstract ("the persistent value tracker naturally
    enables an adaptive curriculum via prioritized sampling"), read as
    priority ∝ sqrt(v(1-v)); the floor 0.05 is unverified.

    Args:
      values: f32[P] tracked success rates (`SPOTrackerState.value`).
      valid: optional bool[P] prompts eligible for sampling.
    """
    values = check_floating("values", values)
    check_rank("values", values, 1, "[P]")
    valid = check_valid("valid", valid, values.shape[0])
    v = jnp.clip(values, 0.0, 1.0)
    score = jnp.where(valid, jnp.sqrt(v * (1.0 - v)) + floor, 0.0)
    return score / jnp.maximum(score.sum(), jnp.finfo(score.dtype).tiny)


@register("advantage", "experimental/spo_advantage", paper=_SPO,
          ranges={"eps": ("> 0", "added to the batch variance of the whitening")})
def spo_advantage(rewards, group_ids, *, num_groups: int, baseline, valid=None, eps: float = 1e-8) -> Array:
    """Single-stream SPO advantage: A = whiten_batch(r - v(x)), no group statistics.

    v(x) is the tracker's value of the row's prompt (read *before* this batch's
    update). The centered rewards are whitened over the valid rows of the
    whole batch (unbiased variance), so a prompt with one sample, or a group
    that is all right, still gets a signal.

    Paper: Xu & Ding, "Single-stream Policy Optimization" (2025). The global
    normalization is stated in the abstract; its exact form (here the
    REINFORCE++-style whitening) is unverified.

    Args:
      group_ids: i32[N] prompt of each row (unused by the formula; kept for the contract).
      baseline: f32[N], the tracked value v(x) of each row's prompt (required).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    baseline = check_floating("baseline", baseline)
    if baseline.shape != rewards.shape:
        raise ValueError(f"baseline must have shape [N]=[{rewards.shape[0]}], got {tuple(baseline.shape)}")
    return jnp.where(valid, batch_whiten(rewards - baseline, valid, eps=eps), 0.0)


# ------------------------------------------------------------------------ A-GRAE


@register("advantage", "experimental/a_grae", paper=_AGRAE, ranges={
    "positive_scale": (">= 0", "lambda_+, the factor of positive advantages"),
    "difficulty_strength": ("in [0, 1]", "k, the strength of the difficulty weight (keeps it >= 0)"),
    "std_ddof": STD_DDOF, "eps": STD_EPS,
}, group_relative=True)
def a_grae(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    positive_scale: float = 0.5,
    difficulty_strength: float = 0.5,
    progress=None,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> Array:
    """A-GRAE (reconstruction): GRPO advantages with damped positives and a scheduled difficulty weight.

    A_i = w_g * (lambda_+ if A^GRPO_i > 0 else 1) * A^GRPO_i,
    w_g = 1 + k (1 - 2 tau)(2 p_g - 1), p_g the group's mean reward in [0, 1].

    lambda_+ < 1 breaks GRPO's +/- symmetry by suppressing the advantage of
    correct trajectories (less sharpening, more exploration). tau in [0, 1]
    is the training progress: at tau = 0 easy groups (p_g > 0.5) are
    up-weighted, at tau = 1 hard ones, moving the focus easy -> hard. By
    default tau is the batch's mean reward (the policy's current competence).

    Reconstructed from the abstract of Yu et al., "Unveiling Implicit Advantage
    Symmetry: Why GRPO Struggles with Exploration and Difficulty Adaptation"
    (2026) ("asymmetrically suppressing the advantages of correct trajectories";
    "prioritizing simpler samples initially before gradually shifting to
    complex ones") and a summary saying the shift is guided by the batch mean
    reward. Unverified: the multiplicative damping, the linear schedule, tau =
    batch mean reward, and every default (lambda_+ = 0.5, k = 0.5). With
    lambda_+ = 1 and k = 0 it is `grpo`.

    Args:
      positive_scale: lambda_+.
      difficulty_strength: k in [0, 1] (keeps w_g >= 0).
      progress: tau; None uses the mean reward of the valid rows (clipped to
        [0, 1]); a Python float or a traced scalar sets it (a schedule does not recompile).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    if not 0.0 <= difficulty_strength <= 1.0:
        raise ValueError(f"difficulty_strength must lie in [0, 1], got {difficulty_strength}")
    base = grpo(rewards, group_ids, num_groups=num_groups, valid=valid, std_ddof=std_ddof, eps=eps)
    damped = jnp.where(base > 0, positive_scale * base, base)
    p = jnp.clip(segments.gather(segments.mean(rewards, group_ids, num_groups, valid), group_ids), 0.0, 1.0)
    tau = masked_mean(rewards, valid) if progress is None else jnp.asarray(progress, rewards.dtype)
    tau = jnp.clip(tau, 0.0, 1.0)
    weight = 1.0 + difficulty_strength * (1.0 - 2.0 * tau) * (2.0 * p - 1.0)
    return weight * damped


# ------------------------------------------------------------------ T-PPO EGAE


def _last_token_onehot(mask: Array) -> Array:
    """One-hot [N, T] of each row's last unmasked token (all zero for an empty row)."""
    t = mask.shape[1]
    positions = jnp.arange(t)
    last = jnp.max(jnp.where(mask > 0, positions, -1), axis=1)
    return (positions[None, :] == last[:, None]).astype(mask.dtype)


@register("token_advantage", "experimental/t_ppo_egae", paper=_TPPO,
          loop=("needs truncated rollouts continued across steps (T-PPO's is_complete and bootstrap values), "
                "which the sampler does not keep"),
          ranges={"gamma": ("in [0, 1]", "the discount factor"), "lam": ("in [0, 1]", "the GAE lambda")})
def t_ppo_egae(
    token_rewards,
    values,
    mask,
    *,
    is_complete,
    bootstrap_values=None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Array, Array]:
    """T-PPO's extended GAE (reconstruction): GAE that bootstraps a truncated response from its value.

    For a complete response it is plain GAE (terminal value 0). For an
    incomplete (truncated) one the TD error at its last generated token L uses
    the value of the state after it instead of 0:
        delta_L = r_L + gamma V_boot - V_L,  A_t = delta_t + gamma lam A_{t+1}.
    V_boot is `bootstrap_values` when given, else V_L (the critic's value at the
    last generated token, a one-step approximation).

    Reconstructed from the abstract of Fan et al., "Truncated Proximal Policy
    Optimization" (2025) ("Extended GAE for advantage estimation derived from
    incomplete responses"). Unverified: the bootstrap choice (V_boot = V_L by
    default) and anything else EGAE may change. gamma = lam = 1 follow verl's PPO.

    Args:
      token_rewards, values, mask: f32[N, T] as for `gae`.
      is_complete: bool[N]; True for responses that ended (stop token), False
        for ones cut at the rollout's length budget.
      bootstrap_values: optional f32[N] value of the state after the last token.

    Returns:
      (advantages, returns) f32[N, T], zero where masked; equal to `gae` when
      every response is complete.
    """
    mask = jnp.asarray(mask)
    check_token_inputs(token_rewards=token_rewards, values=values, mask=mask.astype(jnp.float32))
    token_rewards, values = segments.fill_masked(mask, token_rewards, values)
    mask = mask.astype(values.dtype)
    n = values.shape[0]
    complete = check_valid("is_complete", is_complete, n)
    last = _last_token_onehot(mask)
    if bootstrap_values is None:
        v_boot = (values * last).sum(-1)
    else:
        v_boot = check_floating("bootstrap_values", bootstrap_values)
        if v_boot.shape != (n,):
            raise ValueError(f"bootstrap_values must have shape [N]=[{n}], got {tuple(v_boot.shape)}")
    # Folding gamma * V_boot into the last token's reward makes GAE's terminal
    # delta r_L + 0 - V_L into the bootstrapped r_L + gamma V_boot - V_L.
    bonus = jnp.where(complete, 0.0, gamma * v_boot)[:, None] * last
    return gae(token_rewards + bonus, values, mask, gamma=gamma, lam=lam)


# ------------------------------------------------------------- GRPO-VPS progress


@register("credit", "experimental/grpo_vps_progress", paper=_VPS,
          loop="needs a probing pass (the answer probability after each reasoning segment, GRPO-VPS)",
          ranges={"progress_coef": ("any", "c, the weight of each segment's probe progress")})
def grpo_vps_progress(
    advantages,
    probe_probs,
    segment_ids,
    mask,
    *,
    progress_coef: float = 1.0,
    center: bool = False,
    group_ids=None,
    num_groups: int | None = None,
) -> Array:
    """GRPO-VPS (reconstruction): outcome advantage plus each segment's probe progress, per token.

    Delta_{i,k} = P_{i,k+1} - P_{i,k}, where P_{i,k} = P(correct answer | prompt,
    first k segments of response i) is the probe probability at segment
    boundary k (P_{i,0}: prompt only); then
        A_{i,t} = A_i + c * Delta_{i, seg(t)}.
    With `center=True`, Delta is first centered by its mean over the valid
    segments of the same group (a group-relative progress).

    Reconstructed from the abstract of "GRPO-VPS: Enhancing Group Relative
    Policy Optimization with Verifiable Process Supervision" (2025) ("probe the
    probability of the correct answer at each segment; segment-wise progress
    refines the trajectory-level advantage"). Unverified: the additive
    combination, c = 1, and the centering. c = 0 broadcasts A_i to its tokens.

    Args:
      advantages: f32[N] outcome advantages (e.g. GRPO's).
      probe_probs: f32[N, K+1] probe probabilities at the K+1 boundaries.
      segment_ids: i32[N, T] segment k in [0, K) of each token.
      mask: f32[N, T].
      group_ids, num_groups: needed only for `center=True`.

    Returns:
      f32[N, T] token advantages, zero where masked.
    """
    mask = jnp.asarray(mask)
    check_token_inputs(mask=mask.astype(jnp.float32))
    mask = mask.astype(jnp.float32)
    advantages = check_floating("advantages", advantages)
    n, t = mask.shape
    if advantages.shape != (n,):
        raise ValueError(f"advantages must have shape [N]=[{n}], got {tuple(advantages.shape)}")
    probe_probs = check_floating("probe_probs", probe_probs)
    check_rank("probe_probs", probe_probs, 2, "[N, K+1]")
    if probe_probs.shape[0] != n or probe_probs.shape[1] < 2:
        raise ValueError(f"probe_probs must have shape [N, K+1]=[{n}, >=2], got {tuple(probe_probs.shape)}")
    segment_ids = check_integer("segment_ids", segment_ids)
    if segment_ids.shape != (n, t):
        raise ValueError(f"segment_ids must have shape [N, T]=[{n}, {t}] like mask, got {tuple(segment_ids.shape)}")
    num_segments = probe_probs.shape[1] - 1
    delta = probe_probs[:, 1:] - probe_probs[:, :-1]  # [N, K]
    if center:
        if group_ids is None or num_groups is None:
            raise ValueError("center=True needs group_ids=i32[N] and num_groups")
        group_ids = check_integer("group_ids", group_ids)
        group_ids, in_range = check_group_ids(group_ids, check_num_groups(num_groups))
        # Mean progress of segment k over the group's rows (segments are aligned by index); a row whose
        # group id is out of range (under jit) neither enters a mean nor is centered.
        group_mean = segments.sum(delta, group_ids, num_groups, in_range) / jnp.maximum(
            segments.count(group_ids, num_groups, in_range)[:, None], 1
        )
        delta = delta - jnp.where(in_range[:, None], group_mean[group_ids], 0.0)
    seg = jnp.clip(segment_ids, 0, num_segments - 1)
    token_delta = jnp.take_along_axis(delta, seg, axis=1)
    return jnp.where(mask > 0, advantages[:, None] + progress_coef * token_delta, 0.0)


# ---------------------------------------------------------- Arbitrary-Entropy PO


@register("loss", "experimental/aepo_entropy", paper=_AEPO,
          ranges={"coef": (">= 0", "c, the weight of the regularizer")})
def aepo_entropy(logp, old_logp, advantages, mask, *, coef: float = 1.0, positive_only: bool = False):
    """Arbitrary-Entropy PO regularizer (reconstruction): REINFORCE on samples of a tempered policy.

    l_t = -c A_t log pi_theta(y_t), where y is sampled from the temperature-T
    distribution softmax(z / T) of the current policy and `logp` is its
    log-probability under the training policy (T = 1). It replaces the entropy
    bonus: with T > 1 the samples are flatter than pi, so reinforcing them
    raises entropy, T < 1 lowers it. Hold entropy at a target by adapting T
    with `aepo_temperature_update`. Add this per-token term to the policy loss
    of the ordinary rollouts.

    Reconstructed from the abstract of "Arbitrary Entropy Policy Optimization:
    Entropy Is Controllable in Reinforcement Fine-tuning" (2025) ("replace the
    entropy bonus by REINFORCE on a temperature-adjusted distribution;
    temperature regulated to hold entropy at a target"). Unverified: the
    advantages used for the tempered samples (any estimator over them; all
    ones gives plain likelihood), the absence of importance correction, and
    c = 1. With c = 1 it equals `reinforce`. Title of arXiv 2510.08141 v1
    (later versions: "... Breaks The Exploration Bottleneck of Reinforcement Learning").

    Args:
      coef: c, the weight of the regularizer.
      positive_only: keep only tempered samples with A > 0; a third-party
        summary says negative samples are filtered ("unidirectional
        optimization"), which we could not check, so it is off by default.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    if positive_only:
        adv = jnp.maximum(adv, 0.0)
    log_r = log_ratio(logp, old_logp)
    return -coef * adv * logp * mask, ratio_metrics(jnp.exp(log_r), mask, log_r)


def aepo_temperature_update(
    temperature,
    entropy,
    *,
    target_entropy: float,
    step_size: float = 0.1,
    min_temperature: float = 0.5,
    max_temperature: float = 2.0,
) -> Array:
    """AEPO's temperature controller (reconstruction): log T <- log T + eta (H_target - H), clipped.

    Raises T while the policy's entropy H is below target, lowers it above.
    Multiplicative in T so it stays positive. Unverified: the update law and
    the defaults (eta = 0.1, T in [0.5, 2]); a pure scalar function for the trainer.
    """
    if not 0 < min_temperature <= max_temperature:
        raise ValueError(f"need 0 < min_temperature <= max_temperature, got {min_temperature}, {max_temperature}")
    log_t = jnp.log(jnp.asarray(temperature, jnp.float32)) + step_size * (target_entropy - jnp.asarray(entropy, jnp.float32))
    return jnp.clip(jnp.exp(log_t), min_temperature, max_temperature)


# ---------------------------------------------------------------------- GRPO-λ


def _length_rewards(correct, lengths, group_ids, num_groups, valid):
    """Kimi k1.5's group length reward: 0.5 - (len - min_g)/(max_g - min_g); min(0, .) if wrong."""
    lo = segments.gather(segments.min(lengths, group_ids, num_groups, valid), group_ids)
    hi = segments.gather(segments.max(lengths, group_ids, num_groups, valid), group_ids)
    spread = hi - lo
    has_spread = jnp.isfinite(spread) & (spread > 0)
    score = jnp.where(has_spread, 0.5 - (lengths - lo) / jnp.where(has_spread, spread, 1.0), 0.0)
    return jnp.where(correct > 0.5, score, jnp.minimum(score, 0.0))


@register("reward", "experimental/grpo_lambda", paper=_LAMBDA, ranges={
    "top_fraction": ("in [0, 1]", "lambda, the fraction of groups given the length penalty"),
    "length_weight": (">= 0", "w, the weight of the length reward"),
})
def grpo_lambda(
    correct,
    lengths,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    top_fraction: float = 0.2,
    length_weight: float = 1.0,
) -> Array:
    """GRPO-λ (reconstruction): length-penalized reward only for the groups with the highest correctness.

    c_g = mean correctness of group g. The ceil(lambda G_valid) valid groups with
    the largest c_g (ties broken by group index) get
        r_i = correct_i + w * len_reward_i  (Kimi k1.5's length reward:
        0.5 - (len_i - min_g)/(max_g - min_g) if correct, min(0, that) if wrong),
    every other group gets the plain 0/1 reward r_i = correct_i.

    Reconstructed from the abstract of Dai et al., "Stable Reinforcement
    Learning for Efficient Reasoning" (2025) ("a low correctness ratio triggers
    a switch to length-agnostic 0/1 rewards; a high ratio maintains length
    penalties") and a summary describing a batch-wise top-lambda selection of
    groups. Unverified: the top-fraction rule (vs a fixed threshold), the
    length reward form, lambda = 0.2 and w = 1. top_fraction = 0 gives the
    plain 0/1 rewards.

    Args:
      correct: f32[N] 0/1 correctness.
      lengths: f32[N] completion lengths in tokens.
      top_fraction: lambda in [0, 1].
      length_weight: w.

    Returns:
      f32[N] rewards (0 for invalid rows).
    """
    correct, group_ids, valid, num_groups = check_outcome_inputs(correct, group_ids, num_groups, valid)
    lengths = check_floating("lengths", jnp.asarray(lengths, jnp.float32))
    if lengths.shape != correct.shape:
        raise ValueError(f"lengths must have shape [N]=[{correct.shape[0]}] like correct, got {tuple(lengths.shape)}")
    if not 0.0 <= top_fraction <= 1.0:
        raise ValueError(f"top_fraction must lie in [0, 1], got {top_fraction}")
    n_rows = segments.count(group_ids, num_groups, valid)
    group_valid = n_rows > 0
    ratio = jnp.where(group_valid, segments.mean(correct, group_ids, num_groups, valid), -jnp.inf)
    # Rank of each group: how many valid groups come before it in (ratio desc, index asc).
    idx = jnp.arange(num_groups)
    before = (ratio[None, :] > ratio[:, None]) | ((ratio[None, :] == ratio[:, None]) & (idx[None, :] < idx[:, None]))
    rank = (before & group_valid[None, :]).sum(-1)
    k = jnp.ceil(top_fraction * group_valid.sum() - 1e-6)
    penalized = group_valid & (rank < k)
    length_reward = _length_rewards(correct, lengths, group_ids, num_groups, valid)
    rewards = correct + jnp.where(segments.gather(penalized, group_ids), length_weight * length_reward, 0.0)
    return jnp.where(valid, rewards, 0.0)


# --------------------------------------------------------------------- ConciseR


@register("reward", "experimental/conciser_length_reward", paper=_CONCISER, ranges={
    "max_len": (">= 1", "L_max, the length in tokens at which the bonus reaches 0"),
    "length_coef": (">= 0", "beta, the weight of the length bonus"),
})
def conciser_length_reward(
    correct,
    lengths,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    max_len: int = 8192,
    length_coef: float = 1.0,
) -> Array:
    """ConciseR stage 2 (reconstruction): a length reward only when every rollout of the prompt is correct.

    r_i = correct_i + beta (1 - len_i / L_max) if all valid rows of i's group are
    correct, else r_i = correct_i. Lengths beyond L_max earn no bonus (clipped
    at 0). Shorter correct answers then get positive GRPO advantages in solved
    groups, while groups still being learned keep the accuracy-only signal.

    Reconstructed from the abstract of Song & Zheng, "Walk Before You Run!
    Concise LLM Reasoning via Reinforcement Learning" (2025) ("length reward
    applied only when all rollouts of a prompt are correct"). Unverified: the
    linear bonus, beta = 1 and L_max = 8192 (set L_max to the rollout's length
    budget). length_coef = 0 gives the plain 0/1 rewards.

    Args:
      correct: f32[N] 0/1 correctness.
      lengths: f32[N] completion lengths in tokens.
      max_len: L_max.
      length_coef: beta.
    """
    correct, group_ids, valid, num_groups = check_outcome_inputs(correct, group_ids, num_groups, valid)
    lengths = check_floating("lengths", jnp.asarray(lengths, jnp.float32))
    if lengths.shape != correct.shape:
        raise ValueError(f"lengths must have shape [N]=[{correct.shape[0]}] like correct, got {tuple(lengths.shape)}")
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")
    all_correct = segments.min(correct, group_ids, num_groups, valid) > 0.5  # an empty group's +inf is never gathered
    bonus = length_coef * jnp.clip(1.0 - lengths / max_len, 0.0, 1.0)
    rewards = correct + jnp.where(segments.gather(all_correct, group_ids), bonus, 0.0)
    return jnp.where(valid, rewards, 0.0)


# ------------------------------------------------------------------------ TraPO


@register("selection", "experimental/trapo_selection", paper=_TRAPO,
          loop="needs a labeled and an unlabeled prompt pool with pass rates tracked across steps (TRAPO)",
          ranges={"top_fraction": ("in [0, 1]", "the fraction of unlabeled prompts kept by similarity rank"),
                  "min_similarity": ("in [-1, 1]", "the cosine similarity above which a prompt is kept")})
def trapo_selection(
    unlabeled_pass_rates,
    labeled_pass_rates,
    *,
    top_fraction: float = 0.1,
    min_similarity: float = 0.4,
    unlabeled_valid=None,
    labeled_valid=None,
) -> tuple[Array, Array]:
    """TraPO's selector of unlabeled prompts whose pass-rate trajectory resembles the labeled ones.

    sim_u = mean over labeled prompts l of cos(traj_u, traj_l), where a
    trajectory is a prompt's pass rate (against majority-vote pseudo-labels for
    unlabeled prompts) over the last E epochs. Keep u if it is in the top
    `top_fraction` by similarity or has sim_u >= `min_similarity`.

    The rule "top-10% ∪ sim ≥ 0.4" is the TraPO repository's; the aggregation over labeled
    prompts (mean cosine) is our reading and unverified.

    Args:
      unlabeled_pass_rates: f32[U, E].
      labeled_pass_rates: f32[L, E].

    Returns:
      (keep bool[U], similarity f32[U]).
    """
    unl = check_floating("unlabeled_pass_rates", unlabeled_pass_rates)
    lab = check_floating("labeled_pass_rates", labeled_pass_rates)
    check_rank("unlabeled_pass_rates", unl, 2, "[U, E]")
    check_rank("labeled_pass_rates", lab, 2, "[L, E]")
    if unl.shape[1] != lab.shape[1]:
        raise ValueError(f"both trajectories need the same number of epochs E, got {unl.shape[1]} and {lab.shape[1]}")
    u_valid = check_valid("unlabeled_valid", unlabeled_valid, unl.shape[0])
    l_valid = check_valid("labeled_valid", labeled_valid, lab.shape[0])

    def unit(x):
        norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
        return jnp.where(norm > 0, x / jnp.where(norm > 0, norm, 1.0), 0.0)

    cos = unit(unl) @ unit(lab).T  # [U, L]
    sim = masked_mean(cos, jnp.broadcast_to(l_valid[None, :], cos.shape), axis=1)
    sim = jnp.where(u_valid, sim, -jnp.inf)
    # Top fraction of the valid prompts; invalid ones sort last (similarity -inf).
    k = jnp.ceil(top_fraction * u_valid.sum() - 1e-6)
    order = jnp.argsort(-sim, stable=True)
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(unl.shape[0], dtype=order.dtype))
    keep = u_valid & ((rank < k) | (sim >= min_similarity))
    return keep, jnp.where(u_valid, sim, 0.0)
