"""Batch-whitened advantages: REINFORCE++ (without and with a group baseline) and single-stream SPO.

The rewards, or the rewards minus a baseline, are whitened over the whole batch, (x - mean) / sqrt(var + eps),
with no per-group scale. `whitened` weighs each row by its completion tokens (REINFORCE++'s and verl's token
whitening) or counts every row once.

Every estimator follows the outcome-estimator contract of `jaxgrpo.kernels.advantages`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import papers, segments
from jaxgrpo.kernels.advantages.common import checked_lengths, group_centered
from jaxgrpo.kernels.registry import register, register_advantage
from jaxgrpo.kernels.validation import check_floating, check_outcome_inputs

Array = jax.Array


# Declared ranges of the whitening (`jaxgrpo.kernels.hyperparameters`).
WHITEN_EPS = ("> 0", "added to the batch variance so that constant rewards do not divide by 0")
WHITEN = ("one of tokens, rows", "what the batch whitening weighs: each token or each row")


WHITEN_MODES = ("tokens", "rows")


def batch_whiten(x: Array, valid: Array, *, ddof: int = 1, eps: float = 1e-8) -> Array:
    """(x - mean) / sqrt(var + eps) over the valid rows of the whole batch; 0 for invalid rows."""
    return segments.masked_standardize(x, valid, ddof=ddof, eps=eps, eps_inside=True)


def whitened(x: Array, valid: Array, *, mode: str = "tokens", lengths: Array | None = None, eps: float = 1e-8) -> Array:
    """Batch whitening (x - mean) / sqrt(var + eps), unbiased variance, over tokens or over rows.

    `mode="tokens"` weights each row by its number of completion tokens
    (`lengths`), which is the whitening of a row-constant advantage broadcast
    over its tokens with the completion mask (REINFORCE++'s and verl's
    `masked_whiten`): mean = sum_i l_i x_i / L, var = sum_i l_i (x_i - mean)^2 / (L - 1),
    L = sum_i l_i. Without `lengths` every row counts as one token, which is
    `mode="rows"`: each valid row weighs 1 whatever its length. A row with no
    token gets 0.
    """
    if mode not in WHITEN_MODES:
        raise ValueError(f"whiten must be one of {', '.join(WHITEN_MODES)}, got {mode!r}")
    weight = valid.astype(x.dtype)
    if mode == "tokens" and lengths is not None:
        weight = weight * lengths
    return segments.masked_standardize(x, weight, ddof=1, eps=eps, eps_inside=True)


@register_advantage("reinforce_pp", paper="REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models (2025)",
                    ranges={"eps": WHITEN_EPS, "whiten": WHITEN})
def reinforce_pp(
    rewards, group_ids, *, num_groups: int, valid=None, eps: float = 1e-8, whiten: str = "tokens", lengths=None
) -> Array:
    """REINFORCE++ advantage: the rewards whitened over the global batch.

    A_i = (r_i - mean) / sqrt(var + eps), unbiased variance; groups are ignored
    (no per-prompt baseline). With `whiten="tokens"` (the default, as the paper
    and verl: the advantage of every completion token is whitened) mean and
    variance are taken over the tokens of the batch, each row weighted by its
    length; with `whiten="rows"` over the valid rows, each row weighing 1. The
    two agree only when every row has the same number of tokens, up to the
    unbiased variance's (L - 1) vs (N - 1). For token-level returns with a KL
    term folded into the reward, use `discounted_returns` and `masked_whiten`.

    Args:
      whiten: "tokens" or "rows".
      lengths: f32[N] completion tokens per row (the trainer passes them); without
        them every row counts as one token, i.e. row whitening.

    Paper: Hu, "REINFORCE++" (2025); eps and the unbiased variance follow verl.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    lengths = checked_lengths(lengths, rewards.shape[0], valid)
    return jnp.where(valid, whitened(rewards, valid, mode=whiten, lengths=lengths, eps=eps), 0.0)


@register_advantage("reinforce_pp_baseline", paper="REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models (2025)",
                    ranges={"eps": WHITEN_EPS, "whiten": WHITEN})
def reinforce_pp_baseline(
    rewards, group_ids, *, num_groups: int, valid=None, eps: float = 1e-8, whiten: str = "tokens", lengths=None
) -> Array:
    """REINFORCE++ with a group baseline: subtract the group mean, then whiten over the batch.

    A_i = whiten_batch(r_i - b_g), b_g the mean of the valid rows of i's group,
    except that a group with a single valid row keeps its raw reward (b_g = 0),
    as verl does; that row then enters the batch statistics with r_i, which
    changes every row's whitened advantage. Whitening is over tokens (default,
    the paper and verl) or rows, as in `reinforce_pp`.

    Args:
      whiten: "tokens" or "rows".
      lengths: f32[N] completion tokens per row (the trainer passes them); without
        them every row counts as one token, i.e. row whitening.

    Paper: Hu, "REINFORCE++" (2025); the baseline variant and single-row groups as in verl.
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    lengths = checked_lengths(lengths, rewards.shape[0], valid)
    n = segments.gather(segments.count(group_ids, num_groups, valid), group_ids)
    centered = jnp.where(n > 1, group_centered(rewards, group_ids, num_groups, valid), rewards)
    return jnp.where(valid, whitened(centered, valid, mode=whiten, lengths=lengths, eps=eps), 0.0)


# ----------------------------------------------------------- single-stream SPO

# SPO's value tracker and prioritized sampling, `spo_value_tracker` and `spo_priority`, are in
# `jaxgrpo.kernels.selection`.


@register("advantage", "experimental/spo_advantage", paper=papers.SPO,
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
