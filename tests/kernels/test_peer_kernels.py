"""The kernels that complete the peers' registries: grpo_batch_std, vespo, off_policy_sequence_mask,
high_entropy_token_mask. Goldens computed by hand, gradients, properties, sharded == unsharded."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgrpo
from jaxgrpo.kernels.advantages import grpo_batch_std
from jaxgrpo.kernels.losses import gamma_weight, vespo
from jaxgrpo.kernels.masks import high_entropy_token_mask, off_policy_sequence_mask
from tests.support.kernel_checks import assert_sharded_matches


def f32(x):
    return jnp.asarray(x, jnp.float32)


# ------------------------------------------------------------------------ grpo_batch_std


def test_grpo_batch_std_golden():
    # rewards [1, 0, 0 | 1, 1 | 0.5]: batch mean 3.5 / 6 = 0.58333; squared deviations
    # 0.17361, 0.34028, 0.34028, 0.17361, 0.17361, 0.00694 sum to 1.20833; / 5 = 0.24167, std 0.49160.
    # Group 0 (mean 1/3): (2/3) / (0.49160 + 1e-4) = 1.35585, (-1/3) / 0.49170 = -0.67793.
    # Group 1 is constant: 0. Group 2 has one rollout: 0.
    adv = grpo_batch_std(f32([1, 0, 0, 1, 1, 0.5]), jnp.array([0, 0, 0, 1, 1, 2]), num_groups=3)
    np.testing.assert_allclose(adv, [1.35585, -0.67793, -0.67793, 0, 0, 0], atol=2e-5)


def test_grpo_batch_std_ignores_invalid_rows_and_is_scale_free():
    rewards = f32([1, 0, 0, 1, 1, 0.5, 7.0])
    gids = jnp.array([0, 0, 0, 1, 1, 2, 2])
    valid = jnp.array([True] * 6 + [False])
    adv = grpo_batch_std(rewards, gids, num_groups=3, valid=valid)
    np.testing.assert_allclose(adv[:6], [1.35585, -0.67793, -0.67793, 0, 0, 0], atol=2e-5)
    assert float(adv[6]) == 0.0
    # Rewards scaled by 1e25 give the advantages of eps = 0 (eps is absolute), and nothing overflows.
    huge = grpo_batch_std(rewards * 1e25, gids, num_groups=3, valid=valid)
    np.testing.assert_allclose(huge, grpo_batch_std(rewards, gids, num_groups=3, valid=valid, eps=0.0), rtol=1e-5)


def test_grpo_batch_std_gradient_matches_finite_differences():
    rewards = f32([1.0, 0.2, -0.5, 0.7, 0.1, 0.9])
    gids = jnp.array([0, 0, 0, 1, 1, 1])
    weights = f32([1.0, -2.0, 0.5, 0.3, 1.5, -1.0])

    def total(r):
        return jnp.sum(weights * grpo_batch_std(r, gids, num_groups=2))

    grad = np.asarray(jax.grad(total)(rewards))
    h = 1e-2
    numeric = [(total(rewards.at[i].add(h)) - total(rewards.at[i].add(-h))) / (2 * h) for i in range(6)]
    np.testing.assert_allclose(grad, numeric, rtol=2e-2, atol=2e-3)


# ------------------------------------------------------------------------------- vespo


def test_vespo_golden_positive_and_negative_advantage():
    logp, old, mask = f32([[-1.0, -2.0]]), f32([[-1.1, -2.2]]), jnp.ones((1, 2))
    # log W = 0.1 + 0.2 = 0.3, W = 1.349859. A >= 0: k = 2, lam = 3:
    # phi = exp(3 + 2 * 0.3 - 3 * 1.349859) = exp(-0.449576) = 0.637899; l_t = -phi * A * logp_t.
    loss, metrics = vespo(logp, old, f32([1.0]), mask)
    np.testing.assert_allclose(loss, [[0.637899, 1.275797]], rtol=1e-5)
    assert float(metrics["phi_mean"]) == pytest.approx(0.637899, rel=1e-5)
    # A < 0: k = 3, lam = 2: phi = exp(2 + 0.9 - 2 * 1.349859) = exp(0.200282) = 1.221748.
    loss, _ = vespo(logp, old, f32([-2.0]), mask)
    np.testing.assert_allclose(loss, [[-2.443495, -4.886991]], rtol=1e-5)


def test_vespo_weight_is_one_on_policy_and_a_constant_of_the_gradient():
    assert float(gamma_weight(f32(0.0), 2.0, 3.0)) == pytest.approx(1.0)
    logp, old = f32([[-1.0, -2.0]]), f32([[-1.1, -2.2]])
    grad = jax.grad(lambda lp: vespo(lp, old, f32([1.0]), jnp.ones((1, 2)))[0].sum())(logp)
    # d(-phi A logp_t)/d logp_t = -phi A: phi does not depend on logp in the backward pass.
    np.testing.assert_allclose(grad, [[-0.637899, -0.637899]], rtol=1e-5)
    on_policy, _ = vespo(logp, logp, f32([1.5]), jnp.ones((1, 2)))
    np.testing.assert_allclose(on_policy, -1.5 * logp, rtol=1e-6)


def test_vespo_masks_tokens_and_adds_the_sampler_weights_in_log_space():
    logp, old = f32([[-1.0, -2.0]]), f32([[-1.1, jnp.nan]])
    # The masked token counts neither in log W (= 0.1) nor in the loss.
    loss, _ = vespo(logp, old, f32([1.0]), f32([[1.0, 0.0]]))
    phi = math.exp(3 + 2 * 0.1 - 3 * math.exp(0.1))
    np.testing.assert_allclose(loss, [[phi, 0.0]], rtol=1e-5)
    # Sampler weights e^0.2 and e^-0.1 add 0.1 to log W = 0.3: log W = 0.4.
    weights = f32([[math.exp(0.2), math.exp(-0.1)]])
    loss, _ = vespo(logp, f32([[-1.1, -2.2]]), f32([1.0]), jnp.ones((1, 2)), importance_weights=weights)
    phi = math.exp(3 + 2 * 0.4 - 3 * math.exp(0.4))
    np.testing.assert_allclose(loss, [[phi, 2 * phi]], rtol=1e-5)


def test_vespo_clamps_the_sequence_log_ratio():
    # sum of log-ratios 60 is clamped to 20: phi = exp(3 + 40 - 3 e^20) underflows to 0 (the sequence is dropped);
    # -60 is clamped to log(1e-8): phi = exp(3 + 2 log 1e-8 - 3e-8) = e^3 * 1e-16.
    logp = jnp.full((2, 3), -1.0)
    old = jnp.stack([jnp.full(3, -21.0), jnp.full(3, 19.0)])
    loss, _ = vespo(logp, old, f32([1.0, 1.0]), jnp.ones((2, 3)))
    np.testing.assert_allclose(loss[0], 0.0)
    np.testing.assert_allclose(loss[1], math.exp(3) * 1e-16, rtol=1e-3)


# -------------------------------------------------------------------------- token masks


def test_off_policy_sequence_mask_golden():
    logp = jnp.full((3, 2), -1.0)
    sampler = f32([[-0.2, -0.4], [-0.2, -0.4], [-1.1, jnp.inf]])
    mask = f32([[1, 1], [1, 1], [1, 0]])
    # mean drift log pi_sampler - log pi: rows 0 and 1 (0.8 + 0.6) / 2 = 0.7 > 0.5; row 2: -0.1 (one token).
    # Row 0 has A >= 0 (kept), row 1 A < 0 and drifted (dropped), row 2 A < 0 but close (kept).
    keep = off_policy_sequence_mask(logp, sampler, f32([1.0, -1.0, -1.0]), mask, threshold=0.5)
    np.testing.assert_array_equal(keep, [[1, 1], [0, 0], [1, 0]])
    keep = off_policy_sequence_mask(logp, sampler, f32([1.0, -1.0, -1.0]), mask, threshold=0.75)
    np.testing.assert_array_equal(keep, [[1, 1], [1, 1], [1, 0]])
    grad = jax.grad(lambda lp: off_policy_sequence_mask(lp, sampler, f32([1.0, -1.0, -1.0]), mask, threshold=0.5).sum())
    np.testing.assert_array_equal(grad(logp), 0.0)


def test_high_entropy_token_mask_golden():
    entropy = f32([[1.0, 2.0, 3.0], [4.0, 5.0, jnp.nan]])
    mask = f32([[1, 1, 1], [1, 1, 0]])
    # Unmasked entropies 1..5; the 0.6 quantile (linear): position 0.6 * 4 = 2.4, 3 + 0.4 = 3.4.
    np.testing.assert_array_equal(high_entropy_token_mask(entropy, mask, top_quantile=0.4), [[0, 0, 0], [1, 1, 0]])
    np.testing.assert_array_equal(high_entropy_token_mask(entropy, mask, top_quantile=1.0), mask)
    np.testing.assert_array_equal(high_entropy_token_mask(entropy, mask, top_quantile=0.0), [[0, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(high_entropy_token_mask(entropy, jnp.zeros((2, 3))), 0.0)
    with pytest.raises(ValueError, match="top_quantile"):
        high_entropy_token_mask(entropy, mask, top_quantile=1.5)


def test_new_kernels_are_registered_under_their_kinds():
    assert jaxgrpo.get("advantage", "grpo_batch_std") is grpo_batch_std
    assert jaxgrpo.get("loss", "vespo") is vespo
    assert jaxgrpo.get("mask", "off_policy_sequence_mask") is off_policy_sequence_mask
    assert jaxgrpo.get("mask", "high_entropy_token_mask") is high_entropy_token_mask


# ------------------------------------------------------------------ sharded == unsharded


def _token_arrays(seed=3, n=8, t=5):
    rng = np.random.default_rng(seed)
    logp = rng.uniform(-3, -0.1, (n, t)).astype(np.float32)
    lengths = rng.integers(1, t + 1, n)
    return {
        "logp": jnp.asarray(logp),
        "old_logp": jnp.asarray(logp + rng.normal(0, 0.3, (n, t)).astype(np.float32)),
        "advantages": jnp.asarray(rng.normal(size=n).astype(np.float32)),
        "mask": jnp.asarray((np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)),
    }


def test_grpo_batch_std_sharded_matches_unsharded(mesh_2x4):
    arrays = {
        "rewards": f32([1.0, 0, 0, 1, 0.5, 0.2, 0.9, 0.9]),
        "group_ids": jnp.array([0, 0, 1, 1, 1, 2, 2, 3]),
        "valid": jnp.array([True] * 7 + [False]),
    }
    assert_sharded_matches(grpo_batch_std, arrays, mesh_2x4, num_groups=4)


def test_vespo_sharded_matches_unsharded(mesh_2x4):
    arrays = _token_arrays()
    arrays["importance_weights"] = jnp.exp(0.1 * arrays["old_logp"])
    assert_sharded_matches(vespo, arrays, mesh_2x4, atol=1e-5)


def test_masks_sharded_match_unsharded(mesh_2x4):
    a = _token_arrays()
    assert_sharded_matches(
        off_policy_sequence_mask,
        {"logp": a["logp"], "sampler_logp": a["old_logp"], "advantages": a["advantages"], "mask": a["mask"]},
        mesh_2x4, threshold=0.05,
    )
    assert_sharded_matches(high_entropy_token_mask, {"entropy": -a["logp"], "mask": a["mask"]}, mesh_2x4,
                           top_quantile=0.3)
