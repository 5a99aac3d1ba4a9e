"""Loss masks (kind "mask"): off-policy sequences, high-entropy tokens, MC-GRPO's pivot rollouts.

`off_policy_sequence_mask` and `high_entropy_token_mask` return a constant
(stop-gradient) f32[N, T] mask, 0 at masked-out tokens; multiply the per-token
loss by it (or pass `mask * keep` to the loss). Masked-out inputs are replaced
before any arithmetic, so NaN or inf there does not reach the result.
`mc_grpo_pivot_mask` returns a row mask bool[N] for the token mask's rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import papers
from jaxgrpo.kernels.losses.common import MAX_LOG_RATIO
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.segments import fill_masked, lower_median_rows
from jaxgrpo.kernels.validation import broadcast_advantages, check_outcome_inputs, check_token_inputs

Array = jax.Array


@register("mask", "off_policy_sequence_mask", paper="DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models (2025)",
          ranges={"threshold": (">= 0", "delta, the bound on the sequence's mean KL")},
          loop=("needs the trained policy's log-probs and the advantages at each token; the loss_mask stage masks"
                " rows of rewards and groups before the advantages"))
def off_policy_sequence_mask(logp, sampler_logp, advantages, mask, *, threshold: float) -> Array:
    """Off-policy sequence masking: drop negative-advantage sequences that drifted too far.

    keep_i = A_i >= 0 or (1/|o_i|) sum_t (log pi_sampler(y_t) - log pi(y_t)) <= threshold,
    the mean over the unmasked tokens of sequence i of the k1 estimate of
    KL(pi_sampler || pi). A positive advantage is always kept: only pushing
    down a sample the policy has moved away from is judged harmful.

    Args:
      logp: f32[N, T] log-probs under the policy being trained (read as a constant).
      sampler_logp: f32[N, T] log-probs under the policy that sampled (the
        inference engine's, or pi_old's).
      advantages: f32[N] or f32[N, T]; with token advantages the test is per token.
      mask: f32[N, T] token mask.
      threshold: delta, the mean-KL bound (no default: the paper gives none).

    Returns:
      f32[N, T] keep mask (1 or 0), 0 at masked-out tokens, without gradient.

    Paper: DeepSeek-AI, "DeepSeek-V3.2: Pushing the Frontier of Open Large
    Language Models" (2025), Eq. 9.
    """
    mask = jnp.asarray(mask)
    check_token_inputs(logp=logp, sampler_logp=sampler_logp, mask=mask.astype(jnp.float32))
    logp, sampler_logp, adv = fill_masked(mask, logp, sampler_logp, broadcast_advantages(advantages, logp))
    mask = mask.astype(logp.dtype)
    drift = jnp.clip(sampler_logp - jax.lax.stop_gradient(logp), -MAX_LOG_RATIO, MAX_LOG_RATIO)
    mean_drift = (drift * mask).sum(-1, keepdims=True) / jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
    keep = (adv >= 0) | (mean_drift <= threshold)
    return jax.lax.stop_gradient(keep.astype(logp.dtype) * mask)


@register("mask", "high_entropy_token_mask", paper="Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM Reasoning (2025)",
          ranges={"top_quantile": ("in (0, 1]", "rho, the fraction of tokens kept")},
          loop="needs the update's entropy at each token; the loss_mask stage masks rows before the update")
def high_entropy_token_mask(entropy, mask, *, top_quantile: float = 0.2) -> Array:
    """Keep only the highest-entropy tokens ("forking tokens") in the policy loss.

    keep_t = H_t >= q, q = the (1 - top_quantile) quantile (linear
    interpolation, as `torch.quantile`) of H over every unmasked token of the
    batch. top_quantile = 1 keeps every token; 0 keeps the highest only (and ties).

    Args:
      entropy: f32[N, T] per-token entropy of the policy (e.g. `entropy_from_logits`).
      mask: f32[N, T] token mask.
      top_quantile: rho, the fraction of tokens kept; 0.2 as in the paper.

    Returns:
      f32[N, T] keep mask (1 or 0), 0 at masked-out tokens and everywhere when
      no token is unmasked, without gradient.

    Paper: Wang et al., "Beyond the 80/20 Rule: High-Entropy Minority Tokens
    Drive Effective Reinforcement Learning for LLM Reasoning" (2025).
    """
    if not 0.0 <= top_quantile <= 1.0:
        raise ValueError(f"top_quantile must lie in [0, 1], got {top_quantile}")
    mask = jnp.asarray(mask)
    check_token_inputs(entropy=entropy, mask=mask.astype(jnp.float32))
    entropy = jax.lax.stop_gradient(fill_masked(mask, entropy))
    counted = mask != 0
    # The quantile of the unmasked entries only: masked ones are NaN, which nanquantile skips.
    cutoff = jnp.nanquantile(jnp.where(counted, entropy, jnp.nan), 1.0 - top_quantile, method="linear")
    keep = counted & (entropy >= cutoff)
    return keep.astype(entropy.dtype)


# --------------------------------------------------------------------- MC-GRPO

# MC-GRPO's advantage, `mc_grpo`, is in `jaxgrpo.kernels.advantages.group_normalized`.
@register("mask", "mc_grpo_pivot_mask", paper=papers.MC_GRPO)
def mc_grpo_pivot_mask(rewards, group_ids, *, num_groups: int, valid=None) -> Array:
    """MC-GRPO's loss mask: bool[N], True for valid rows except each group's median (pivot) rollout.

    The pivot is the row `mc_grpo` centers on (lower median; first in batch
    order among ties). Multiply the token mask by `mask[:, None]`.

    Paper: Kim, "MC-GRPO" (2026); code MC-GRPO da07745 (`median_mask`).
    """
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    pivot, nonempty = lower_median_rows(rewards, group_ids, num_groups, valid)
    is_pivot = jnp.zeros(rewards.shape, jnp.int32).at[pivot].max(nonempty.astype(jnp.int32)) > 0
    return valid & ~is_pivot
