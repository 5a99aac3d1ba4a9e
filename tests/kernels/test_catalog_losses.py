"""Catalog losses (METHODS.md §2 items 20-26): goldens, own hand cases, reductions, properties, sharding."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jaxgrpo.kernels import losses as cl
from jaxgrpo.kernels.advantages import grpo, hapo
from jaxgrpo.kernels.aggregation import AGGREGATION_MODES, aggregate
from jaxgrpo.kernels.losses import ppo_clip
from jaxgrpo.kernels.registry import get, get_loss
from tests.support.kernel_checks import assert_sharded_matches, outcome_batches, token_batches

ONE = jnp.ones((1, 1))


def _tok(*values):
    """A [N, 1] batch of single-token rows."""
    return jnp.asarray(values, jnp.float32)[:, None]


# ----------------------------------------------------------------------------- SAPO


def test_sapo_golden_gate_value_and_slope():
    # METHODS.md: f(1) = 2 for tau = 1; dL/drho at rho = 1.2, tau = 1 is 0.990 |A|.
    assert float(cl.sapo_gate(jnp.float32(1.0), 1.0)) == pytest.approx(2.0)
    slope = jax.grad(lambda r: -cl.sapo_gate(r, 1.0) * 1.0)(jnp.float32(1.2))
    # 4 sigma(0.2)(1 - sigma(0.2)) = 4 * 0.54983 * 0.45017 = 0.99007
    assert float(slope) == pytest.approx(-0.99007, abs=1e-4)


def test_sapo_own_case_negative_advantage_uses_tau_neg():
    # rho = 1, A = -2: tau_neg = 1.05 -> f = 2 / 1.05 = 1.904762, loss = -f A = 3.809524
    loss, _ = cl.sapo(_tok(-1.0), _tok(-1.0), jnp.array([-2.0]), ONE)
    assert float(loss[0, 0]) == pytest.approx(3.809524, rel=1e-5)
    # through the registry: positive A uses tau_pos = 1 -> f = 2, loss = -2 A = -1 for A = 0.5
    loss, _ = get_loss("sapo")(_tok(-1.0), _tok(-1.0), jnp.array([0.5]), ONE)
    assert float(loss[0, 0]) == pytest.approx(-1.0)


def test_sapo_reduces_to_unclipped_surrogate_gradient_at_ratio_one():
    # The paper: at rho = 1 the gate's slope is 1, the unclipped surrogate -rho A's.
    logp = jnp.array([[-1.0, -2.0], [-0.5, -3.0]])
    adv = jnp.array([1.5, -0.7])
    mask = jnp.ones_like(logp)
    g_sapo = jax.grad(lambda lp: cl.sapo(lp, logp, adv, mask)[0].sum())(logp)
    g_plain = jax.grad(lambda lp: (-jnp.exp(lp - logp) * adv[:, None]).sum())(logp)
    np.testing.assert_allclose(g_sapo, g_plain, rtol=1e-6)


# ----------------------------------------------------------------------------- BAPO


def test_bapo_golden_bound_search():
    # METHODS.md: pos rho = [1.3, 1.5], neg rho = [1.0], target 2.6 -> c_high ends at 1.30.
    # c_low walks 0.6 -> 0.8 first (negative contribution stays max(1.0, c_low) = 1);
    # then c_high 1.25 gives 1.25 + 1.25 = 2.5 < 2.6, 1.30 gives 2.6 >= 2.6.
    low, high, ratio = cl.bapo_clip_bounds(_tok(1.3, 1.5, 1.0), jnp.array([1.0, 1.0, -1.0]), jnp.ones((3, 1)), target=2.6)
    assert float(high) == pytest.approx(1.30, abs=1e-6)
    assert float(low) == pytest.approx(0.8, abs=1e-6)
    assert float(ratio) == pytest.approx(2.6, rel=1e-6)


def test_bapo_own_cases_bounds_and_loss():
    # No negative advantage: P/Q = inf meets any target at the start (0.6, 1.2).
    low, high, _ = cl.bapo_clip_bounds(_tok(1.5, 0.7), jnp.array([1.0, 2.0]), jnp.ones((2, 1)), target=10.0)
    assert (float(low), float(high)) == pytest.approx((0.6, 1.2))
    # Unreachable target: P = min(1.1, c_high) = 1.1, Q = max(1.0, c_low) * 3 = 3 -> 0.367 < 5
    # at every pair, so the last pair (0.8, 2.0) is used.
    low, high, r = cl.bapo_clip_bounds(_tok(1.1, 1.0), jnp.array([1.0, -3.0]), jnp.ones((2, 1)), target=5.0)
    assert (float(low), float(high)) == pytest.approx((0.8, 2.0))
    assert float(r) == pytest.approx(1.1 / 3.0, rel=1e-5)
    # Loss with the golden batch's bounds (0.8, 1.3): rho 1.3, A 1 -> -1.3; rho 1.5, A 1 -> -1.3
    # (clipped); rho 1.0, A -1 -> max(1.0, clip(1.0, 0.8, 1.3)) = 1.0.
    logp = jnp.log(_tok(1.3, 1.5, 1.0))
    loss, metrics = cl.bapo(logp, jnp.zeros_like(logp), jnp.array([1.0, 1.0, -1.0]), jnp.ones((3, 1)), target=2.6)
    np.testing.assert_allclose(loss[:, 0], [-1.3, -1.3, 1.0], rtol=1e-6)
    assert float(metrics["clip_high"]) == pytest.approx(1.3)


def test_bapo_search_jits():
    f = jax.jit(lambda r, a, m: cl.bapo_clip_bounds(r, a, m, target=2.6))
    low, high, _ = f(_tok(1.3, 1.5, 1.0), jnp.array([1.0, 1.0, -1.0]), jnp.ones((3, 1)))
    assert float(high) == pytest.approx(1.3)


# ----------------------------------------------------------------------------- DisCO


def _disco_loss(logp, rewards, group_ids, num_groups, mask=None, old=None, **kw):
    mask = jnp.ones_like(logp) if mask is None else mask
    old = jax.lax.stop_gradient(logp) if old is None else old
    per_token, metrics = cl.disco(
        logp, old, jnp.zeros(logp.shape[0]), mask, rewards=rewards, group_ids=group_ids, num_groups=num_groups, **kw
    )
    return aggregate(per_token, mask, "seq_mean_token_mean")[0], metrics


def test_disco_golden_objective_and_negative_weights():
    # METHODS.md: s+ = 0.9, s- = [0.2, 0.4], tau = 1 -> J = 0.595, negative weights [0.450, 0.550].
    # logL score on one-token rows: s = logp. old_logp = logp, so the KL term is 0.
    logp = _tok(0.9, 0.2, 0.4)
    f = lambda lp: _disco_loss(lp, jnp.array([1.0, 0.0, 0.0]), jnp.zeros(3, jnp.int32), 1, tau=1.0)[0]
    value, grad = jax.jit(jax.value_and_grad(f))(logp)
    assert float(value) == pytest.approx(-0.595, abs=1e-3)
    # d(-J)/ds+ = -1, d(-J)/ds-_j = softmax(s-)_j = e^.2 / (e^.2 + e^.4), e^.4 / (...)
    np.testing.assert_allclose(grad[:, 0], [-1.0, 0.450166, 0.549834], rtol=1e-5)


def test_disco_own_cases_dropped_question_and_kl_hinge():
    # Two questions, the second all positive (dropped): L = -(0.595 + 0) / Q with Q = 2.
    logp = _tok(0.9, 0.2, 0.4, 0.5, 0.6)
    loss, metrics = _disco_loss(logp, jnp.array([1.0, 0, 0, 1, 1]), jnp.array([0, 0, 0, 1, 1]), 2, tau=1.0)
    assert float(loss) == pytest.approx(-0.595 / 2, abs=1e-3)
    assert float(metrics["num_valid_questions"]) == 1.0
    # KL only (one all-negative question): log rho = 0.1 on both tokens,
    # k3 = e^0.1 - 1 - 0.1 = 0.0051709; coefficient 1e3 (0.0051709 - 1e-4) = 5.0709;
    # penalty = 5.0709 * 0.0051709 = 0.026221.
    logp = jnp.full((1, 2), -1.0)
    loss, metrics = _disco_loss(logp, jnp.array([0.0]), jnp.array([0]), 1, old=logp - 0.1)
    assert float(metrics["kl"]) == pytest.approx(0.0051709, rel=1e-4)
    assert float(loss) == pytest.approx(0.026221, rel=1e-3)


def test_disco_lratio_score_and_jit():
    # Lratio (tau = 1): s = mean rho. Rows: rho = [1.0, 1.0], [e^{-0.5}] -> s+ = 1, s- = 0.60653;
    # J = 1 - log(exp(0.60653)) = 0.39347 (one negative: log-mean-exp is s- itself).
    logp = jnp.array([[-1.0, -1.0], [-1.5, 0.0]])
    old = jnp.array([[-1.0, -1.0], [-1.0, 0.0]])
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    f = jax.jit(lambda lp: cl.disco(lp, old, jnp.zeros(2), mask, rewards=jnp.array([1.0, 0.0]),
                                    group_ids=jnp.array([0, 0]), num_groups=1, score="Lratio", beta=0.0))
    _, metrics = f(logp)
    assert float(metrics["objective"]) == pytest.approx(1.0 - math.exp(-0.5), rel=1e-5)


# ----------------------------------------------------------------------------- HAPO


def test_hapo_advantage_golden():
    # METHODS.md: r = [1, 0], lengths [1, 3] -> mu = 0.25, sigma = 0.433 -> A = [1.732, -0.577].
    adv = get("advantage", "hapo")(jnp.array([1.0, 0.0]), jnp.array([0, 0]), num_groups=1, lengths=jnp.array([1, 3]))
    np.testing.assert_allclose(adv, [1.7320508, -0.5773503], rtol=1e-5)


def test_hapo_advantage_own_cases_and_fallback():
    # r = [1, 0, 0], lengths [2, 1, 1]: mu = 2/4 = 0.5, sigma^2 = (2*.25 + .25 + .25)/4 = 0.25 -> A = [1, -1, -1].
    adv = hapo(jnp.array([1.0, 0.0, 0.0]), jnp.array([0, 0, 0]), num_groups=1, lengths=jnp.array([2, 1, 1]))
    np.testing.assert_allclose(adv, [1.0, -1.0, -1.0], rtol=1e-5)
    # r = [1, 0], lengths [1, 99]: mu = 0.01, sigma = sqrt(0.0099) = 0.0995 -> A_1 = 9.95 >= 5: GRPO fallback.
    rewards, ids = jnp.array([1.0, 0.0]), jnp.array([0, 0])
    adv = hapo(rewards, ids, num_groups=1, lengths=jnp.array([1, 99]))
    np.testing.assert_allclose(adv, grpo(rewards, ids, num_groups=1), rtol=1e-6)


def test_hapo_advantage_equal_lengths_reduce_to_population_std_grpo():
    rewards = jnp.array([0.3, 1.0, 0.0, 0.5, 0.5, 0.9])
    ids = jnp.array([0, 0, 0, 1, 1, 1])
    adv = hapo(rewards, ids, num_groups=2, lengths=jnp.full(6, 7))
    np.testing.assert_allclose(adv, grpo(rewards, ids, num_groups=2, std_ddof=0), rtol=1e-5, atol=1e-6)


_hapo_jit = jax.jit(lambda r, i, v, n: hapo(r, i, num_groups=6, valid=v, lengths=n))


@settings(max_examples=30, deadline=None)
@given(batch=outcome_batches(), data=st.data())
def test_hapo_advantage_finite_and_zero_where_invalid(batch, data):
    # Padded to 48 rows (invalid) and 6 groups, so one compiled shape serves every example.
    rewards, ids, valid, _ = batch
    pad = 48 - len(rewards)
    rewards, ids, valid = jnp.pad(rewards, (0, pad)), jnp.pad(ids, (0, pad)), jnp.pad(valid, (0, pad))
    lengths = jnp.asarray(data.draw(st.lists(st.integers(0, 50), min_size=48, max_size=48)))
    adv = _hapo_jit(rewards, ids, valid, lengths)
    assert np.all(np.isfinite(adv))
    assert np.all(np.asarray(adv)[~np.asarray(valid)] == 0)


def test_hapo_entropy_scale_and_clip_golden():
    # log H = [0,0,0,0,0,1]: pivot (0.8 quantile, nearest rank round(0.8*5)=4) = 0; h = [0,...,0,1];
    # rms = sqrt(1/6) -> h_6 = 2.449, scaled by the positive max -> h_hat = [0,...,0,1].
    entropy = jnp.exp(jnp.array([[0.0, 0, 0, 0, 0, 1]]))
    h = cl.hapo_entropy_scale(entropy, jnp.ones((1, 6)))
    np.testing.assert_allclose(h, [[0, 0, 0, 0, 0, 1]], atol=1e-6)
    # METHODS.md: h = +-1 -> eps' = 0.4 (eps = 0.2, alpha = 1).
    low, high = cl.hapo_adaptive_clip_range(jnp.array([-1.0, 1.0]))
    np.testing.assert_allclose(low, [0.4, 0.2], rtol=1e-6)
    np.testing.assert_allclose(high, [0.2, 0.4], rtol=1e-6)


def test_hapo_entropy_scale_keeps_sign_in_unit_range():
    entropy = jnp.exp(jnp.array([[-3.0, -1.0, 0.0, 0.5, 2.0, 9.0]]))
    h = cl.hapo_entropy_scale(entropy, jnp.array([[1.0, 1, 1, 1, 1, 0]]))
    assert float(h.min()) == pytest.approx(-1.0) and float(h.max()) == pytest.approx(1.0)
    assert float(h[0, 5]) == 0.0  # masked
    assert np.all(np.diff(np.asarray(h[0, :5])) > 0)  # monotone in the entropy


def test_hapo_clip_own_case():
    # Token 6 has h_hat = 1: eps_high' = 0.4, neutral band (1 - 0.2/2, 1 + 0.4/2) = (0.9, 1.2).
    # rho = 1.3 is outside it, so A' = A (1 + 1) = 2: loss = -min(1.3*2, clip(1.3, 0.8, 1.4)*2) = -2.6.
    # Tokens with h_hat = 0 reduce to ppo_clip (rho = 1.3 -> -clip(1.3, 0.8, 1.2) = -1.2).
    entropy = jnp.exp(jnp.array([[0.0, 0, 0, 0, 0, 1]]))
    logp = jnp.full((1, 6), math.log(1.3))
    old = jnp.zeros((1, 6))
    loss, _ = cl.hapo_clip(logp, old, jnp.array([1.0]), jnp.ones((1, 6)), entropy=entropy)
    np.testing.assert_allclose(loss, [[-1.2] * 5 + [-2.6]], rtol=1e-5)
    # Without the redistribution the high-entropy token is only clipped wider: -min(1.3, 1.3) = -1.3.
    loss, _ = cl.hapo_clip(logp, old, jnp.array([1.0]), jnp.ones((1, 6)), entropy=entropy, adaptive_advantage=False)
    assert float(loss[0, 5]) == pytest.approx(-1.3, rel=1e-5)
    plain, _ = ppo_clip(logp, old, jnp.array([1.0]), jnp.ones((1, 6)))
    np.testing.assert_allclose(loss[0, :5], plain[0, :5], rtol=1e-6)


# ----------------------------------------------------------------------------- DeGRPO


def test_degrpo_golden_decoupled_means():
    # [2, 4] batch, rho = 1 so l = -A per token; A = [[1,2,3,4],[5,6,7,8]].
    # mode tokens (t = 0): mean(-1, -5) = -3; response tokens: -(2+3+4+6+7+8)/6 = -5.
    adv = jnp.arange(1.0, 9.0).reshape(2, 4)
    logp = jnp.full((2, 4), -1.0)
    mask = jnp.ones((2, 4))
    per_token, _ = cl.degrpo(logp, logp, adv, mask, mode_token_weight=1.0)
    assert float(aggregate(per_token, mask, "token_mean")[0]) == pytest.approx(-3.0 - 5.0)  # alpha = 1
    per_token, m = cl.degrpo(logp, logp, adv, mask)
    assert float(aggregate(per_token, mask, "token_mean")[0]) == pytest.approx(1e-3 * -3.0 - 5.0)
    assert float(m["mode_token_loss"]) == pytest.approx(-3.0)


def test_degrpo_mode_token_is_first_unmasked():
    # Left-padded row: its mode token is t = 1. With alpha = 1 the loss is
    # mean(-1 [row 0 t0], -6 [row 1 t1]) + mean(-2, -3, -7) = -3.5 - 4 = -7.5.
    adv = jnp.array([[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]])
    mask = jnp.array([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    logp = jnp.zeros((2, 3))
    per_token, _ = cl.degrpo(logp, logp, adv, mask, mode_token_weight=1.0)
    assert float(aggregate(per_token, mask, "token_mean")[0]) == pytest.approx(-7.5)


# ----------------------------------------------------------------------------- Critique-GRPO


def test_critique_golden_shaping():
    # METHODS.md: p = 0.5 -> f = 0.5/0.6 = 0.833, df/dp = 0.1/0.6^2 = 0.278.
    assert float(cl.policy_shaping(jnp.float32(0.5))) == pytest.approx(0.833333, rel=1e-5)
    assert float(jax.grad(cl.policy_shaping)(jnp.float32(0.5))) == pytest.approx(0.277778, rel=1e-5)


def test_critique_own_case_on_and_off_policy_tokens():
    # Token 0 on-policy: rho = e^0.1, A = 1 -> -1.105171 (unclipped). Token 1 off-policy:
    # p = 0.5 -> -A f(p) = -2 * 0.833333 = -1.666667 (no ratio to old_logp).
    logp = jnp.array([[-1.0, math.log(0.5)], [-1.0, math.log(0.5)]])
    old = jnp.array([[-1.1, -7.0], [-1.1, -7.0]])
    adv = jnp.array([[1.0, 2.0], [1.0, 2.0]])
    loss, _ = cl.critique_grpo(logp, old, adv, jnp.ones((2, 2)), prefix_mask=jnp.array([[0, 1], [0, 1]]))
    np.testing.assert_allclose(loss[0], [-1.105171, -1.666667], rtol=1e-5)
    # With eps_low = 0.2 the on-policy token is PPO-clipped: -min(1.105, 1.105) unchanged here,
    # but rho = e^0.5 = 1.6487 clips to 1.2.
    loss, _ = cl.critique_grpo(old + 0.5, old, adv, jnp.ones((2, 2)), prefix_mask=jnp.zeros((2, 2)), eps_low=0.2)
    np.testing.assert_allclose(loss[0, 0], -1.2, rtol=1e-6)


# ----------------------------------------------------------------------------- every loss


def _extras(name, n, t, seed=0):
    """Extra array inputs and static kwargs each loss needs, for n rows of t tokens."""
    rng = np.random.default_rng(seed)
    if name == "disco":
        ids = (np.arange(n) // 2).astype(np.int32)
        return {"rewards": jnp.asarray(rng.integers(0, 2, n).astype(np.float32)), "group_ids": jnp.asarray(ids)}, {
            "num_groups": int(ids.max()) + 1
        }
    if name == "hapo_clip":
        return {"entropy": jnp.asarray(rng.uniform(0.0, 3.0, (n, t)).astype(np.float32))}, {}
    if name == "critique_grpo":
        return {"prefix_mask": jnp.asarray(rng.integers(0, 2, (n, t)).astype(np.float32))}, {}
    return {}, {}


LOSS_NAMES = ["sapo", "bapo", "disco", "hapo_clip", "degrpo", "critique_grpo"]


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_loss_composes_with_every_aggregation_mode(name):
    rng = np.random.default_rng(1)
    n, t = 4, 5
    logp = jnp.asarray(rng.uniform(-3, -0.1, (n, t)).astype(np.float32))
    old = logp + jnp.asarray(rng.normal(0, 0.2, (n, t)).astype(np.float32))
    adv = jnp.asarray(rng.normal(size=n).astype(np.float32))
    mask = jnp.asarray((rng.uniform(size=(n, t)) > 0.3).astype(np.float32)).at[:, 0].set(1.0)
    arrays, static = _extras(name, n, t)
    fn = get_loss(name)

    @jax.jit
    def all_modes(lp):
        def one(mode):
            return lambda x: aggregate(fn(x, old, adv, mask, **arrays, **static)[0], mask, mode)[0]

        return [jax.value_and_grad(one(mode))(lp) for mode in AGGREGATION_MODES]

    for value, grad in all_modes(logp):
        assert np.isfinite(value) and np.all(np.isfinite(grad))
    per_token, metrics = fn(logp, old, adv, mask, **arrays, **static)
    assert np.all(np.asarray(per_token)[np.asarray(mask) == 0] == 0)
    assert all(np.isfinite(v) for v in metrics.values())


_FINITE_CACHE = {}


def _finite_check(name):
    """One jitted (loss, metrics, gradient) per loss on a fixed [6, 8] shape, reused by every example."""
    if name not in _FINITE_CACHE:
        fn = get_loss(name)

        @jax.jit
        def check(logp, old, adv, mask, arrays):
            def total(lp):
                per_token, metrics = fn(lp, old, adv, mask, **arrays, **_extras(name, 6, 8)[1])
                return aggregate(per_token, mask)[0], (per_token, metrics)

            (_, (per_token, metrics)), grad = jax.value_and_grad(total, has_aux=True)(logp)
            return per_token, metrics, grad

        _FINITE_CACHE[name] = check
    return _FINITE_CACHE[name]


def _pad(x, n, t):
    return jnp.pad(x, [(0, n - x.shape[0]), (0, t - x.shape[1])])


@pytest.mark.parametrize("name", LOSS_NAMES)
@settings(max_examples=25, deadline=None)
@given(batch=token_batches(), data=st.data())
def test_loss_finite_on_random_and_degenerate_batches(name, batch, data):
    # token_batches draws up to [6, 8] with fully masked rows; padding to [6, 8] with
    # masked tokens keeps one compiled shape (the padding is itself a degenerate case).
    logp, old, mask = (_pad(x, 6, 8) for x in batch)
    adv = jnp.asarray(data.draw(st.lists(st.floats(-10, 10, width=32), min_size=6, max_size=6)), jnp.float32)
    if data.draw(st.booleans()):
        adv = jnp.zeros_like(adv)  # all equal
    if data.draw(st.booleans()):
        mask = jnp.zeros_like(mask)  # fully masked
    arrays, _ = _extras(name, 6, 8, seed=data.draw(st.integers(0, 100)))
    loss, metrics, grad = _finite_check(name)(logp, old, adv, mask, arrays)
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad))
    assert all(np.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_loss_sharded_matches_unsharded(name, mesh_2x4):
    rng = np.random.default_rng(2)
    n, t = 8, 4
    logp = jnp.asarray(rng.uniform(-3, -0.1, (n, t)).astype(np.float32))
    arrays = {
        "logp": logp,
        "old_logp": logp + jnp.asarray(rng.normal(0, 0.3, (n, t)).astype(np.float32)),
        "advantages": jnp.asarray(rng.normal(size=n).astype(np.float32)),
        "mask": jnp.asarray((rng.uniform(size=(n, t)) > 0.2).astype(np.float32)),
    }
    extra, static = _extras(name, n, t)
    arrays.update(extra)
    assert_sharded_matches(get_loss(name), arrays, mesh_2x4, atol=1e-5, **static)


def test_hapo_advantage_sharded_matches_unsharded(mesh_2x4):
    arrays = {
        "rewards": jnp.array([1.0, 0, 0, 1, 0.5, 0.2, 0.9, 0.9]),
        "group_ids": jnp.array([0, 0, 1, 1, 1, 2, 2, 3]),
        "lengths": jnp.array([3, 9, 1, 4, 4, 2, 7, 5]),
        "valid": jnp.array([True] * 7 + [False]),
    }
    assert_sharded_matches(hapo, arrays, mesh_2x4, num_groups=4)


def test_loss_errors_name_the_argument():
    with pytest.raises(ValueError, match="entropy"):
        cl.hapo_clip(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros(2), jnp.ones((2, 3)), entropy=jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="score"):
        cl.disco(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.zeros(1), ONE, rewards=jnp.ones(1),
                 group_ids=jnp.zeros(1, jnp.int32), num_groups=1, score="auc")
    with pytest.raises(ValueError, match="tau_pos"):
        cl.sapo(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.zeros(1), ONE, tau_pos=0.0)
