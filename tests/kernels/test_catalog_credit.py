"""Token and segment credit (METHODS.md §2 items 27-30): goldens, own hand cases, properties, sharding."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jaxgrpo.kernels import credit
from jaxgrpo.kernels.registry import get
from tests.support.kernel_checks import assert_sharded_matches

finite_floats = st.floats(-50, 50, allow_nan=False, width=32)


# ----------------------------------------------------------------------------- TW-GRPO


def test_tw_grpo_golden_minmax_weights():
    # METHODS.md: KL = [0, .5, 1] -> w = [1, 1.35, 1.7] (alpha = 1.7).
    w = credit.minmax_token_weights(jnp.array([0.0, 0.5, 1.0]), jnp.ones(3))
    np.testing.assert_allclose(w, [1.0, 1.35, 1.7], rtol=1e-6)


def _two_row_group():
    # V = 2, one group of two rows, three positions:
    # t0: both [0.5, 0.5]                          -> KL 0
    # t1: [0.5, 0.5] vs [0.9, 0.1]: p_bar ∝ sqrt -> [0.75, 0.25];
    #     KL(p_bar||p1) = .75 ln 1.5 + .25 ln .5 = 0.130812, KL(p_bar||p2) = .75 ln(.75/.9) + .25 ln 2.5 = 0.092332
    #     mean 0.111572
    # t2: [0.5, 0.5] vs [0.8, 0.2]: p_bar -> [2/3, 1/3]; KLs 0.056633 and 0.048727, mean 0.052680
    # -> w = [1, 1.7, 1 + 0.7 * 0.052680 / 0.111572] = [1, 1.7, 1.330512]
    p1 = [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]
    p2 = [[0.5, 0.5], [0.9, 0.1], [0.8, 0.2]]
    return jnp.log(jnp.array([p1, p2]))


def test_tw_grpo_own_case():
    w = credit.tw_grpo_weights(_two_row_group(), jnp.array([0, 0]), num_groups=1, mask=jnp.ones((2, 3)))
    np.testing.assert_allclose(w, [[1.0, 1.7, 1.330512]] * 2, rtol=1e-4)


def test_tw_grpo_masked_positions_count_as_uniform():
    logp = _two_row_group()
    garbage = logp.at[1, 2].set(jnp.log(jnp.array([0.99, 0.01])))
    uniform = logp.at[1, 2].set(jnp.log(jnp.array([0.5, 0.5])))
    mask = jnp.array([[1.0, 1, 1], [1, 1, 0]])
    a = credit.tw_grpo_weights(garbage, jnp.array([0, 0]), num_groups=1, mask=mask)
    b = credit.tw_grpo_weights(uniform, jnp.array([0, 0]), num_groups=1, mask=mask)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    assert float(a[1, 2]) == 0.0  # no weight on a masked token


def test_tw_grpo_groups_are_independent():
    logp = jnp.concatenate([_two_row_group(), jnp.log(jnp.full((1, 3, 2), 0.5))])
    w = get("credit", "tw_grpo_weights")(logp, jnp.array([0, 0, 1]), num_groups=2, mask=jnp.ones((3, 3)))
    np.testing.assert_allclose(w[:2], [[1.0, 1.7, 1.330512]] * 2, rtol=1e-4)
    np.testing.assert_allclose(w[2], [1.0, 1.0, 1.0])  # a single row has KL 0 everywhere


# ----------------------------------------------------------------------------- PURE


def test_pure_golden():
    # METHODS.md: r = [0.9, -0.5, 0.8], T = 0.1 -> returns ≈ [-0.500, -0.500, 1.8e-6].
    g = credit.pure_min_form(jnp.array([[0.9, -0.5, 0.8]]), jnp.ones((1, 3)))
    np.testing.assert_allclose(g[0], [-0.5, -0.5, 1.808e-6], atol=2e-6, rtol=1e-3)


def test_pure_own_case_with_non_step_tokens():
    # Steps at t = 1 and t = 3 with equal rewards 0.2: w = [.5, .5], r' = [.1, .1];
    # returns-to-go over tokens [0.2, 0.2, 0.1, 0.1]; the masked last token gets 0.
    r = jnp.array([[9.0, 0.2, 9.0, 0.2, 0.0]])
    steps = jnp.array([[0, 1, 0, 1, 0]])
    g = credit.pure_min_form(r, steps, mask=jnp.array([[1, 1, 1, 1, 0]]))
    np.testing.assert_allclose(g[0], [0.2, 0.2, 0.1, 0.1, 0.0], rtol=1e-6)


def test_pure_approaches_min_of_future_rewards_as_temperature_falls():
    r = jnp.array([[0.7, 0.3, 0.9, 0.5]])
    g = credit.pure_min_form(r, jnp.ones((1, 4)), temperature=0.01)
    np.testing.assert_allclose(g[0, 0], 0.3, atol=1e-3)


# ----------------------------------------------------------------------------- Rank-GRPO


def test_rank_grpo_golden_causal_dcg():
    # METHODS.md: hits [1, 0, 1] -> r = [1/1 + 1/2, 1/2, 1/2] = [1.5, 0.5, 0.5].
    np.testing.assert_allclose(credit.rank_rewards(jnp.array([[1.0, 0.0, 1.0]])), [[1.5, 0.5, 0.5]])


def test_rank_grpo_own_case_per_rank_normalization():
    # Lists A = [1, 0, 1] (r = [1.5, .5, .5]) and B = [0, 0, 0] (r = 0): per rank the two values
    # differ, so (r - mean) / std_ddof1 = +-(d/2) / (d/sqrt 2) = +-0.7071.
    hits = jnp.array([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    adv = get("credit", "rank_grpo")(hits, jnp.array([0, 0]), num_groups=1)
    np.testing.assert_allclose(adv, [[0.707106] * 3, [-0.707106] * 3], rtol=1e-5)
    # hit reward: rank 2 has no hit in either list -> 0 there.
    adv = credit.rank_grpo(hits, jnp.array([0, 0]), num_groups=1, reward="hit")
    np.testing.assert_allclose(adv[:, 1], [0.0, 0.0])


def test_rank_level_ratio_and_token_scatter():
    # Tokens of rank 0 have log-ratios 0.1, 0.3 -> exp(0.2); rank 1: -0.2 -> exp(-0.2);
    # rank 2 has no tokens -> 1; the token of no rank (-1, log-ratio 5) is ignored.
    logp = jnp.array([[0.1, 0.3, -0.2, 5.0]]) - 1.0
    ratio = credit.rank_level_ratio(logp, jnp.full((1, 4), -1.0), jnp.array([[0, 0, 1, -1]]), num_ranks=3)
    np.testing.assert_allclose(ratio, [[math.exp(0.2), math.exp(-0.2), 1.0]], rtol=1e-6)
    tokens = credit.rank_token_values(jnp.array([[0.5, -1.0, 2.0]]), jnp.array([[0, 0, 1, -1]]))
    np.testing.assert_allclose(tokens, [[0.5, 0.5, -1.0, 0.0]])


# ----------------------------------------------------------------------------- segments


def test_segment_advantages_golden():
    # METHODS.md: V = [0.2, 0.5, 1.0] -> A = [0.3, 0.5] for segments [0, 2) and [2, 4).
    a = get("credit", "segment_advantages")(jnp.array([[0, 2]]), jnp.array([[0.2, 0.5, 1.0]]), jnp.ones((1, 4)))
    np.testing.assert_allclose(a, [[0.3, 0.3, 0.5, 0.5]], rtol=1e-6)


def test_segment_advantages_own_case_padding_and_prefix():
    # T = 5, boundaries [1, 3, 9] (9 >= T: an unused segment), V = [0, .5, 2, 2]: gains [.5, 1.5, 0];
    # t0 precedes b0 -> 0; t1, t2 -> 0.5; t3 -> 1.5; t4 masked -> 0.
    a = credit.segment_advantages(jnp.array([[1, 3, 9]]), jnp.array([[0.0, 0.5, 2.0, 2.0]]), jnp.array([[1, 1, 1, 1, 0]]))
    np.testing.assert_allclose(a, [[0.0, 0.5, 0.5, 1.5, 0.0]])


def test_segment_advantages_shape_error():
    with pytest.raises(ValueError, match="values must have shape"):
        credit.segment_advantages(jnp.array([[0, 2]]), jnp.array([[0.2, 0.5]]), jnp.ones((1, 4)))


# ----------------------------------------------------------------------------- properties


N, T, G = 5, 5, 5


@jax.jit
def _all_credit(logits, ids, mask, valid, r, hits, rank_ids, bounds):
    """Every credit kernel on one fixed shape, compiled once for all examples."""
    return (
        credit.tw_grpo_weights(jax.nn.log_softmax(logits, -1), ids, num_groups=G, mask=mask, valid=valid),
        credit.pure_min_form(r, mask),
        credit.rank_grpo(hits, ids, num_groups=G, valid=valid),
        credit.rank_level_ratio(r * 0.1, r * -0.1, rank_ids, num_ranks=3),
        credit.segment_advantages(bounds, r[:, :1] * jnp.ones((N, 3)), mask),
    )


def _draw_array(data, elements, shape, dtype):
    size = int(np.prod(shape))
    return jnp.asarray(np.array(data.draw(st.lists(elements, min_size=size, max_size=size))).reshape(shape), dtype)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_credit_kernels_finite_on_random_and_degenerate_inputs(data):
    # Fixed [5, 5] shape; groups of any size (incl. 1) in any order, invalid rows,
    # fully masked rows or batches, all-equal hits.
    ids = _draw_array(data, st.integers(0, G - 1), (N,), jnp.int32)
    mask = _draw_array(data, st.sampled_from([0.0, 1.0]), (N, T), jnp.float32)
    if data.draw(st.booleans()):
        mask = jnp.zeros_like(mask)
    valid = _draw_array(data, st.booleans(), (N,), bool)
    logits = _draw_array(data, finite_floats, (N, T, 3), jnp.float32)
    r = _draw_array(data, finite_floats, (N, T), jnp.float32)
    hits = jnp.ones((N, T)) if data.draw(st.booleans()) else (r > 0).astype(jnp.float32)
    rank_ids = _draw_array(data, st.integers(-1, 2), (N, T), jnp.int32)
    bounds = jnp.sort(_draw_array(data, st.integers(0, T + 2), (N, 2), jnp.int32), -1)
    w, returns, adv, ratio, seg = _all_credit(logits, ids, mask, valid, r, hits, rank_ids, bounds)
    w = np.asarray(w)
    assert np.all(np.isfinite(w)) and np.all((w == 0) | ((w >= 1) & (w <= 1.7 + 1e-6)))
    assert np.all(np.isfinite(returns)) and np.all(np.isfinite(ratio)) and np.all(np.isfinite(seg))
    assert np.all(np.isfinite(adv)) and np.all(np.asarray(adv)[~np.asarray(valid)] == 0)


def test_credit_kernels_jit_and_shard(mesh_2x4):
    rng = np.random.default_rng(0)
    n, t = 8, 4
    ids = jnp.array([0, 0, 1, 1, 1, 2, 2, 3])
    mask = jnp.asarray((rng.uniform(size=(n, t)) > 0.2).astype(np.float32))
    logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(n, t, 5)).astype(np.float32)), -1)
    assert_sharded_matches(credit.tw_grpo_weights, {"token_logprobs": logp, "group_ids": ids, "mask": mask}, mesh_2x4, atol=1e-5, num_groups=4)
    r = jnp.asarray(rng.uniform(-1, 1, (n, t)).astype(np.float32))
    assert_sharded_matches(credit.pure_min_form, {"process_rewards": r, "step_mask": mask}, mesh_2x4)
    hits = jnp.asarray((rng.uniform(size=(n, 3)) > 0.5).astype(np.float32))
    assert_sharded_matches(credit.rank_grpo, {"hits": hits, "group_ids": ids}, mesh_2x4, atol=1e-5, num_groups=4)
    rank_ids = jnp.asarray(rng.integers(-1, 3, (n, t)).astype(np.int32))
    assert_sharded_matches(credit.rank_level_ratio, {"logp": r, "old_logp": 0.5 * r, "rank_ids": rank_ids}, mesh_2x4, num_ranks=3)
    bounds = jnp.asarray(np.sort(rng.integers(0, t + 1, (n, 2)), -1).astype(np.int32))
    values = jnp.asarray(rng.uniform(size=(n, 3)).astype(np.float32))
    assert_sharded_matches(credit.segment_advantages, {"boundaries": bounds, "values": values, "mask": mask}, mesh_2x4)
