"""Advantages reshaped from a base estimator's: XRPO's novelty bonus and A-GRAE's asymmetric, scheduled GRPO.

Each starts from another estimator's advantage (any registered estimator that reads only the rewards, for
XRPO; GRPO's, for A-GRAE) and reshapes it row by row.

Every estimator follows the outcome-estimator contract of `jaxgrpo.kernels.advantages`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.advantages.common import STD_DDOF, STD_EPS, _check_row_array
from jaxgrpo.kernels.advantages.group_normalized import grpo
from jaxgrpo.kernels.registry import get_advantage, register, register_advantage
from jaxgrpo.kernels.segments import masked_mean
from jaxgrpo.kernels.validation import check_outcome_inputs

Array = jax.Array


# ------------------------------------------------------------- XRPO sharpening


#: The estimators XRPO can sharpen: those that read nothing beyond (rewards, group_ids, num_groups, valid).
XRPO_BASES = ("grpo", "dr_grpo", "rloo", "gpg", "pass_at_k", "reinforce_pp", "reinforce_pp_baseline", "grpo_batch_std",
              "asymre", "bnpo", "dgpo", "krpo", "mc_grpo", "ngrpo", "opmd", "experimental/a_grae")


@register_advantage(
    "xrpo",
    paper="XRPO: Pushing the limits of GRPO with Targeted Exploration and Exploitation (2025)",
    experimental=True,  # formula from a third-party re-implementation
    ranges={"base": ("one of " + ", ".join(XRPO_BASES), "the base advantage estimator, one that reads only the rewards"),
            "novelty_weight": (">= 0", "lambda, the scale of the novelty bonus"),
            "clip_ratio": (">= 0", "kappa, the bonus's cap as a fraction of |A|")},
    group_relative=True,
)
def xrpo(
    rewards,
    group_ids,
    *,
    num_groups: int,
    valid=None,
    seq_logp,
    base: str = "grpo",
    novelty_weight: float = 1.0,
    clip_ratio: float = 1.0,
    positive_only: bool = True,
) -> Array:
    """Novelty-aware advantage sharpening (XRPO) on top of a base estimator.

    s_i = seq_logp_i (mean token log-likelihood), eta_i = exp(s_i - mean_g s),
    A+_i = A_i + min(max(lambda (1 - eta_i), 0), kappa |A_i|): unlikely (novel)
    rollouts get a bonus bounded by kappa |A_i|.

    Reconstruction from a third-party re-implementation (grpo-composer): lambda =
    kappa = 1; `positive_only=True` (default) adds the bonus only where A_i > 0,
    the paper's "novel yet correct" responses; False applies the formula to all
    rows (negative advantages of novel rollouts move toward 0).

    Args:
      seq_logp: f32[N] length-normalized sequence log-likelihood under the
        current policy; treated as a constant (stop_gradient).
      base: registry name of the base advantage estimator, called with its defaults.

    Paper: "XRPO: Pushing the limits of GRPO with Targeted Exploration and
    Exploitation" (2025).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    seq_logp = jax.lax.stop_gradient(_check_row_array("seq_logp", seq_logp, rewards.shape[0], valid=valid))
    adv = get_advantage(base)(rewards, group_ids, num_groups=num_groups, valid=valid)
    mean_s = segments.gather(segments.mean(seq_logp, group_ids, num_groups, valid), group_ids)
    eta = jnp.exp(jnp.clip(seq_logp - mean_s, -50.0, 50.0))
    bonus = jnp.minimum(jnp.maximum(novelty_weight * (1.0 - eta), 0.0), clip_ratio * jnp.abs(adv))
    if positive_only:
        bonus = jnp.where(adv > 0, bonus, 0.0)
    return jax.lax.stop_gradient(jnp.where(valid, adv + bonus, 0.0))


# ---------------------------------------------------------------------- A-GRAE


_AGRAE = "Unveiling Implicit Advantage Symmetry: Why GRPO Struggles with Exploration and Difficulty Adaptation (2026)"


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
