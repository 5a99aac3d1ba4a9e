"""Peer conventions: jaxgrpo's kernels with verl's options equal numpy transcriptions of verl's formulas.

Each reference below is written from the formula verl publishes (verl/trainer/ppo/core_algos.py at the
commit `peers.PEERS["verl"]` pins, 1dda039), in float64 numpy, on random inputs with uneven completion
masks (a prefix of each row, as verl's response_mask). Where the coverage table maps a verl kernel, our
kernel is called with the row's options (`verl_options`), so the table's "as verl" options are what is
checked. verl's advantages are per token (a row's scalar broadcast over its mask); ours are per row,
compared on the tokens. Tolerance 1e-6.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgrpo
from jaxgrpo import kernels
from jaxgrpo.catalog import peers

ATOL = 1e-6
N, T, GROUPS = 12, 7, 4


def batch(seed=0, groups=GROUPS, n=N, t=T, binary=False):
    """Rewards, prompt ids (uneven groups of at least 2 rows), prefix masks of lengths 1..t, log-probs."""
    rng = np.random.default_rng(seed)
    group_ids = np.sort(np.concatenate([np.arange(groups).repeat(2), rng.integers(0, groups, n - 2 * groups)]))
    rewards = rng.integers(0, 2, n).astype(np.float64) if binary else rng.normal(size=n)
    lengths = rng.integers(1, t + 1, n)
    mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float64)
    old = -rng.uniform(0.05, 3.0, (n, t))
    logp = np.minimum(old + rng.normal(scale=0.3, size=(n, t)), -1e-3)
    return rng, rewards, group_ids, lengths, mask, logp, old


def j(x, dtype=jnp.float32):
    return jnp.asarray(x, dtype)


def on_tokens(per_row, mask):
    return per_row[:, None] * mask


def close(got, expected, atol=ATOL):
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, atol=atol, rtol=1e-5)


def verl_options(peer_name, **overrides):
    """The options of the verl coverage row `peer_name`, with `overrides` for the test's inputs."""
    (row,) = [r for r in peers.coverage("verl") if r.peer_name == peer_name]
    return {**row.options, **overrides}


# ---------------------------------------------------------------- verl's helpers, as formulas


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def masked_whiten(x, mask, eps=1e-8):
    """verl_F.masked_whiten: (x - mean) / sqrt(var + eps), var unbiased over the unmasked entries."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = masked_mean((x - mean) ** 2, mask) * n / (n - 1)
    return (x - mean) / np.sqrt(var + eps) * mask


def group_rows(group_ids):
    return {g: np.flatnonzero(group_ids == g) for g in np.unique(group_ids)}


# ---------------------------------------------------------------- advantages


@pytest.mark.parametrize("seed", range(3))
def test_reinforce_pp_whitens_over_tokens_as_verl(seed):
    _, rewards, group_ids, lengths, mask, _, _ = batch(seed)
    # verl: the outcome reward sits on the last token, gamma = 1 -> the return is r on every token; then whiten.
    expected = masked_whiten(on_tokens(rewards, mask), mask)
    got = kernels.reinforce_pp(j(rewards), j(group_ids, jnp.int32), num_groups=GROUPS, lengths=j(lengths))
    close(on_tokens(np.asarray(got), mask), expected)


@pytest.mark.parametrize("seed", range(3))
def test_reinforce_pp_baseline_as_verl_with_a_single_row_group(seed):
    _, rewards, group_ids, lengths, mask, _, _ = batch(seed)
    group_ids = group_ids.copy()
    group_ids[-1] = GROUPS  # the last row alone in its group: its mean is taken as 0
    centered = rewards.copy()
    for rows in group_rows(group_ids).values():
        centered[rows] -= rewards[rows].mean() if len(rows) > 1 else 0.0
    expected = masked_whiten(on_tokens(centered, mask), mask)
    got = kernels.reinforce_pp_baseline(j(rewards), j(group_ids, jnp.int32), num_groups=GROUPS + 1, lengths=j(lengths))
    close(on_tokens(np.asarray(got), mask), expected)


def test_gdpo_token_whitening_as_verl():
    rng, _, group_ids, lengths, mask, _, _ = batch(4)
    rewards = np.stack([rng.integers(0, 2, N), rng.uniform(0, 1, N)], 1).astype(np.float64)
    weights = np.array([1.0, 0.5])
    summed = np.zeros(N)
    for k in range(2):  # verl's GRPO per reward: (r - mean) / (torch.std + 1e-6)
        normalized = np.zeros(N)
        for rows in group_rows(group_ids).values():
            r = rewards[rows, k]
            normalized[rows] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        summed += weights[k] * normalized
    expected = masked_whiten(on_tokens(summed, mask), mask)
    got = kernels.advantages.gdpo(j(rewards), j(group_ids, jnp.int32), num_groups=GROUPS,
                                          reward_weights=j(weights), eps=1e-6, whiten="tokens", lengths=j(lengths))
    close(on_tokens(np.asarray(got), mask), expected)


@pytest.mark.parametrize("seed", range(3))
def test_opo_as_verl(seed):
    _, rewards, group_ids, lengths, mask, _, _ = batch(seed)
    expected = rewards.copy()
    for rows in group_rows(group_ids).values():
        expected[rows] -= (lengths[rows] * rewards[rows]).sum() / lengths[rows].sum()
    got = kernels.opo(j(rewards), j(group_ids, jnp.int32), num_groups=GROUPS, lengths=j(lengths))
    close(on_tokens(np.asarray(got), mask), on_tokens(expected, mask))


@pytest.mark.parametrize("seed", range(3))
def test_gpg_as_verl(seed):
    _, rewards, group_ids, _, mask, _, _ = batch(seed, binary=True)
    alpha = N / max(np.count_nonzero(rewards), 1)
    expected = rewards.copy()
    for rows in group_rows(group_ids).values():
        expected[rows] = alpha * (rewards[rows] - rewards[rows].mean()) / 1.0
    got = kernels.gpg(j(rewards), j(group_ids, jnp.int32), num_groups=GROUPS)
    close(on_tokens(np.asarray(got), mask), on_tokens(expected, mask))


@pytest.mark.parametrize("seed", range(3))
def test_pass_at_k_as_verl(seed):
    _, rewards, group_ids, _, mask, _, _ = batch(seed)
    expected = np.zeros(N)
    for rows in group_rows(group_ids).values():
        top = np.argsort(-rewards[rows], kind="stable")[:2]
        gap = rewards[rows][top[0]] - rewards[rows][top[1]]
        expected[rows[top[0]]] = gap / (rewards[rows].std(ddof=1) + 1e-6)
    got = kernels.pass_at_k(j(rewards), j(group_ids, jnp.int32), num_groups=GROUPS)
    close(on_tokens(np.asarray(got), mask), on_tokens(expected, mask))


def test_remax_as_verl():
    rng, rewards, group_ids, lengths, mask, _, _ = batch(5)
    baselines = rng.normal(size=N)
    # verl: returns = reverse cumulative sum of the token rewards (r on the last token) minus the baseline.
    token_rewards = np.where(np.arange(T)[None] == lengths[:, None] - 1, rewards[:, None], 0.0)
    returns = np.flip(np.cumsum(np.flip(token_rewards * mask, -1), -1), -1)
    expected = returns - baselines[:, None] * mask
    got = kernels.remax(j(rewards), j(group_ids, jnp.int32), num_groups=GROUPS, baseline_rewards=j(baselines))
    close(on_tokens(np.asarray(got), mask), expected)


@pytest.mark.parametrize("seed, zero_tail", [(0, False), (1, False), (2, None), (3, None)])
def test_optimal_token_baseline_as_verl(seed, zero_tail):
    """zero_tail None: the row's options, verl's default handle_zero_tail=True."""
    options = verl_options("optimal_token_baseline", **({} if zero_tail is None else {"handle_zero_tail": zero_tail}))
    zero_tail = options["handle_zero_tail"]
    rng, rewards, group_ids, lengths, mask, _, old = batch(seed)
    group_ids = group_ids.copy()
    group_ids[-1] = GROUPS  # a single-row group: no baseline
    token_rewards = np.where(np.arange(T)[None] == lengths[:, None] - 1, rewards[:, None], 0.0)
    pi = np.exp(old)
    sum_sq = pi**2 + rng.uniform(0, 0.2, (N, T))
    returns = np.flip(np.cumsum(np.flip(token_rewards * mask, -1), -1), -1)
    cumulative = np.cumsum((1 - 2 * pi + sum_sq) * mask, -1)
    baselines = np.zeros((N, T))
    triggered = False
    for rows in group_rows(group_ids).values():
        if len(rows) == 1:
            continue
        num = (returns[rows] * cumulative[rows] * mask[rows]).sum(0)
        den = (cumulative[rows] * mask[rows]).sum(0) + 1e-8
        baselines[rows] = num / den
        lengths_g = mask[rows].sum(-1)
        longest, second = np.sort(lengths_g)[-1], np.sort(lengths_g)[-2]
        if zero_tail and (lengths_g == longest).sum() == 1 and longest > second:
            baselines[rows[np.argmax(lengths_g)], int(second):] = 0.0
            triggered = True
    assert triggered == zero_tail  # the zero tail is exercised where asked
    expected = (returns - baselines) * mask
    adv, ret = kernels.optimal_token_baseline(j(token_rewards), j(mask), j(group_ids, jnp.int32), j(old), j(sum_sq),
                                              num_groups=GROUPS + 1, **options)
    close(adv, expected, atol=2e-6)
    close(ret, returns * mask)


# ---------------------------------------------------------------- KL


@pytest.mark.parametrize("kind", ["k3", "k3+", "abs", "abs+"])
def test_kl_kinds_with_verl_clamp(kind):
    _, _, _, _, mask, logp, _ = batch(6)
    ref = logp + np.random.default_rng(7).normal(scale=3.0, size=logp.shape)  # some k3 above 10
    x = np.clip(ref - logp, -20, 20)
    forward = {"k3": np.clip(np.exp(x) - x - 1, -10, 10), "abs": np.abs(logp - ref)}[kind.rstrip("+")]
    assert (np.exp(x) - x - 1 > 10).any()
    _, grad = jax.value_and_grad(
        lambda lp: (kernels.kl_penalty(lp, j(ref), kind, clamp=10.0 if kind.startswith("k3") else None) * j(mask)).sum(),
    )(j(logp))
    close(kernels.kl_penalty(j(logp), j(ref), kind, clamp=10.0 if kind.startswith("k3") else None), forward, atol=1e-5)
    if kind.endswith("+"):  # verl: the value of the estimator, the gradient of 0.5 (logp - ref)^2
        close(grad, (logp - ref) * mask, atol=1e-5)


# ---------------------------------------------------------------- policy losses


def adv_tokens(seed, mask):
    return np.random.default_rng(100 + seed).normal(size=N)[:, None] * np.ones((1, T))


@pytest.mark.parametrize("seed", range(2))
def test_ppo_clip_with_verl_dual_clip(seed):
    _, _, _, _, mask, logp, old = batch(seed)
    logp = old + np.random.default_rng(seed).normal(scale=0.6, size=old.shape)
    adv = adv_tokens(seed, mask)
    ratio = np.exp(np.clip(logp - old, -20, 20))
    clip1 = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2))
    expected = np.where(adv < 0, np.minimum(-adv * 3.0, clip1), clip1)
    got, _ = kernels.ppo_clip(j(logp), j(old), j(adv), j(mask), clip_ratio_c=3.0)
    close(got, expected * mask, atol=2e-6)


@pytest.mark.parametrize("seed", range(2))
def test_gspo_token_as_verl_gspo_with_its_bound(seed):
    _, _, _, _, mask, logp, old = batch(seed)
    logp = old + np.random.default_rng(seed).normal(scale=0.2, size=old.shape)
    logp[0] = old[0] + 12.0  # a row whose sequence log-ratio exceeds the bound 10
    adv = adv_tokens(seed, mask)
    adv[0] = -1.0
    seq = ((logp - old) * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    s = np.exp(np.minimum(seq, 10.0))[:, None]
    expected = np.maximum(-adv * s, -adv * np.clip(s, 1 - 3e-4, 1 + 4e-4))
    got, _ = kernels.gspo_token(j(logp), j(old), j(adv), j(mask))
    close(np.asarray(got) / np.maximum(np.abs(expected), 1.0), expected * mask / np.maximum(np.abs(expected), 1.0))


@pytest.mark.parametrize("seed", range(2))
def test_clip_cov_as_verl(seed):
    _, _, _, _, mask, logp, old = batch(seed)
    adv = adv_tokens(seed, mask) * 3.0
    ratio = np.exp(logp - old)
    l1, l2 = -adv * ratio, -adv * np.clip(ratio, 0.8, 1.2)
    cov = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))
    candidates = (mask > 0) & ~(l2 > l1) & (cov > 0.1) & (cov < 5.0)
    assert candidates.any()
    # clip_cov_ratio = 1 -> k = #tokens >= #candidates: verl's random choice takes every candidate.
    expected = np.maximum(l1, l2) * np.where(candidates, 0.0, 1.0)
    got, _ = kernels.clip_cov(j(logp), j(old), j(adv), j(mask), **verl_options("clip_cov", clip_cov_ratio=1.0, clip_cov_lb=0.1))
    close(got, expected * mask)


@pytest.mark.parametrize("seed", range(2))
def test_kl_cov_as_verl(seed):
    _, _, _, _, mask, logp, old = batch(seed)
    adv = adv_tokens(seed, mask)
    ratio = np.exp(logp - old)
    on = mask > 0
    a, lp = adv[on], logp[on]
    cov = (a - a.mean()) * (lp - lp.mean())
    k = max(1, int(len(cov) * 0.1))
    chosen = np.zeros(len(cov), bool)
    chosen[np.argsort(-cov)[:k]] = True
    penalized = np.zeros_like(mask, bool)
    penalized[on] = chosen
    expected = -adv * ratio + np.where(penalized, 0.1 * np.abs(logp - old), 0.0)  # ppo_kl_coef: the config's 0.1
    got, _ = kernels.kl_cov(j(logp), j(old), j(adv), j(mask), **verl_options("kl_cov", kl_cov_ratio=0.1))
    close(got, expected * mask)


@pytest.mark.parametrize("seed", range(2))
def test_gmpo_as_verl_geo_mean(seed):
    _, _, _, _, mask, logp, old = batch(seed)
    adv = adv_tokens(seed, mask)
    x = logp - old
    sign = np.sign(adv)
    x_min = sign * np.minimum(sign * x, sign * np.clip(x, -0.2, 0.2))  # the actor's clip_ratio, 0.2
    n = mask.sum(-1)
    seq_loss = -((adv * mask).sum(-1) / (n + 1e-8)) * np.exp((x_min * mask).sum(-1) / (n + 1e-8))
    got, _ = kernels.gmpo(j(logp), j(old), j(adv), j(mask), **verl_options("geo_mean"))
    close(np.asarray(got)[:, 0], seq_loss)
    # verl's loss is the mean over rows; ours with seq_mean_token_mean (no empty row here) is the same.
    close(jaxgrpo.aggregate(got, j(mask), "seq_mean_token_mean")[0], seq_loss.mean())


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_as_verl(name):
    _, _, _, _, mask, logp, old = batch(8)
    logp = np.minimum(old + np.random.default_rng(8).normal(scale=0.8, size=old.shape), -1e-4)
    adv = adv_tokens(8, mask)
    ratio = np.exp(np.clip(logp - old, -20, 20))
    p, p_old = np.exp(logp), np.exp(old)
    if name == "dppo_tv":
        keep = np.where(adv > 0, p - p_old <= 0.2, p - p_old >= -0.2)
    else:
        kl = p_old * (old - logp) + (1 - p_old) * np.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        keep = np.where(adv > 0, (kl <= 0.2) | (p <= p_old), (kl <= 0.2) | (p >= p_old))
    assert (~keep & (mask > 0)).any() and (keep & (mask > 0)).any()
    assert (ratio * keep * mask > 3.0).any()  # the cap, clip_ratio_c = 3 in verl's default config, is reached
    expected = -adv * np.minimum(ratio, 3.0) * logp * keep
    got, _ = jaxgrpo.get_loss(name)(j(logp), j(old), j(adv), j(mask), **verl_options(name))
    close(got, expected * mask, atol=2e-6)


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dro_as_verl(beta):
    _, _, _, _, mask, logp, old = batch(9)
    adv = adv_tokens(9, mask)
    # verl's dro: -(log pi A - beta / 2 (log pi - log pi_old)^2), beta = policy_loss.dro_beta (required).
    expected = -(logp * adv - 0.5 * beta * (logp - old) ** 2)
    got, _ = kernels.dro(j(logp), j(old), j(adv), j(mask), **verl_options("dro", beta=beta))
    close(got, expected * mask)


# ---------------------------------------------------------------- aggregation


def test_aggregation_modes_as_verl_agg_loss():
    rng, _, _, _, mask, _, _ = batch(10)
    loss = rng.normal(size=mask.shape)
    total = (loss * mask).sum()
    seq_mask = (mask.sum(-1) > 0).sum()
    verl = {
        "token_mean": total / mask.sum(),  # token-mean
        "seq_mean_token_mean": ((loss * mask).sum(-1) / (mask.sum(-1) + 1e-8)).sum() / seq_mask,
        "seq_mean_token_sum": (loss * mask).sum(-1).sum() / seq_mask,
        "token_sum": total,  # token-sum: no normalization
        # seq-mean-token-sum-norm (since 3671d37): the seq-mean of the token sums / loss_scale_factor (default T)
        "seq_mean_token_sum_norm": (loss * mask).sum(-1).sum() / seq_mask / T,
    }
    for mode, expected in verl.items():
        options = {"max_len": T} if mode == "seq_mean_token_sum_norm" else {}
        close(jaxgrpo.aggregate(j(loss), j(mask), mode, **options)[0], expected, atol=1e-5)
