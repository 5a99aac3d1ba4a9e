"""The estimators and losses of verl's registry that jaxgrpo adds: hand-computed goldens, gradients, sharding.

OPO, GPG, pass@k and ReMax advantages; the optimal token baseline; the Clip-Cov, KL-Cov, GMPO, DPPO (TV
and KL) and DRO losses. Parity with numpy transcriptions of verl's formulas is in test_peer_verl.py; the
finiteness property over degenerate groups and masked garbage in test_kernel_numerics.py.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.support.kernel_checks import assert_sharded_matches

import jaxgrpo
from jaxgrpo import kernels

NEW_ADVANTAGES = ("opo", "gpg", "pass_at_k", "remax")
NEW_LOSSES = ("clip_cov", "kl_cov", "gmpo", "dppo_tv", "dppo_kl", "dro")


def f32(x):
    return jnp.asarray(x, jnp.float32)


def ids(x):
    return jnp.asarray(x, jnp.int32)


def close(got, expected, atol=1e-5):
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected, np.float64), atol=atol, rtol=1e-5)


def test_registered_by_name_with_kind_and_paper():
    for name in NEW_ADVANTAGES:
        assert kernels.info("advantage", name).paper
    for name in NEW_LOSSES:
        assert kernels.info("loss", name).paper
    assert kernels.info("token_advantage", "optimal_token_baseline").paper


# ---------------------------------------------------------------- advantages


def test_opo_golden_length_weighted_baseline():
    # Group 0: r = [1, 0, 1], lengths [2, 4, 2] -> b = (2 + 0 + 2) / 8 = .5 -> [.5, -.5, .5].
    # Group 1: r = [1, 0], lengths [1, 3] -> b = 1/4 -> [.75, -.25] (the plain mean would give +-.5).
    # Group 2 has one row: it keeps its reward .7 (baseline 0), as verl.
    got = kernels.opo(f32([1, 0, 1, 1, 0, 0.7]), ids([0, 0, 0, 1, 1, 2]), num_groups=3,
                      lengths=f32([2, 4, 2, 1, 3, 5]))
    close(got, [0.5, -0.5, 0.5, 0.75, -0.25, 0.7])


def test_gpg_golden_rescales_by_the_share_of_nonzero_rewards():
    # N = 5 valid rows, M = 3 nonzero rewards -> alpha = 5/3. Group means 2/3 and 1/2:
    # A = 5/3 [1/3, -2/3, 1/3, 1/2, -1/2]. An invalid row counts in neither N nor M.
    got = kernels.gpg(f32([1, 0, 1, 1, 0, 1]), ids([0, 0, 0, 1, 1, 1]), num_groups=2,
                      valid=jnp.array([True] * 5 + [False]))
    close(got, np.array([1 / 3, -2 / 3, 1 / 3, 1 / 2, -1 / 2, 0.0]) * 5 / 3)
    # A single-row group keeps alpha * r (group mean 0): N = 1, M = 1 -> A = .4.
    close(kernels.gpg(f32([0.4]), ids([0]), num_groups=1), [0.4])


def test_pass_at_k_golden_only_the_best_row_gets_the_gap():
    # Group 0: [.2, .9, .5] -> best .9, second .5, gap .4; unbiased std: mean .5333, squared deviations
    # .11111 + .13444 + .00111 = .24667, / 2 -> std .35119; A = .4 / (.35119 + 1e-6) = 1.13899 on row 1.
    # Group 1 ties at the max: gap 0. Group 2 has one valid row: 0.
    r = f32([0.2, 0.9, 0.5, 1.0, 1.0, 0.3, 0.8])
    g = ids([0, 0, 0, 1, 1, 2, 2])
    valid = jnp.array([True] * 6 + [False])
    close(kernels.pass_at_k(r, g, num_groups=3, valid=valid), [0, 1.13899, 0, 0, 0, 0, 0])
    close(kernels.pass_at_k(r, g, num_groups=3, valid=valid, std_normalize=False), [0, 0.4, 0, 0, 0, 0, 0])


def test_remax_golden_subtracts_the_greedy_reward():
    got = kernels.remax(f32([0.2, 0.9, 1.0]), ids([0, 0, 1]), num_groups=2, baseline_rewards=f32([0.5, 0.5, np.nan]))
    close(got, [-0.3, 0.4, 0.0])  # a NaN baseline makes its row invalid
    with pytest.raises(ValueError, match=r"baseline_rewards must have shape \[N\]=\[3\]"):
        kernels.remax(f32([0.2, 0.9, 1.0]), ids([0, 0, 1]), num_groups=2, baseline_rewards=f32([0.5]))


def test_optimal_token_baseline_golden():
    # One group of two rows. Row 0: two tokens, pi_old = [.5, .5], sum pi^2 = [.5, .5], reward 1 on its last
    # token -> w = 1 - 2 pi + sum pi^2 = [.5, .5], W = [.5, 1], G = [1, 1]. Row 1: one token, pi_old = .25,
    # sum pi^2 = .25, reward 0 -> w = W = .75, G = 0. B_0 = (1 * .5 + 0 * .75) / (.5 + .75) = .4, B_1 = 1 * 1 / 1 = 1.
    # A = row 0 [1 - .4, 1 - 1] = [.6, 0]; row 1 [0 - .4, (masked) 0]. A third row alone in group 1 keeps A = G.
    rewards = f32([[0.0, 1.0], [0.0, 0.0], [0.0, 2.0]])
    mask = f32([[1, 1], [1, 0], [1, 1]])
    old_logp = jnp.log(f32([[0.5, 0.5], [0.25, 1.0], [0.5, 0.5]]))
    sum_sq = f32([[0.5, 0.5], [0.25, 0.0], [0.5, 0.5]])
    adv, returns = kernels.optimal_token_baseline(rewards, mask, ids([0, 0, 1]), old_logp, sum_sq, num_groups=2,
                                                  handle_zero_tail=False)
    close(adv, [[0.6, 0.0], [-0.4, 0.0], [2.0, 2.0]])
    close(returns, [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    # Truncated IS weights scale w by rho^2: rho = 2 on row 1 -> W_1 = 3, B_0 = .5 / 3.5.
    adv, _ = kernels.optimal_token_baseline(rewards, mask, ids([0, 0, 1]), old_logp, sum_sq, num_groups=2,
                                            is_weights=f32([[1, 1], [2, 1], [1, 1]]), handle_zero_tail=False)
    close(adv[:2, 0], [1 - 0.5 / 3.5, -0.5 / 3.5])
    # handle_zero_tail (the default, as verl's): row 0 is the one longest of group 0 (2 tokens vs 1), so past the
    # second-longest length (t >= 1) its baseline is 0: A[0, 1] = G = 1 instead of 0. Group 1 has one row: unchanged.
    adv, _ = kernels.optimal_token_baseline(rewards, mask, ids([0, 0, 1]), old_logp, sum_sq, num_groups=2)
    close(adv, [[0.6, 1.0], [-0.4, 0.0], [2.0, 2.0]])


# ---------------------------------------------------------------- losses


def loss_and_grad(name, logp, old, adv, mask, **hparams):
    fn = jaxgrpo.get_loss(name)

    def total(lp):
        per_token, _ = fn(lp, old, adv, mask, **hparams)
        return per_token.sum(), per_token

    (_, per_token), grad = jax.value_and_grad(total, has_aux=True)(logp)
    return np.asarray(per_token), np.asarray(grad)


# Two rows of two tokens, A = [2, -2] per row; mean A = 0, mean log pi = -1.625, so
# cov = A (log pi + 1.625) = [[2.25, -2.75], [-1.25, 0.75]].
COV_LOGP = f32([[-0.5, -3.0], [-1.0, -2.0]])
COV_ADV = f32([2.0, -2.0])
ONES = jnp.ones((2, 2))


def test_clip_cov_golden_detaches_the_token_of_covariance_in_range():
    # On-policy (rho = 1, nothing PPO-clipped). Candidates: 1 < cov < 5 -> only token (0, 0); k = max(floor(2e-4 * 4), 1) = 1.
    # Its loss and gradient are 0; the others carry -A rho with gradient -A rho.
    loss, grad = loss_and_grad("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, ONES)
    close(loss, [[0.0, -2.0], [2.0, 2.0]])
    close(grad, [[0.0, -2.0], [2.0, 2.0]])
    # With lb = .5 the candidates are cov 2.25 and .75; k = 1 takes the larger (no key), k = 2 both.
    close(loss_and_grad("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, ONES, clip_cov_lb=0.5)[0], [[0.0, -2.0], [2.0, 2.0]])
    close(loss_and_grad("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, ONES, clip_cov_lb=0.5, clip_cov_ratio=0.5)[0],
          [[0.0, -2.0], [2.0, 0.0]])
    # With a key the choice among the candidates is random, still only among them.
    loss = kernels.clip_cov(COV_LOGP, COV_LOGP, COV_ADV, ONES, clip_cov_lb=0.5, key=jax.random.key(0))[0]
    assert int((np.asarray(loss) == 0).sum()) == 1 and float(loss[0, 1]) == -2.0 and float(loss[1, 0]) == 2.0


def test_kl_cov_golden_penalizes_the_token_of_largest_covariance():
    # log rho = .1 at token (0, 0), the largest cov (2.25): l = -2 e^.1 + |.1| = -2.11034, gradient
    # -2 e^.1 + sign(.1) = -1.21034; elsewhere l = -A (rho = 1), gradient -A.
    old = COV_LOGP - f32([[0.1, 0.0], [0.0, 0.0]])
    loss, grad = loss_and_grad("kl_cov", COV_LOGP, old, COV_ADV, ONES)
    e = math.exp(0.1)
    close(loss, [[-2 * e + 0.1, -2.0], [2.0, 2.0]])
    close(grad, [[-2 * e + 1.0, -2.0], [2.0, 2.0]])


def test_gmpo_golden_clips_in_log_space_and_averages_geometrically():
    # log rho = [.5, -.1], eps .4. A = +1: x' = min(x, clip(x)) = [.4, -.1] -> r = e^.15 = 1.16183 on both
    # tokens; d/dlogp_t of 2 * (-r) = -r * d x'_t / d x_t -> [0 (clipped), -1.16183].
    # A = -1: x' = max(x, clip(x)) = [.5, -.1] -> r = e^.2, loss +e^.2, gradient e^.2 / 2 * 2 = [e^.2, e^.2].
    old = f32([[-1.0, -1.0]])
    logp = old + f32([[0.5, -0.1]])
    loss, grad = loss_and_grad("gmpo", logp, old, f32([1.0]), jnp.ones((1, 2)))
    close(loss, [[-math.exp(0.15)] * 2])
    close(grad, [[0.0, -math.exp(0.15)]])
    loss, grad = loss_and_grad("gmpo", logp, old, f32([-1.0]), jnp.ones((1, 2)))
    close(loss, [[math.exp(0.2)] * 2])
    close(grad, [[math.exp(0.2), math.exp(0.2)]])


DPPO_LOGP = jnp.log(f32([[0.6, 0.6, 0.35, 0.9]]))
DPPO_OLD = jnp.log(f32([[0.3, 0.3, 0.3, 0.01]]))
DPPO_ADV = f32([[1.0, -1.0, 1.0, -1.0]])


def test_dppo_tv_golden():
    # Token 0: p - p_old = .3 > .2 with A > 0 -> masked out. Token 1: same change, A < 0 -> kept: rho = 2,
    # l = -A rho log p = 2 log .6 = -1.02165, gradient -A rho = 2. Token 2: change .05 -> kept, rho = 7/6,
    # l = -(7/6) log .35 = 1.22479, gradient -7/6. Token 3: rho = 90 capped at 20, l = 20 log .9, gradient 20.
    loss, grad = loss_and_grad("dppo_tv", DPPO_LOGP, DPPO_OLD, DPPO_ADV, jnp.ones((1, 4)))
    close(loss, [[0.0, 2 * math.log(0.6), -(7 / 6) * math.log(0.35), 20 * math.log(0.9)]])
    close(grad, [[0.0, 2.0, -7 / 6, 20.0]])


def test_dppo_kl_golden():
    # p = .6, p_old = .3: D = .3 log(.3/.6) + .7 log(.7/.4) = .18379 <= .2 -> token 0 kept (A > 0): l = -2 log .6.
    # With delta_high = .1 it is masked (D > .1 and p > p_old); token 1 (A < 0, p >= p_old) stays kept.
    d = 0.3 * math.log(0.3 / 0.6) + 0.7 * math.log((0.7 + 1e-8) / (0.4 + 1e-8))
    assert abs(d - 0.18379) < 1e-5
    loss, grad = loss_and_grad("dppo_kl", DPPO_LOGP, DPPO_OLD, DPPO_ADV, jnp.ones((1, 4)))
    close(loss[0, :2], [-2 * math.log(0.6), 2 * math.log(0.6)])
    close(grad[0, :2], [-2.0, 2.0])
    loss, grad = loss_and_grad("dppo_kl", DPPO_LOGP, DPPO_OLD, DPPO_ADV, jnp.ones((1, 4)), delta_high=0.1)
    close(loss[0, :2], [0.0, 2 * math.log(0.6)])
    close(grad[0, :2], [0.0, 2.0])


def test_dro_golden():
    # log pi = log .5, log pi_old = log .25, A = 1, beta = .1: delta = log 2 = .69315,
    # l = -(log .5 - .05 delta^2) = .69315 + .02402 = .71717; gradient -(A - beta delta) = -.93069.
    loss, grad = loss_and_grad("dro", jnp.log(f32([[0.5]])), jnp.log(f32([[0.25]])), f32([1.0]), jnp.ones((1, 1)))
    d = math.log(2.0)
    close(loss, [[d + 0.05 * d * d]])
    close(grad, [[-(1 - 0.1 * d)]])


# ---------------------------------------------------------------- sharded == unsharded on 8 devices


def _outcome_batch(n=32, groups=8, seed=1):
    rng = np.random.default_rng(seed)
    return dict(
        rewards=jnp.asarray(rng.integers(0, 2, n) * rng.uniform(0.5, 1.0, n), jnp.float32),
        group_ids=jnp.asarray(rng.permutation(np.repeat(np.arange(groups), n // groups)), jnp.int32),
        valid=jnp.asarray(rng.random(n) > 0.2),
    ), rng


@pytest.mark.parametrize("name", NEW_ADVANTAGES)
def test_advantages_sharded_match_unsharded(name, mesh_2x4):
    arrays, rng = _outcome_batch()
    n = arrays["rewards"].shape[0]
    if name == "opo":
        arrays["lengths"] = jnp.asarray(rng.integers(1, 50, n), jnp.float32)
    if name == "remax":
        arrays["baseline_rewards"] = jnp.asarray(rng.random(n), jnp.float32)
    assert_sharded_matches(jaxgrpo.get_advantage(name), arrays, mesh_2x4, num_groups=8)


@pytest.mark.parametrize("name", ("reinforce_pp", "reinforce_pp_baseline"))
def test_token_whitening_sharded_matches_unsharded(name, mesh_2x4):
    arrays, rng = _outcome_batch()
    arrays["lengths"] = jnp.asarray(rng.integers(0, 50, arrays["rewards"].shape[0]), jnp.float32)
    assert_sharded_matches(jaxgrpo.get_advantage(name), arrays, mesh_2x4, num_groups=8)


def test_optimal_token_baseline_sharded_matches_unsharded(mesh_2x4):
    arrays, rng = _outcome_batch(n=16, groups=4)
    t = 8
    lengths = rng.integers(1, t + 1, 16)
    mask = jnp.asarray(np.arange(t)[None] < lengths[:, None], jnp.float32)
    probs = rng.uniform(0.05, 0.95, (16, t))
    token_arrays = dict(
        token_rewards=jnp.asarray(np.where(np.arange(t)[None] == lengths[:, None] - 1, rng.random((16, 1)), 0.0),
                                  jnp.float32),
        mask=mask, group_ids=arrays["group_ids"], old_logp=jnp.asarray(np.log(probs), jnp.float32),
        sum_pi_squared=jnp.asarray(probs**2 + rng.uniform(0, 0.05, (16, t)), jnp.float32), valid=arrays["valid"],
    )
    assert_sharded_matches(kernels.optimal_token_baseline, token_arrays, mesh_2x4, num_groups=4)


def _token_batch(shape=(16, 8), seed=0):
    rng = np.random.default_rng(seed)
    old = jnp.asarray(-rng.uniform(0.05, 4.0, shape), jnp.float32)
    logp = jnp.minimum(old + jnp.asarray(rng.normal(size=shape) * 0.3, jnp.float32), 0.0)
    return dict(logp=logp, old_logp=old, advantages=jnp.asarray(rng.normal(size=shape[:1]), jnp.float32),
                mask=jnp.asarray(rng.random(shape) > 0.3, jnp.float32))


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_losses_sharded_match_unsharded(name, mesh_2x4):
    hparams = {"clip_cov": dict(clip_cov_ratio=0.05, clip_cov_lb=0.0), "kl_cov": dict(kl_cov_ratio=0.05)}.get(name, {})
    assert_sharded_matches(jaxgrpo.get_loss(name), _token_batch(), mesh_2x4, **hparams)
