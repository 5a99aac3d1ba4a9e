"""Token-level advantages and returns (kind "token_advantage"): GAE, discounted returns, masked whitening, OTB.

Arrays are [N, T] with a token mask; masked positions are skipped (they neither
receive credit nor pass it on) and get 0. Their inputs are replaced by 0 before
any arithmetic (`segments.fill_masked`), so NaN or inf there reaches neither the
outputs nor the gradients.

Also the optimal token baseline (OTB) and the reconstruction of T-PPO's extended GAE on truncated responses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.registry import register
from jaxgrpo.kernels.validation import (
    check_floating,
    check_group_ids,
    check_num_groups,
    check_token_inputs,
    check_valid,
)

Array = jax.Array


GAMMA = ("in [0, 1]", "the discount factor")
LAMBDA = ("in [0, 1]", "the GAE lambda")


def masked_whiten(x, mask, *, shift_mean: bool = True, eps: float = 1e-8) -> Array:
    """(x - mean) / sqrt(var + eps) over the masked entries of the whole batch (unbiased var).

    With `shift_mean=False` the mean is added back (only the scale changes).
    Masked entries are returned as 0. Finite for any finite x (the statistics
    are taken on x scaled by a power of two, see `segments.masked_standardize`).
    """
    mask = jnp.asarray(mask)
    check_token_inputs(x=x, mask=mask.astype(jnp.float32))
    white = segments.masked_standardize(x, mask, ddof=1, eps=eps, eps_inside=True)
    if not shift_mean:
        white = white + segments.masked_mean(x, mask)
    return jnp.where(mask != 0, white, 0.0)


def _reverse_scan(step, init, *xs):
    """lax.scan over the time axis (axis 1 of [N, T] inputs), from the last token back."""
    _, out = jax.lax.scan(step, init, tuple(x.T for x in xs), reverse=True)
    return tuple(o.T for o in out) if isinstance(out, tuple) else out.T


@register("token_advantage", "discounted_returns", paper="Reinforcement Learning: An Introduction, Sutton & Barto (2018)",
          ranges={"gamma": GAMMA})
def discounted_returns(token_rewards, mask, *, gamma: float = 1.0) -> Array:
    """Reward-to-go G_t = sum_{k >= t} gamma^(k-t) r_k over the unmasked tokens.

    Masked tokens are skipped: they add no reward and no discount step.

    Reference: Sutton & Barto, "Reinforcement Learning: An Introduction" (2018).
    """
    mask = jnp.asarray(mask)
    check_token_inputs(token_rewards=token_rewards, mask=mask.astype(jnp.float32))
    token_rewards = segments.fill_masked(mask, token_rewards)
    mask = mask.astype(token_rewards.dtype)

    def step(carry, inputs):
        r, m = inputs
        g = r + gamma * carry
        return jnp.where(m > 0, g, carry), g * m

    return _reverse_scan(step, jnp.zeros(token_rewards.shape[0], token_rewards.dtype), token_rewards, mask)


@register("token_advantage", "reinforce_pp_returns", paper="REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models (2025)",
          ranges={"gamma": GAMMA, "eps": ("> 0", "added to the variance of the token whitening")})
def reinforce_pp_returns(token_rewards, mask, *, gamma: float = 1.0, eps: float = 1e-8) -> Array:
    """REINFORCE++ token advantages: discounted returns whitened over the global batch.

    A_t = (G_t - mean) / sqrt(var + eps), G_t = sum_{k >= t} gamma^(k-t) r_k, with
    mean and (unbiased) var over every unmasked token of the batch.

    Fold a KL penalty into `token_rewards` first (r_t - beta * k1_t) as the paper does.

    Paper: Hu, "REINFORCE++" (2025); whitening as in verl.
    """
    return masked_whiten(discounted_returns(token_rewards, mask, gamma=gamma), mask, eps=eps)


@register("token_advantage", "gae", paper="High-Dimensional Continuous Control Using Generalized Advantage Estimation (2016)",
          ranges={"gamma": GAMMA, "lam": LAMBDA})
def gae(token_rewards, values, mask, *, gamma: float = 1.0, lam: float = 1.0) -> tuple[Array, Array]:
    """Generalized advantage estimation over the unmasked tokens.

    delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lam A_{t+1};
    returns R_t = A_t + V_t. t+1 is the next *unmasked* token (0 past the end).
    The advantages are not whitened: apply `masked_whiten` as PPO does.

    Args:
      token_rewards: f32[N, T]; values: f32[N, T]; mask: f32[N, T].
      gamma, lam: discount and GAE lambda; 1.0 and 1.0 as in verl.

    Returns:
      (advantages f32[N, T], returns f32[N, T]), zero where masked.

    Paper: Schulman et al., "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation" (2016).
    """
    mask = jnp.asarray(mask)
    check_token_inputs(token_rewards=token_rewards, values=values, mask=mask.astype(jnp.float32))
    token_rewards, values = segments.fill_masked(mask, token_rewards, values)
    mask = mask.astype(values.dtype)

    def step(carry, inputs):
        next_value, next_adv = carry
        r, v, m = inputs
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        keep = m > 0
        return (jnp.where(keep, v, next_value), jnp.where(keep, adv, next_adv)), adv * m

    zeros = jnp.zeros(values.shape[0], values.dtype)
    advantages = _reverse_scan(step, (zeros, zeros), token_rewards, values, mask)
    return advantages, (advantages + values) * mask


@register("token_advantage", "optimal_token_baseline", paper="The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL (2026)",
          ranges={"eps": ("> 0", "added to the baseline's denominator")},
          loop=("needs the sum over the vocabulary of pi^2 at each token, which the trainer's vocabulary-chunked "
                "scoring does not compute"))
def optimal_token_baseline(
    token_rewards,
    mask,
    group_ids,
    old_logp,
    sum_pi_squared,
    *,
    num_groups: int,
    valid=None,
    is_weights=None,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> tuple[Array, Array]:
    """Optimal token baseline (OTB): a baseline per position t, weighted by the path's cumulative gradient norm.

    G_{i,t} = sum_{s >= t} r_{i,s} (returns), w_{i,t} = 1 - 2 pi_old(y_t) + sum_v pi_old(v)^2
    (the squared norm of the logit gradient of log pi(y_t)), W_{i,t} = sum_{s <= t} w_{i,s};
    per group and position, B_t = sum_i G_{i,t} W_{i,t} m_{i,t} / (sum_i W_{i,t} m_{i,t} + eps),
    over the group's valid rows, and A_{i,t} = (G_{i,t} - B_t) m_{i,t}. A group with
    one valid row gets B = 0 (A = G). With truncated importance weights rho_t
    (`is_weights`), w is scaled by rho_t^2. With `handle_zero_tail`, the one
    longest row of a group (when a single row is the longest) gets B = 0 past
    the second-longest row's length, where the baseline would be its own return.

    Args:
      token_rewards: f32[N, T] rewards (an outcome reward sits on the last token).
      mask: f32[N, T] completion mask.
      group_ids: i32[N] prompt of each row, in [0, num_groups).
      old_logp: f32[N, T] log pi_old(y_t) of the sampling policy.
      sum_pi_squared: f32[N, T] sum over the vocabulary of pi_old(v)^2 at each
        position (the sampler must record it: the trainer does not compute it).
      valid: optional bool[N]; invalid rows get 0 and stay out of the baselines.
      is_weights: optional f32[N, T] rollout importance weights.
      handle_zero_tail: True, as the paper's authors set verl's default
        (verl 8acd940, 2026-02; it was False before). False gives every
        position of every row the group's baseline.
      eps: 1e-8 as verl.

    Returns:
      (advantages, returns), both f32[N, T], 0 at masked-out tokens.

    Paper: Li et al., "The Optimal Token Baseline: Variance Reduction for
    Long-Horizon LLM-RL" (2026); verl's `optimal_token_baseline`.
    """
    mask = jnp.asarray(mask)
    check_token_inputs(token_rewards=token_rewards, mask=mask.astype(jnp.float32), old_logp=old_logp,
                       sum_pi_squared=sum_pi_squared, is_weights=is_weights)
    group_ids = jnp.asarray(group_ids)
    n = token_rewards.shape[0]
    if group_ids.shape != (n,) or not jnp.issubdtype(group_ids.dtype, jnp.integer):
        raise ValueError(f"group_ids must be integers of shape [N]=[{n}], got {group_ids.dtype}{tuple(group_ids.shape)}")
    group_ids, in_range = check_group_ids(group_ids, check_num_groups(num_groups))
    valid = in_range if valid is None else jnp.asarray(valid).astype(bool) & in_range
    on = (mask != 0) & valid[:, None]
    token_rewards, old_logp, sum_pi_squared = segments.fill_masked(on, token_rewards, old_logp, sum_pi_squared)
    m = on.astype(token_rewards.dtype)
    returns = jnp.flip(jnp.cumsum(jnp.flip(token_rewards * m, -1), -1), -1)
    w = 1.0 - 2.0 * jnp.exp(jnp.minimum(old_logp, 0.0)) + sum_pi_squared
    if is_weights is not None:
        w = w * jnp.square(segments.fill_masked(on, is_weights))
    cumulative = jnp.cumsum(w * m, -1)
    per_group = lambda x: jax.ops.segment_sum(x, group_ids, num_segments=num_groups)
    baseline = per_group(returns * cumulative * m) / (per_group(cumulative * m) + eps)
    rows = per_group(valid.astype(token_rewards.dtype))
    baseline = jnp.where(rows[:, None] > 1, baseline, 0.0)
    baseline = jnp.take(baseline, group_ids, axis=0, mode="clip")
    if handle_zero_tail:
        length = jnp.where(valid, m.sum(-1), -1.0)
        longest = jax.ops.segment_max(length, group_ids, num_segments=num_groups)
        is_longest = valid & (length == jnp.take(longest, group_ids, mode="clip"))
        count = jax.ops.segment_sum(is_longest.astype(jnp.int32), group_ids, num_segments=num_groups)
        second = jax.ops.segment_max(jnp.where(is_longest, -1.0, length), group_ids, num_segments=num_groups)
        tail = is_longest & (jnp.take(count, group_ids, mode="clip") == 1)
        tail = tail[:, None] & (jnp.arange(m.shape[1])[None, :] >= jnp.take(second, group_ids, mode="clip")[:, None])
        baseline = jnp.where(tail, 0.0, baseline)
    advantages = (returns - baseline) * m
    return jax.lax.stop_gradient(advantages), jax.lax.stop_gradient(returns * m)


# ------------------------------------------------------------------ T-PPO EGAE


_TPPO = "Truncated Proximal Policy Optimization (2025)"


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
