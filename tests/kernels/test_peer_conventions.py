"""Parity with the peers' conventions: every row of `jaxgrpo.catalog.peers` whose kernel this build has.

For each row, our kernel with the row's options (and aggregation) is compared, on random inputs with
uneven (right-padded) masks and uneven groups, with a numpy transcription of the peer's published
formula at the commit (or release) the peer is pinned to (`peers.PEERS[peer].pin`), written here
from the formula. Both run in float64 and must
agree to 1e-6. The references are keyed by (peer, setting, value); a row whose kernel exists but has
no reference fails `test_every_available_row_has_a_reference`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgrpo
from jaxgrpo import kernels
from jaxgrpo.catalog import docs, peers
from jaxgrpo.kernels.aggregation import AGGREGATION_MODES
from jaxgrpo.tools.cli import kernels_main

TOL = dict(rtol=1e-6, atol=1e-6)

# The verl kernels whose parity with verl tests/kernels/test_peer_verl.py checks: the parity tests here leave them
# to that file, and `test_every_mapped_kernel_is_registered` checks that they are registered.
CHECKED_IN_TEST_PEER_VERL = {
    ("advantage", "opo"), ("advantage", "gpg"), ("advantage", "pass_at_k"), ("advantage", "remax"),
    ("token_advantage", "optimal_token_baseline"), ("aggregation", "token_sum"), ("loss", "clip_cov"), ("loss", "kl_cov"), ("loss", "gmpo"),
    ("loss", "dppo_tv"), ("loss", "dppo_kl"), ("loss", "dro"), ("kl", "abs"), ("kl", "abs+"),
}


# --------------------------------------------------------------------------------------- inputs


@dataclasses.dataclass
class Batch:
    """float64 numpy inputs: 8 completions of uneven length in 3 uneven groups."""

    logp: np.ndarray
    old_logp: np.ndarray
    ref_logp: np.ndarray
    advantages: np.ndarray
    mask: np.ndarray
    rewards: np.ndarray
    reward_columns: np.ndarray
    group_ids: np.ndarray
    token_rewards: np.ndarray
    values: np.ndarray
    old_values: np.ndarray
    returns: np.ndarray
    entropy: np.ndarray

    @property
    def num_groups(self) -> int:
        return int(self.group_ids.max()) + 1


def make_batch(seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    n, t = 8, 6
    lengths = np.array([6, 3, 1, 5, 2, 6, 4, 3])
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
    logp = rng.uniform(-3.0, -0.1, (n, t))
    # A log-ratio spread of 0.6 puts ratios both inside and outside the clip ranges (and past 3 for dual clip).
    old_logp = logp + rng.normal(0.0, 0.6, (n, t))
    ref_logp = logp + rng.normal(0.0, 0.5, (n, t))
    # Masked-out tokens hold other values: they must not count.
    garbage = mask == 0
    logp[garbage], old_logp[garbage], ref_logp[garbage] = -7.0, -0.5, -9.0
    token_rewards = np.where(mask > 0, rng.normal(0.0, 0.1, (n, t)), 0.0)
    token_rewards[np.arange(n), lengths - 1] += rng.integers(0, 2, n)  # the outcome at the last token
    values = rng.normal(0.0, 1.0, (n, t))
    return Batch(
        logp=logp,
        old_logp=old_logp,
        ref_logp=ref_logp,
        advantages=rng.normal(0.0, 1.0, n),
        mask=mask,
        rewards=np.round(rng.uniform(0.0, 1.0, n), 1),
        reward_columns=np.stack([rng.integers(0, 2, n), rng.uniform(0, 1, n)], 1).astype(np.float64),
        group_ids=np.array([0, 0, 0, 1, 1, 2, 2, 2]),
        token_rewards=token_rewards,
        values=values,
        old_values=values + rng.normal(0.0, 0.3, (n, t)),
        returns=values + rng.normal(0.0, 0.5, (n, t)),
        entropy=np.where(mask > 0, rng.uniform(0.0, 4.0, (n, t)), 0.0),
    )


# ------------------------------------------------------------------------ our side, from the row


def _x64(fn):
    """Runs fn with float64 enabled, and returns numpy."""
    with jax.enable_x64(True):
        return jax.tree.map(np.asarray, fn())


def ours(row: peers.PeerRow, b: Batch, **extra):
    """Our kernel as the row configures it, on the batch: the value the peer's formula gives."""
    opts = {**peers.resolve_options(row.options, b.mask.shape), **extra}
    a = {k: jnp.asarray(v) for k, v in dataclasses.asdict(b).items()}

    def run():
        if row.kind == "advantage":
            rewards = a["reward_columns"] if row.ours == "gdpo" else a["rewards"]
            return jaxgrpo.get_advantage(row.ours)(rewards, a["group_ids"], num_groups=b.num_groups, **opts)
        if row.kind == "kl":
            if row.ours == "k3_unbiased":
                opts["old_logp"] = a["old_logp"]
            return jaxgrpo.get("kl", row.ours)(a["logp"], a["ref_logp"], mask=a["mask"], **opts) * a["mask"]
        if row.kind == "aggregation":
            loss, _ = kernels.aggregate(a["values"], a["mask"], row.ours, **opts)
            return loss
        if row.kind == "loss" or row.kind == "function":
            if row.kind == "loss":
                per_token, _ = jaxgrpo.get_loss(row.ours)(a["logp"], a["old_logp"], a["advantages"], a["mask"], **opts)
            else:
                per_token, _ = getattr(kernels, row.ours)(a["values"], a["old_values"], a["returns"], a["mask"], **opts)
            if row.aggregation is None:
                return per_token * a["mask"]
            agg = peers.resolve_options(row.aggregation_options, b.mask.shape)
            loss, _ = kernels.aggregate(per_token, a["mask"], row.aggregation, **agg)
            return loss
        raise AssertionError(f"no generic call for kind {row.kind}; the row's test calls it itself")

    return _x64(run)


# --------------------------------------------------------------------- the peers' formulas, numpy


def group_stats(r, gids, ddof=1):
    mean = np.array([r[gids == g].mean() for g in gids])
    std = np.array([r[gids == g].std(ddof=ddof) for g in gids])
    size = np.array([(gids == g).sum() for g in gids])
    return mean, std, size


def masked_whiten(x, m):
    """verl / tunix: (x - mean) * rsqrt(var + 1e-8), unbiased var over the masked entries."""
    mean = (x * m).sum() / m.sum()
    var = (((x - mean) ** 2) * m).sum() / m.sum() * m.sum() / (m.sum() - 1)
    return (x - mean) / np.sqrt(var + 1e-8)


def gae_reference(r, v, m, gamma=1.0, lam=1.0):
    """verl's and tunix's GAE scan: values and advantages pass through masked-out steps unchanged."""
    n, t = r.shape
    next_v, last, adv = np.zeros(n), np.zeros(n), np.zeros((n, t))
    for i in reversed(range(t)):
        delta = r[:, i] + gamma * next_v - v[:, i]
        new = delta + gamma * lam * last
        next_v = v[:, i] * m[:, i] + (1 - m[:, i]) * next_v
        last = new * m[:, i] + (1 - m[:, i]) * last
        adv[:, i] = last
    return adv, adv + v


def ppo_token_loss(ratio, adv, eps_low, eps_high):
    return np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - eps_low, 1 + eps_high))


def verl_agg(l, m, mode, scale=None):
    """verl's agg_loss, one process (dp_size 1, no global batch info)."""
    lengths = m.sum(-1)
    nonempty = (lengths > 0).astype(float)
    if mode == "token-mean":
        return (l * m).sum() / m.sum()
    if mode == "seq-mean-token-sum":
        return ((l * m).sum(-1) * nonempty).sum() / nonempty.sum()
    if mode == "seq-mean-token-mean":
        return ((l * m).sum(-1) / (lengths + 1e-8) * nonempty).sum() / nonempty.sum()
    if mode == "seq-mean-token-sum-norm":  # since verl 3671d37: the seq-mean of the token sums, / loss_scale_factor
        return ((l * m).sum(-1) * nonempty).sum() / nonempty.sum() / (m.shape[-1] if scale is None else scale)
    raise ValueError(mode)


def tunix_agg(l, m, mode):
    """tunix's aggregate_loss, unpacked rows, default norms."""
    lengths = m.sum(-1)
    nonempty = (lengths > 0).sum()
    if mode == "token-mean":
        return (l * m).sum() / m.sum()
    if mode == "sequence-mean-token-mean":
        return ((l * m).sum(-1) / np.maximum(lengths, 1)).sum() / nonempty
    if mode == "sequence-mean-token-scale":
        return ((l * m).sum(-1) / m.shape[-1]).sum() / nonempty
    if mode == "seq-mean-token-sum":
        return (l * m).sum(-1).sum() / nonempty
    if mode == "sequence-mean-token-sum-norm":
        return (l * m).sum() / m.shape[0]
    raise ValueError(mode)


def trl_normalize(per_token, m, loss_type):
    """TRL's normalization of per_token_loss ([N, T] or [N, 1]), one process, no accumulation."""
    if loss_type in ("grpo", "sapo"):
        return ((per_token * m).sum(-1) / np.maximum(m.sum(-1), 1.0)).mean()
    if loss_type in ("bnpo", "dapo", "cispo", "vespo"):
        return (per_token * m).sum() / max(m.sum(), 1.0)
    if loss_type == "dr_grpo":
        return (per_token * m).sum() / (per_token.shape[0] * m.shape[1])
    if loss_type == "luspo":  # trl 1.16: (per_token_loss * mask).sum(-1).mean()
        return (per_token * m).sum(-1).mean()
    raise ValueError(loss_type)


def _verl(b: Batch, value: str):
    lp, old, ref, m, a = b.logp, b.old_logp, b.ref_logp, b.mask, b.advantages[:, None]
    r, g = b.rewards, b.group_ids
    mean, std, size = group_stats(r, g)
    if value == "grpo":
        return (r - mean) / (std + 1e-6)
    if value == "grpo_vectorized":  # group_mean_std(eps=0.0): the variance is not floored (verl 1cc810c)
        return (r - mean) / (std + 1e-6)
    if value == "grpo (norm_adv_by_std_in_grpo=False)":
        return r - mean
    if value in ("rloo", "rloo_vectorized"):
        return r * size / (size - 1) - mean * size / (size - 1)
    if value == "gae":
        adv, ret = gae_reference(b.token_rewards, b.values, m)
        return masked_whiten(adv, m) * m, ret * m
    if value == "reinforce_plus_plus":  # verl 8a1bf6d: the return is carried through masked tokens
        running, returns = np.zeros(len(r)), np.zeros_like(m)
        for t in reversed(range(m.shape[1])):
            new = b.token_rewards[:, t] + 1.0 * running
            returns[:, t] = new * m[:, t]
            running = new * m[:, t] + running * (1 - m[:, t])
        return masked_whiten(returns, m) * m
    if value == "reinforce_plus_plus_baseline":
        scores = np.tile((r - mean)[:, None], (1, m.shape[1])) * m
        return masked_whiten(scores, m) * m
    ratio = np.exp(np.clip(lp - old, -20, 20))
    if value in ("vanilla", "bypass_mode (loss_type=ppo_clip)"):
        l1 = ppo_token_loss(ratio, a, 0.2, 0.2)
        return np.where(a < 0, np.minimum(-a * 3.0, l1), l1) * m
    if value == "gspo":
        seq = ((lp - old) * m).sum(-1) / np.maximum(m.sum(-1), 1)
        s = np.exp(np.minimum(seq, 10.0))[:, None] * np.ones_like(m)
        return verl_agg(ppo_token_loss(s, a, 0.2, 0.2), m, "seq-mean-token-mean")
    if value == "sapo":
        tau = np.where(a > 0, 1.0, 1.05)
        gate = 1 / (1 + np.exp(-tau * (ratio - 1))) * 4 / tau
        return verl_agg(-gate * a, m, "seq-mean-token-mean")
    if value in ("gpg", "bypass_mode (loss_type=reinforce)"):
        return -lp * a * m
    if value == "cispo":
        return -np.clip(ratio, 0.8, 1.2) * a * lp * m
    if value in ("kl / k1", "k1+"):
        return (lp - ref) * m
    if value == "mse / k2":
        return 0.5 * (lp - ref) ** 2 * m
    if value in ("low_var_kl / k3", "k3+ / low_var_kl+"):  # "+": the same value (verl strips the '+', 7e80ab0)
        x = np.clip(ref - lp, -20, 20)
        return np.clip(np.exp(x) - x - 1, -10, 10) * m
    mode = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    if value in mode:
        return verl_agg(b.values, m, value)
    raise KeyError(value)


def _trl(b: Batch, setting: str, value: str):
    lp, old, ref, m, a = b.logp, b.old_logp, b.ref_logp, b.mask, b.advantages[:, None]
    r, g = b.rewards, b.group_ids
    mean, std, _ = group_stats(r, g)
    log_ratio = lp - old
    coef = np.exp(log_ratio)
    if setting == "scale_rewards" or (setting == "multi_objective_aggregation" and value == "sum_then_normalize"):
        if value == "none":
            return r - mean
        scale = r.std(ddof=1) if value == "batch" else std
        return (r - mean) / (scale + 1e-4)
    if setting == "multi_objective_aggregation":  # normalize_then_sum, weights 1
        cols = b.reward_columns
        per = np.stack([(cols[:, k] - group_stats(cols[:, k], g)[0]) / (group_stats(cols[:, k], g)[1] + 1e-4)
                        for k in range(cols.shape[1])], 1)
        s = per.sum(1)
        return (s - s.mean()) / (s.std(ddof=1) + 1e-4)
    if setting == "loss_type" or setting in ("importance_sampling_level", "delta"):
        loss_type = value if setting == "loss_type" else "grpo"
        if setting == "importance_sampling_level" and value == "sequence" or value == "luspo":
            coef = np.exp((log_ratio * m).sum(-1, keepdims=True) / np.maximum(m.sum(-1, keepdims=True), 1))
        if loss_type == "cispo":
            per_token = -np.minimum(coef, 5.0) * a * lp
        elif loss_type == "sapo":
            tau = np.where(a > 0, 1.0, 1.05)
            per_token = -(1 / (1 + np.exp(-tau * (coef - 1))) * 4 / tau) * a
        elif loss_type == "vespo":
            seq_log = np.clip((np.clip(log_ratio, -20, 20) * m).sum(-1, keepdims=True), np.log(1e-8), 20)
            k, lam = np.where(a >= 0, 2.0, 3.0), np.where(a >= 0, 3.0, 2.0)
            phi = np.exp(lam + k * seq_log - lam * np.exp(seq_log))
            per_token = -phi * a * lp
        else:
            coef_2 = np.clip(coef, 0.8, 1.2)
            coef_1 = np.minimum(coef, 3.0) if setting == "delta" else coef
            per_token = -np.minimum(coef_1 * a, coef_2 * a)
        if setting == "importance_sampling_level" and value == "token" or setting == "delta":
            return per_token * m
        return trl_normalize(per_token, m, loss_type)
    if setting == "beta":  # use_bias_correction_kl=True, the default in trl 1.16: k3 times the token ratio
        x = ref - lp
        return (np.exp(x) - x - 1) * coef * m
    if setting == "use_bias_correction_kl":  # False
        x = ref - lp
        return (np.exp(x) - x - 1) * m
    raise KeyError((setting, value))


def _tunix(b: Batch, setting: str, value: str):
    lp, old, ref, m, a = b.logp, b.old_logp, b.ref_logp, b.mask, b.advantages[:, None]
    r, g = b.rewards, b.group_ids
    mean, std, size = group_stats(r, g)
    if setting == "advantage_estimator":
        if value == "grpo":
            return (r - mean) / (std + 1e-6)
        if value == "rloo":
            return r - (mean * size - r) / (size - 1)
        if value == "drgrpo":
            return r - mean
        if value == "gae":  # PPOConfig: gamma=1.0, gae_lambda=0.95
            adv, ret = gae_reference(b.token_rewards, b.values, m, gamma=1.0, lam=0.95)
            # tunix's masked_mean adds 1e-8 to the token count (below the tolerance at this size).
            mean_a = (adv * m).sum() / (m.sum() + 1e-8)
            var = (((adv - mean_a) ** 2) * m).sum() / (m.sum() + 1e-8) * m.sum() / (m.sum() - 1)
            return (adv - mean_a) / np.sqrt(var + 1e-8) * m, ret * m
    if setting == "policy_loss_fn":
        log_ratio = np.clip(lp - old, -20, 20)
        if value == "grpo (loss_algo='gspo-token')":
            seq = (log_ratio * m).sum(-1, keepdims=True) / np.maximum(m.sum(-1, keepdims=True), 1)
            log_ratio = np.minimum(seq, 10.0) * np.ones_like(m)
        if value == "ppo":
            log_ratio = lp - old
        loss = ppo_token_loss(np.exp(log_ratio), a, 0.2, 0.2)
        return tunix_agg(loss, m, "token-mean" if value == "ppo" else "sequence-mean-token-mean")
    if setting == "value_loss_fn":
        clipped = np.clip(b.values, b.old_values - 0.2, b.old_values + 0.2)
        loss = np.maximum((b.values - b.returns) ** 2, (clipped - b.returns) ** 2)
        return 0.5 * (loss * m).sum() / m.sum()
    if setting == "kl_loss_mode":
        if value == "kl":
            return (lp - ref) * m
        if value == "mse_kl":
            return 0.5 * (lp - ref) ** 2 * m
        x = ref - lp
        return (np.exp(x) - x - 1) * m
    if setting == "loss_agg_mode":
        return tunix_agg(b.values, m, value)
    raise KeyError((setting, value))


def reference(peer: str, row: peers.PeerRow, b: Batch):
    if peer == "verl":
        return _verl(b, row.peer_name)
    if peer == "trl":
        return _trl(b, row.peer_kind, row.peer_name)
    return _tunix(b, row.peer_kind, row.peer_name)


# Rows whose kernel is not called with the common arguments: tested one by one below.
SPECIAL = {
    ("verl", "gae"), ("tunix", "gae"), ("verl", "reinforce_plus_plus"), ("verl", "reinforce_plus_plus_baseline"),
    ("verl", "k1+"), ("verl", "k3+ / low_var_kl+"), ("verl", "gdpo"), ("trl", "delta"), ("trl", "rho"),
    ("trl", "token_truncate"), ("trl", "token_mask"), ("trl", "sequence_truncate"), ("trl", "sequence_mask"),
    ("tunix", "DAPO reward_shaping"),
}
ROWS = [(peer, row) for peer in sorted(peers.COVERAGE) for row in peers.coverage(peer)]
GENERIC = [
    (p, r) for p, r in ROWS
    if peers.is_available(r) and (p, r.peer_name) not in SPECIAL and (r.kind, r.ours) not in CHECKED_IN_TEST_PEER_VERL
]


def _id(item):
    peer, row = item
    return f"{peer}:{row.peer_kind}={row.peer_name}"


# --------------------------------------------------------------------------------- the registry


@pytest.mark.parametrize("item", ROWS, ids=_id)
def test_every_mapped_kernel_is_registered(item):
    peer, row = item
    if row.ours is None:
        assert row.note.startswith("Missing"), f"{_id(item)}: a missing kernel's note says why"
        return
    assert peers.is_available(row), f"{_id(item)}: {row.kind} {row.ours!r} is not registered"
    if row.kind == "aggregation":
        assert row.ours in AGGREGATION_MODES
    elif row.kind == "function":
        assert callable(getattr(kernels, row.ours))
    else:
        jaxgrpo.get(row.kind, row.ours)


def test_every_available_row_has_a_reference():
    b = make_batch()
    for peer, row in GENERIC:
        try:
            reference(peer, row, b)
        except KeyError:
            pytest.fail(f"{peer}: no numpy reference for {row.peer_kind}={row.peer_name}")


def test_rows_reject_unknown_kinds_and_peers():
    with pytest.raises(ValueError, match="unknown kind"):
        peers.PeerRow("x", "y", "lossy", "ppo_clip")
    with pytest.raises(ValueError, match="both set or both None"):
        peers.PeerRow("x", "y", "loss", None)
    with pytest.raises(ValueError, match="valid peers: trl, tunix, verl"):
        peers.coverage("openrlhf")
    assert peers.resolve_options({"max_len": "T", "denominator": "N", "mode": "token"}, (8, 6)) == {
        "max_len": 6, "denominator": 8, "mode": "token"}


# ------------------------------------------------------------------------------------- parity


@pytest.mark.parametrize("item", GENERIC, ids=_id)
@pytest.mark.parametrize("seed", [0, 1])
def test_row_matches_the_peers_formula(item, seed):
    peer, row = item
    b = make_batch(seed)
    np.testing.assert_allclose(ours(row, b), reference(peer, row, b), **TOL)


@pytest.mark.parametrize("peer", ["verl", "tunix"])
def test_gae_then_masked_whiten_is_the_peers_gae(peer):
    b = make_batch(2)
    row = next(r for r in peers.coverage(peer) if r.peer_name == "gae")

    def run():
        adv, ret = jaxgrpo.get("token_advantage", "gae")(b.token_rewards, b.values, b.mask, **row.options)
        return kernels.masked_whiten(adv, b.mask), ret

    got = _x64(run)
    expected = _verl(b, "gae") if peer == "verl" else _tunix(b, "advantage_estimator", "gae")
    np.testing.assert_allclose(got[0], expected[0], **TOL)
    np.testing.assert_allclose(got[1], expected[1], **TOL)


def test_reinforce_pp_rows():
    b = make_batch(3)
    row = next(r for r in peers.coverage("verl") if r.peer_name == "reinforce_plus_plus")
    got = _x64(lambda: jaxgrpo.get("token_advantage", row.ours)(b.token_rewards, b.mask, **row.options))
    np.testing.assert_allclose(got, _verl(b, "reinforce_plus_plus"), **TOL)
    # The baseline form: the group-centered reward, whitened over the batch's tokens.
    row = next(r for r in peers.coverage("verl") if r.peer_name == "reinforce_plus_plus_baseline")
    centered = ours(row, b)
    got = _x64(lambda: kernels.masked_whiten(jnp.asarray(centered)[:, None] * b.mask, b.mask))
    np.testing.assert_allclose(got, _verl(b, "reinforce_plus_plus_baseline"), **TOL)


def test_verl_gdpo_row():
    b = make_batch(8)
    row = next(r for r in peers.coverage("verl") if r.peer_name == "gdpo")
    cols, m, g = b.reward_columns, b.mask, b.group_ids
    # verl: GRPO (torch.std, + 1e-6) per reward column, their sum (weights 1), then masked_whiten over the tokens.
    summed = sum((cols[:, k] - group_stats(cols[:, k], g)[0]) / (group_stats(cols[:, k], g)[1] + 1e-6)
                 for k in range(cols.shape[1]))
    expected = masked_whiten(summed[:, None] * m, m) * m
    lengths = m.sum(-1)
    got = _x64(lambda: jaxgrpo.get_advantage(row.ours)(b.reward_columns, g, num_groups=b.num_groups,
                                                       lengths=lengths, **row.options))
    np.testing.assert_allclose(got[:, None] * m, expected, **TOL)


@pytest.mark.parametrize("value", ["k1+", "k3+ / low_var_kl+"])
def test_straight_through_kl_rows_have_the_value_and_the_k2_gradient(value):
    b = make_batch(4)
    b.ref_logp[0, 0] = b.logp[0, 0] + 3.0  # k3 = e^3 - 4 = 16.1: past verl's clamp at 10
    row = next(r for r in peers.coverage("verl") if r.peer_name == value)
    np.testing.assert_allclose(ours(row, b), _verl(b, value), **TOL)

    def grad():
        fn = jaxgrpo.get("kl", row.ours)
        return jax.grad(lambda lp: (fn(lp, jnp.asarray(b.ref_logp), mask=jnp.asarray(b.mask), **row.options)
                                    * b.mask).sum())(jnp.asarray(b.logp))

    # verl: the backward pass of 0.5 (logp - ref)^2, i.e. logp - ref, at every token (the clamped one too).
    np.testing.assert_allclose(_x64(grad), (b.logp - b.ref_logp) * b.mask, **TOL)


def _trl_token_gradient(b: Batch, loss_type: str):
    """d sum_t(per_token_loss * mask) / d logp of TRL's per-token loss, by hand (token-level ratios)."""
    a, lp, m = b.advantages[:, None], b.logp, b.mask
    r = np.exp(lp - b.old_logp)
    if loss_type == "dapo":  # -min(r A, clip(r) A): -r A where the unclipped term is the smaller one, else 0
        unclipped = r * a <= np.clip(r, 0.8, 1.2) * a
        return np.where(unclipped, -r * a, 0.0) * m
    if loss_type == "cispo":  # -sg(min(r, 5)) A log pi
        return -np.minimum(r, 5.0) * a * m
    if loss_type == "sapo":  # -(4 / tau) sigmoid(tau (r - 1)) A: slope 4 s (1 - s) r A
        tau = np.where(a > 0, 1.0, 1.05)
        sig = 1 / (1 + np.exp(-tau * (r - 1)))
        return -4 * sig * (1 - sig) * r * a * m
    if loss_type == "vespo":  # -sg(phi) A log pi
        seq_log = np.clip(((lp - b.old_logp) * m).sum(-1, keepdims=True), np.log(1e-8), 20)
        k, lam = np.where(a >= 0, 2.0, 3.0), np.where(a >= 0, 3.0, 2.0)
        return -np.exp(lam + k * seq_log - lam * np.exp(seq_log)) * a * m
    raise KeyError(loss_type)


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "sapo", "vespo"])
def test_trl_token_losses_have_the_peers_gradient(loss_type):
    b = make_batch(7)
    row = next(r for r in peers.coverage("trl") if r.peer_kind == "loss_type" and r.peer_name == loss_type)
    fn = jaxgrpo.get_loss(row.ours)

    def grad():
        def total(lp):
            per_token, _ = fn(lp, jnp.asarray(b.old_logp), jnp.asarray(b.advantages), jnp.asarray(b.mask), **row.options)
            return (per_token * b.mask).sum()

        return jax.grad(total)(jnp.asarray(b.logp))

    np.testing.assert_allclose(_x64(grad), _trl_token_gradient(b, loss_type), **TOL)


def test_trl_delta_is_dual_clip_with_c_delta():
    b = make_batch(5)
    # Ratios of e^1.5 = 4.5 > delta = 3 for a negative and a positive advantage.
    b.old_logp[0, :3] = b.logp[0, :3] - 1.5
    b.old_logp[5, :3] = b.logp[5, :3] - 1.5
    b.advantages[0], b.advantages[5] = -1.0, 1.0
    row = next(r for r in peers.coverage("trl") if r.peer_kind == "delta")
    ratio = np.exp(b.logp - b.old_logp)[b.mask > 0]
    assert (ratio > 3.0).any(), "the inputs must reach the delta bound"
    np.testing.assert_allclose(ours(row, b), _trl(b, "delta", row.peer_name), **TOL)


def test_trl_masks_and_importance_sampling_modes():
    b = make_batch(6)
    by_value = {r.peer_name: r for r in peers.coverage("trl")}
    # top_entropy_quantile: torch.quantile(valid entropies, 1 - rho) (linear), then entropy * mask >= it.
    row = by_value["rho"]
    cutoff = np.quantile(b.entropy[b.mask > 0], 1 - row.options["top_quantile"])
    got = _x64(lambda: jaxgrpo.get("mask", row.ours)(b.entropy, b.mask, **row.options))
    np.testing.assert_array_equal(got, ((b.entropy * b.mask >= cutoff) & (b.mask > 0)).astype(float))
    # off_policy_mask_threshold: keep if A >= 0 or the mean of (log pi_sampler - log pi) <= delta.
    row = by_value["delta"]
    b.old_logp[1] += 1.0  # a negative-advantage sequence that drifted past the threshold
    b.advantages[1] = -1.0
    drift = ((b.old_logp - b.logp) * b.mask).sum(1) / np.maximum(b.mask.sum(1), 1)
    keep = (b.advantages >= 0) | (drift <= row.options["threshold"])
    assert not keep.all(), "the inputs must drop a sequence"
    got = _x64(lambda: jaxgrpo.get("mask", row.ours)(b.logp, b.old_logp, b.advantages, b.mask, **row.options))
    np.testing.assert_array_equal(got, keep[:, None] * b.mask)
    # vllm_importance_sampling_mode: exp((old - sampler) * mask), per token or summed per sequence; truncated
    # at clip_max = 3, or zeroed outside [clip_min = -inf, 3]. Here old_logp plays pi_old, ref_logp the sampler.
    for value in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        row = by_value[value]
        diff = (b.old_logp - b.ref_logp) * b.mask
        if value.startswith("sequence"):
            diff = diff.sum(-1, keepdims=True)
        ratio = np.exp(diff)
        expected = np.minimum(ratio, 3.0) if value.endswith("truncate") else np.where(ratio > 3.0, 0.0, ratio)
        assert (ratio > 3.0).any(), "the inputs must reach clip_max"
        correction = jaxgrpo.get("credit", row.ours)
        got, _ = _x64(lambda: correction(b.old_logp, b.ref_logp, b.mask, **row.options))
        if value.endswith("mask"):  # as the row's note says: times the ratio itself
            ratio_itself = {**row.options, "mode": "truncate", "threshold": np.inf}
            got = got * _x64(lambda: correction(b.old_logp, b.ref_logp, b.mask, **ratio_itself))[0]
        np.testing.assert_allclose(got, expected * b.mask, **TOL)


def test_tunix_dapo_overlong_reward_shaping():
    row = next(r for r in peers.coverage("tunix") if r.peer_kind == "overlong_buffer")
    lengths = np.array([0, 100, 16384, 16385, 18000, 20480])
    buffer, max_len = row.options["cache_len"], row.options["max_len"]
    # tunix: min(-(len - (max_response_length - buffer)) / buffer * penalty, 0), penalty 1.
    expected = np.minimum(-(lengths - (max_len - buffer)) / buffer, 0.0)
    got = _x64(lambda: jaxgrpo.get("reward", row.ours)(lengths, **row.options))
    np.testing.assert_allclose(got, expected, **TOL)


# ------------------------------------------------------------------------------- CLI and docs


def test_cli_prints_each_peers_table(capsys):
    for name in peers.COVERAGE:
        assert kernels_main(["--peer", name]) == 0
        out = capsys.readouterr().out
        assert peers.PEERS[name].pin in out
        for row in peers.coverage(name):
            assert row.peer_name in out
    assert kernels_main(["--peer", "trl"]) == 0
    assert "loss vespo" in capsys.readouterr().out


def test_cli_rejects_an_unknown_peer_in_one_line(capsys):
    assert kernels_main(["--peer", "openrlhf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "jaxgrpo-kernels: error: unknown peer 'openrlhf'; valid peers: trl, tunix, verl"


def test_docs_have_a_peer_coverage_table_per_peer_with_its_commit():
    text = docs.render()
    section = text[text.index("## Peer coverage"):]
    for name, peer in peers.PEERS.items():
        assert f"### {name}" in section and (peer.commit or peer.release) in section and peer.date in section
        for row in peers.coverage(name):
            assert f"`{row.peer_name}`" in section
            for difference in row.differences:
                assert " ".join(difference.split()).replace("|", "\\|") in section
