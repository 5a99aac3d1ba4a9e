"""Losses on sequence-level ratios and scores: GSPO, GMPO, VESPO, DHPO and DisCO.

GSPO clips the length-normalized sequence ratio s_i = (pi / pi_old)^(1/|o_i|) (GSPO-token gives each token its
own gradient); GMPO clips the token log-ratios before their geometric mean. VESPO instead reshapes the
*product* of the token ratios, W_i = prod_t pi(y_t) / pi_old(y_t), with a smooth weight that is a constant of
the gradient (REINFORCE form), so no token's gradient is dropped. DHPO (a reconstruction) mixes token and
sequence ratios in one clipped surrogate. DisCO scores whole responses (their mean log-likelihood or ratio)
in a discriminative objective per question.

Every loss follows the policy-loss contract of `jaxgrpo.kernels.losses`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.losses.common import MAX_LOG_RATIO, log_ratio, prepare, ratio_metrics
from jaxgrpo.kernels.registry import register, register_loss
from jaxgrpo.kernels.segments import fill_masked, masked_mean
from jaxgrpo.kernels.validation import check_outcome_inputs, check_token_inputs

Array = jax.Array


# ------------------------------------------------------------------------ GSPO


#: GSPO's bound on the sequence log-ratio, as verl's: s_i <= e^10, so |A| s_i stays below |A| e^10.
MAX_SEQUENCE_LOG_RATIO = 10.0
_GSPO_RANGES = {"eps_low": (">= 0", "the lower clip epsilon of the sequence ratio"),
                "eps_high": (">= 0", "the upper clip epsilon of the sequence ratio"),
                "max_seq_log_ratio": ("> 0", "the clamp of the sequence log-ratio")}


def _sequence_log_ratio(logp, old_logp, mask):
    """Mean token log-ratio of each sequence, f32[N, 1]."""
    log_r = log_ratio(logp, old_logp)
    return ((log_r * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1))[:, None]


def _gspo_surrogate(seq_ratio, adv, mask, eps_low, eps_high):
    unclipped = -adv * seq_ratio
    clipped = -adv * jnp.clip(seq_ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(unclipped, clipped)
    is_clipped = (clipped > unclipped).astype(seq_ratio.dtype)
    metrics = {"clip_fraction": masked_mean(is_clipped, mask)}
    metrics.update(ratio_metrics(seq_ratio, mask))
    return loss * mask, metrics


@register_loss("gspo", paper="Group Sequence Policy Optimization (2025)", ranges=_GSPO_RANGES)
def gspo(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_seq_log_ratio: float = MAX_SEQUENCE_LOG_RATIO,
):
    """GSPO: PPO clipping on the sequence-level geometric-mean ratio.

    s_i = exp(min((1/|o_i|) sum_t log rho_{i,t}, M)); every token of sequence i
    carries l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), so the
    `seq_mean_token_mean` aggregation gives the paper's -(1/G) sum_i min(...).

    The safety bound M (`max_seq_log_ratio`, 10 as verl) caps the sequence
    log-ratio: with A < 0 the clipped objective does not bound s_i from above,
    and token log-ratios clamped at +-20 alone would let the loss reach |A| e^20.
    Above M the loss is |A| e^M and its gradient is 0. The paper has no such bound.

    Paper: Zheng et al., "Group Sequence Policy Optimization" (2025);
    eps_low=3e-4, eps_high=4e-4 from the paper; max_seq_log_ratio=10 from verl.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    seq_log_r = jnp.minimum(_sequence_log_ratio(logp, old_logp, mask), max_seq_log_ratio)
    seq_ratio = jnp.exp(seq_log_r) * jnp.ones_like(logp)
    return _gspo_surrogate(seq_ratio, adv, mask, eps_low, eps_high)


@register_loss("gspo_token", paper="Group Sequence Policy Optimization (2025)", ranges=_GSPO_RANGES)
def gspo_token(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    max_seq_log_ratio: float = MAX_SEQUENCE_LOG_RATIO,
):
    """GSPO-token: the sequence ratio's value with per-token gradients.

    s_{i,t} = exp(min(sg[log s_i] + log pi(y_t) - sg[log pi(y_t)], M)): equal to
    s_i in value, so clipping is decided per sequence, while each token's
    gradient is its own (allowing token-level advantages A_{i,t}). This is
    verl's "gspo" loss.

    The safety bound M (`max_seq_log_ratio`, 10 as verl) caps the log-ratio,
    so with A < 0 the loss stays below |A| e^M instead of |A| e^20; a capped
    token has no gradient. The paper has no such bound.

    Paper: Zheng et al., "Group Sequence Policy Optimization" (2025); max_seq_log_ratio=10 from verl.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    seq_log_r = jax.lax.stop_gradient(_sequence_log_ratio(logp, old_logp, mask))
    seq_ratio = jnp.exp(jnp.minimum(seq_log_r + logp - jax.lax.stop_gradient(logp), max_seq_log_ratio))
    return _gspo_surrogate(seq_ratio, adv, mask, eps_low, eps_high)


# ------------------------------------------------------------------------ GMPO


@register_loss("gmpo", paper="Geometric-Mean Policy Optimization (2025)",
               ranges={"eps_low": (">= 0", "the lower log-space clip range"),
                       "eps_high": (">= 0", "the upper log-space clip range")})
def gmpo(logp, old_logp, advantages, mask, *, eps_low: float = 0.4, eps_high: float = 0.4):
    """GMPO: the geometric mean of token ratios, clipped per token in log space, times the sequence advantage.

    x_t = log rho_t, clipped on the side that would increase the objective:
    x'_t = sgn(A_t) min(sgn(A_t) x_t, sgn(A_t) clip(x_t, -eps_low, eps_high));
    r_i = exp(sum_t x'_t m_t / |o_i|), A_i = sum_t A_t m_t / |o_i| and every token of
    sequence i carries l_i = -A_i r_i, so `seq_mean_token_mean` gives the mean over
    sequences (verl's `geo_mean` averages over all rows, an empty row adding 0).

    Args:
      eps_low, eps_high: the log-space clip range, (e^-0.4, e^0.4) on the ratio
        as the paper. verl's `geo_mean` reads the PPO clip ratio, 0.2 by default
        (verl 1dda039): pass eps_low=eps_high=0.2 for verl's default.

    Difference from verl's `geo_mean`, deliberate: log rho is clamped to +-20
    before the clip (verl does not clamp it); it matters only on the side the
    sign of A leaves unclipped.

    Paper: Zhao et al., "Geometric-Mean Policy Optimization" (2025); verl's `geo_mean`.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    sign = jnp.sign(adv)
    bounded = jnp.clip(log_r, -eps_low, eps_high)
    log_r_min = sign * jnp.minimum(sign * log_r, sign * bounded)
    lengths = jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
    seq_ratio = jnp.exp((log_r_min * mask).sum(-1, keepdims=True) / lengths)
    seq_adv = (adv * mask).sum(-1, keepdims=True) / lengths
    loss = -seq_adv * seq_ratio * jnp.ones_like(logp)
    is_clipped = (bounded != log_r).astype(logp.dtype)
    metrics = {
        "clip_fraction_high": masked_mean(is_clipped * (adv > 0), mask),
        "clip_fraction_low": masked_mean(is_clipped * (adv < 0), mask),
    }
    metrics.update(ratio_metrics(jnp.exp(log_r), mask, log_r))
    return loss * mask, metrics


# ----------------------------------------------------------------------- VESPO


_VESPO = "VESPO: Variational Sequence-Level Soft Policy Optimization for Stable Off-Policy LLM Training (2026)"


#: log(1e-8): the lower bound of VESPO's sequence log-ratio (a ratio below 1e-8 counts as 1e-8).
MIN_LOG_SEQUENCE_RATIO = math.log(1e-8)


def gamma_weight(log_w: Array, k: Array | float, lam: Array | float) -> Array:
    """VESPO's Gamma-shaped weight phi(W) = W^k exp(lam (1 - W)), computed in log space.

    phi(1) = 1; phi rises like W^k for W < 1 and decays like exp(-lam W) for
    W > 1 (its peak is at W = k / lam). Non-finite values (possible only for
    extreme k or lam) become 0, so a sequence is dropped rather than poisoning
    the batch.
    """
    phi = jnp.exp(lam + k * log_w - lam * jnp.exp(log_w))
    return jnp.where(jnp.isfinite(phi), phi, 0.0)


@register_loss("vespo", paper=_VESPO, ranges={
    "k_pos": (">= 0", "the power k of phi for non-negative advantages"),
    "lambda_pos": (">= 0", "the decay lambda of phi for non-negative advantages"),
    "k_neg": (">= 0", "the power k of phi for negative advantages"),
    "lambda_neg": (">= 0", "the decay lambda of phi for negative advantages"),
})
def vespo(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    importance_weights=None,
):
    """VESPO: REINFORCE weighted by a smooth Gamma function of the sequence ratio.

    l_t = -sg[phi(W_i)] A_t log pi(y_t), phi(W) = W^k exp(lam (1 - W)), with
    log W_i = clip(sum_t clip(log rho_t, +-20), log 1e-8, 20) over the unmasked
    tokens, and (k, lam) = (k_pos, lambda_pos) where A_t >= 0, else (k_neg,
    lambda_neg). Aggregate with `token_mean` over the whole batch.

    Args:
      k_pos, lambda_pos, k_neg, lambda_neg: the power and decay of phi for
        non-negative / negative advantages; lam is floored at 1e-4.
      importance_weights: optional f32[N, T] token weights pi_old / pi_sampler
        (e.g. `importance_correction`'s, for a sampler that differs from the
        trainer); their logs (clipped to [log 1e-8, 20]) are added to log W_i
        instead of multiplying the loss.

    Paper: "VESPO: Variational Sequence-Level Soft Policy Optimization for
    Stable Off-Policy LLM Training" (2026); defaults (2, 3, 3, 2) and the clip
    bounds are TRL's GRPOConfig values, which TRL matches to the authors' code.
    """
    logp, old_logp, adv, mask = prepare(logp, old_logp, advantages, mask)
    log_r = log_ratio(logp, old_logp)
    seq_log_w = (log_r * mask).sum(-1, keepdims=True)
    if importance_weights is not None:
        check_token_inputs(logp=logp, importance_weights=importance_weights)
        # log 1 = 0 at masked-out tokens, whatever the weights hold there.
        weights = fill_masked(mask, jnp.asarray(importance_weights, logp.dtype), value=1.0)
        log_is = jnp.clip(jnp.log(jnp.maximum(weights, 0.0)), MIN_LOG_SEQUENCE_RATIO, MAX_LOG_RATIO)
        seq_log_w = seq_log_w + (log_is * mask).sum(-1, keepdims=True)
    seq_log_w = jax.lax.stop_gradient(jnp.clip(seq_log_w, MIN_LOG_SEQUENCE_RATIO, MAX_LOG_RATIO))
    nonnegative = adv >= 0
    k = jnp.where(nonnegative, k_pos, k_neg).astype(logp.dtype)
    lam = jnp.maximum(jnp.where(nonnegative, lambda_pos, lambda_neg), 1e-4).astype(logp.dtype)
    phi = jax.lax.stop_gradient(gamma_weight(seq_log_w, k, lam))
    loss = -phi * adv * logp
    metrics = {
        "phi_mean": masked_mean(phi, mask),
        "sequence_log_ratio_mean": masked_mean(seq_log_w * jnp.ones_like(logp), mask),
    }
    metrics.update(ratio_metrics(jnp.exp(log_r), mask, log_r))
    return loss * mask, metrics


# ------------------------------------------------------------------------ DHPO


_DHPO = "Orchestrating Tokens and Sequences: Dynamic Hybrid Policy Optimization for RLVR (2026)"


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


# ----------------------------------------------------------------------- DisCO


_DISCO = "DisCO: Reinforcing Large Reasoning Models with Discriminative Constrained Optimization (2025)"


def _log_mean_exp_per_group(x: Array, group_ids: Array, num_groups: int, rows: Array) -> Array:
    """log mean_{rows of g} exp(x) per group, 0 for a group without rows; max-shifted for stability."""
    peak = segments.max(x, group_ids, num_groups, rows)
    peak = jax.lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))
    shifted = jnp.where(rows, jnp.exp(x - segments.gather(peak, group_ids)), 0.0)
    total = segments.sum(shifted, group_ids, num_groups, rows)
    n = segments.count(group_ids, num_groups, rows, x.dtype)
    safe = jnp.where(n > 0, total / jnp.maximum(n, 1), 1.0)
    return jnp.where(n > 0, peak + jnp.log(safe), 0.0)


# Over 80 lines (105) on purpose, the longest kernel: DisCO's objective (scores, the negatives' log-mean-exp, the
# KL trust region and its squared hinge) reads as the paper's equations, in one place.
# The one kernel over 80 lines (105, of which 36 its docstring): the longest paper formula, whose
# per-token layout the docstring derives; its body reads as the paper's steps in order.
# The one function of jaxgrpo/ over 80 lines (tests/test_layers.py allows it by name): DisCO's objective, its KL
# trust region and the token layout that makes `aggregate` reproduce it, kept in one piece to read against the paper.
@register_loss("disco", paper=_DISCO, ranges={
    "score": ("one of logL, Lratio", "the score function of a completion"),
    "tau": ("> 0", "the temperature of the negatives' log-mean-exp; None: the paper's for the score"),
    "delta": ("> 0", "the KL budget of the trust region"),
    "beta": (">= 0", "the penalty weight of the squared hinge"),
})
def disco(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    rewards,
    group_ids,
    num_groups: int,
    valid=None,
    score: str = "logL",
    tau: float | None = None,
    delta: float = 1e-4,
    beta: float = 1e3,
):
    """DisCO: a discriminative objective per question with a squared-hinge KL trust region.

    Score of response o: s(o) = mean_t log pi(o_t) ("logL") or mean_t rho_t
    ("Lratio"). Per question q with positives o+ and negatives o-:
        J_q = mean_{o+} s(o+) - tau * log mean_{o-} exp(s(o-) / tau),
        L = -(1/Q) sum_q J_q + sg(max(beta (KL - delta), 0)) * KL,
    Q the number of questions in the batch (groups with a valid row); questions
    whose responses are all positive or all negative give J_q = 0 (dropped).
    KL is the masked token mean of k3 = rho - 1 - log rho, an estimate of
    KL(pi_old || pi).

    Layout of `per_token_loss` (so that
    `aggregate(per_token_loss, mask, "seq_mean_token_mean")` equals L in value
    and gradient): with N_seq the rows that have tokens, every token of a
    positive row i of question q carries -(N_seq/Q) x_t / n+_q (x = log pi or
    rho, so its token mean is -(N_seq/Q) s_i / n+_q); every token of a negative
    row carries (N_seq/Q) tau lme_q / n-_q (lme_q the log-mean-exp term, with
    gradient); and every token carries the KL term scaled by N_seq |o_i| / sum m.
    Other aggregation modes compose but rescale the rows differently.

    Args:
      advantages: unused (DisCO has no advantage); accepted so the loss keeps
        the common signature. The labels come from `rewards`.
      rewards: f32[N] binary correctness; rows with reward > 0.5 are positives.
      group_ids, num_groups, valid: the question of each row, as for the
        advantage estimators; invalid rows are neither positive nor negative.
      score: "logL" (default, tau = 10) or "Lratio" (tau = 1).
      tau: temperature of the negatives' log-mean-exp; None picks the paper's
        recommendation for `score`.
      delta, beta: KL budget 1e-4 and penalty 1e3 (paper and verl recipe).

    The reference code evaluates the log-mean-exp as S / sg(S) (value 1, the
    same gradient); here the loss value is the true objective.

    Paper: Li et al., "DisCO" (2025); checked against the official repo.
    """
    if score not in ("logL", "Lratio"):
        raise ValueError(f"score must be 'logL' or 'Lratio', got {score!r}")
    tau = (10.0 if score == "logL" else 1.0) if tau is None else float(tau)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    mask = jnp.asarray(mask)
    check_token_inputs(logp=logp, old_logp=old_logp, mask=mask.astype(jnp.float32))
    logp, old_logp = segments.fill_masked(mask, logp, old_logp)
    mask = mask.astype(logp.dtype)
    rewards, group_ids, valid, num_groups = check_outcome_inputs(rewards, group_ids, num_groups, valid)
    if rewards.shape[0] != logp.shape[0]:
        raise ValueError(f"rewards has {rewards.shape[0]} rows but logp has {logp.shape[0]}; they must match")

    log_r = log_ratio(logp, old_logp)
    ratio = jnp.exp(log_r)
    x = logp if score == "logL" else ratio
    lengths = mask.sum(-1)
    has_tokens = lengths > 0
    s = (x * mask).sum(-1) / jnp.maximum(lengths, 1)

    rows = valid & has_tokens
    positive = rows & (rewards > 0.5)
    negative = rows & ~(rewards > 0.5)
    n_pos = segments.count(group_ids, num_groups, positive, logp.dtype)
    n_neg = segments.count(group_ids, num_groups, negative, logp.dtype)
    question_ok = (n_pos > 0) & (n_neg > 0)
    num_questions = jnp.maximum((segments.count(group_ids, num_groups, rows) > 0).sum(), 1).astype(logp.dtype)

    lme = _log_mean_exp_per_group(s / tau, group_ids, num_groups, negative)
    pos_mean = segments.sum(s, group_ids, num_groups, positive) / jnp.maximum(n_pos, 1)
    objective = jnp.where(question_ok, pos_mean - tau * lme, 0.0)

    num_seqs = has_tokens.sum().astype(logp.dtype)
    scale = num_seqs / num_questions
    row_ok = segments.gather(question_ok, group_ids)
    pos_tok = jnp.where((positive & row_ok)[:, None], -scale * x / segments.gather(jnp.maximum(n_pos, 1), group_ids)[:, None], 0.0)
    neg_row = scale * tau * segments.gather(lme / jnp.maximum(n_neg, 1), group_ids)
    neg_tok = jnp.where((negative & row_ok)[:, None], neg_row[:, None], 0.0)

    k3 = ratio - 1.0 - log_r
    kl = masked_mean(k3, mask)
    coef = jax.lax.stop_gradient(jnp.maximum(beta * (kl - delta), 0.0))
    kl_tok = coef * k3 * (num_seqs * lengths / jnp.maximum(mask.sum(), 1))[:, None]

    per_token = (pos_tok + neg_tok + kl_tok) * mask
    metrics = {
        "objective": objective.sum() / num_questions,
        "kl": kl,
        "kl_penalty_coef": coef,
        "constraint_active": (kl > delta).astype(logp.dtype),
        "num_valid_questions": question_ok.sum().astype(logp.dtype),
    }
    metrics.update(ratio_metrics(ratio, mask, log_r))
    return per_token, metrics
