"""Catalog rewards and selection (METHODS.md §2 items 25, 31-35): goldens, hand cases, brute force, properties."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jaxgrpo.kernels import reward_shaping as gr
from jaxgrpo.kernels import selection as sel
from jaxgrpo.kernels.advantages import dr_grpo, grpo
from jaxgrpo.kernels.registry import get
from tests.support.kernel_checks import assert_sharded_matches, outcome_batches

STRICT3 = jnp.array([[0.0, 1, 1], [0, 0, 1], [0, 0, 0]])


# ----------------------------------------------------------------------------- Pref-GRPO


def test_pref_grpo_golden_strict_order_then_grpo():
    # METHODS.md: G = 3 strict order -> r = [2/2, 1/2, 0/2] = [1, 0.5, 0];
    # GRPO on it: mean 0.5, std (ddof 1) 0.5 -> [1, 0, -1].
    ids = jnp.zeros(3, jnp.int32)
    r = get("reward", "pref_grpo_win_rate")(STRICT3, ids, num_groups=1)
    np.testing.assert_allclose(r, [1.0, 0.5, 0.0])
    np.testing.assert_allclose(grpo(r, ids, num_groups=1), [1.0, 0.0, -1.0], atol=1e-5)


def test_pref_grpo_own_case_groups_and_invalid_rows():
    # Two groups [0, 1] and [2, 3, 4]; row 4 invalid. Cross-group wins (all 1) are ignored.
    # Group 0: row 0 beats row 1 -> [1, 0]. Group 1 (rows 2, 3 valid): W_23 = 0.3, W_32 = 0.7 -> [0.3, 0.7].
    w = jnp.ones((5, 5)).at[0, 1].set(1.0).at[1, 0].set(0.0).at[2, 3].set(0.3).at[3, 2].set(0.7)
    r = gr.pref_grpo_win_rate(w, jnp.array([0, 0, 1, 1, 1]), num_groups=2, valid=jnp.array([1, 1, 1, 1, 0]))
    np.testing.assert_allclose(r, [1.0, 0.0, 0.3, 0.7, 0.0], rtol=1e-6)


# ----------------------------------------------------------------------------- S-GRPO


def test_s_grpo_golden():
    # METHODS.md: correctness [1, 0, 1, 1] -> r = [1, 0, 0.5, 0.25], A = r - 0.4375.
    r = get("reward", "s_grpo_serial_rewards")(jnp.array([[1.0, 0, 1, 1]]))
    np.testing.assert_allclose(r, [[1.0, 0.0, 0.5, 0.25]])
    np.testing.assert_allclose(gr.s_grpo_serial_advantages(r), [[0.5625, -0.4375, 0.0625, -0.1875]])


def test_s_grpo_own_case_and_reduction_to_dr_grpo():
    # [0, 1, 1, 0, 1] with the last exit masked: r = [0, 1, 0.5, 0, 0]; mean over 4 exits 0.375.
    mask = jnp.array([[1, 1, 1, 1, 0]])
    r = gr.s_grpo_serial_rewards(jnp.array([[0.0, 1, 1, 0, 1]]), exit_mask=mask)
    np.testing.assert_allclose(r, [[0.0, 1.0, 0.5, 0.0, 0.0]])
    a = gr.s_grpo_serial_advantages(r, exit_mask=mask)
    np.testing.assert_allclose(a, [[-0.375, 0.625, 0.125, -0.375, 0.0]])
    # The serial group's advantage is Dr. GRPO's with one group per path.
    np.testing.assert_allclose(a[0, :4], dr_grpo(r[0, :4], jnp.zeros(4, jnp.int32), num_groups=1), atol=1e-6)


# ----------------------------------------------------------------------------- GRPO-CARE


def test_grpo_care_golden():
    # METHODS.md: acc = [1, 1, 0, 1], c = [.9, .6, .8, .7] -> mean acc 0.75, accurate = rows 0, 1, 3;
    # mean accurate c = 0.7333, threshold 0.7233: only row 0 (0.9) -> rewards [1.5, 1, 0, 1].
    r = get("reward", "grpo_care_bonus")(jnp.array([1.0, 1, 0, 1]), jnp.array([0.9, 0.6, 0.8, 0.7]), jnp.zeros(4, jnp.int32), num_groups=1)
    np.testing.assert_allclose(r, [1.5, 1.0, 0.0, 1.0])


def test_grpo_care_own_case_clamp_and_groups():
    # Group 0: acc [1, 1], c [0.99 -> 0.95, 0.94]: mean c 0.945, threshold 0.935 -> both get 0.5.
    # Group 1: acc [0.05, 0.05]: accurate needs acc > 0.1 -> no bonus.
    r = gr.grpo_care_bonus(jnp.array([1.0, 1, 0.05, 0.05]), jnp.array([0.99, 0.94, 0.9, 0.9]), jnp.array([0, 0, 1, 1]), num_groups=2)
    np.testing.assert_allclose(r, [1.5, 1.5, 0.05, 0.05], rtol=1e-6)


# ----------------------------------------------------------------------------- AdaptThink


def test_adaptthink_golden_and_own_case():
    # METHODS.md: acc = 1, acc_ref = 0.6, no-think -> 1 - 0.6 + 0.05 = 0.45.
    # Own: acc = 0, acc_ref = 0.25, thinking -> -0.25.
    r = get("reward", "adaptthink_reward")(jnp.array([1.0, 0.0]), jnp.array([0.6, 0.25]), jnp.array([True, False]))
    np.testing.assert_allclose(r, [0.45, -0.25], rtol=1e-6)


# ----------------------------------------------------------------------------- properties and sharding


_rewards_jit = jax.jit(
    lambda acc, c, ids, valid, wins: (
        gr.grpo_care_bonus(acc, c, ids, num_groups=6, valid=valid),
        gr.pref_grpo_win_rate(wins, ids, num_groups=6, valid=valid),
    )
)


@settings(max_examples=30, deadline=None)
@given(batch=outcome_batches(binary=True), data=st.data())
def test_group_rewards_finite_and_bounded(batch, data):
    # Padded to 48 rows (invalid) so one compiled shape serves every example.
    acc, ids, valid, _ = batch
    pad = 48 - len(acc)
    acc, ids, valid = jnp.pad(acc, (0, pad)), jnp.pad(ids, (0, pad)), jnp.pad(valid, (0, pad))
    c = jnp.asarray(data.draw(st.lists(st.floats(0, 1, width=32), min_size=48, max_size=48)))
    wins = jnp.asarray(np.random.default_rng(data.draw(st.integers(0, 99))).uniform(size=(48, 48)).astype(np.float32))
    care, win_rate = _rewards_jit(acc, c, ids, valid, wins)
    assert np.all(np.isfinite(care)) and np.all(np.isfinite(win_rate))
    assert np.all((np.asarray(win_rate) >= 0) & (np.asarray(win_rate) <= 1))
    assert np.all(np.asarray(care)[~np.asarray(valid)] == 0)
    assert np.all(np.asarray(care) <= 1.5 * np.asarray(acc) + 1e-6)


@settings(max_examples=30, deadline=None)
@given(correct=st.lists(st.sampled_from([0.0, 1.0]), min_size=6, max_size=6), mask=st.lists(st.booleans(), min_size=6, max_size=6))
def test_s_grpo_rewards_decay_and_sum_below_two(correct, mask):
    r = np.asarray(gr.s_grpo_serial_rewards(jnp.asarray([correct]), exit_mask=jnp.asarray([mask])))[0]
    hits = [v for v, c, m in zip(r, correct, mask) if c and m]
    assert hits == [2.0**-k for k in range(len(hits))]  # 1, 1/2, 1/4, ... front to back
    assert r.sum() < 2.0


def test_rewards_sharded_match_unsharded(mesh_2x4):
    rng = np.random.default_rng(0)
    ids = jnp.array([0, 0, 0, 1, 1, 2, 2, 3])
    acc = jnp.asarray(rng.integers(0, 2, 8).astype(np.float32))
    assert_sharded_matches(gr.grpo_care_bonus, {"accuracy": acc, "consistency": jnp.asarray(rng.uniform(size=8).astype(np.float32)), "group_ids": ids}, mesh_2x4, num_groups=4)
    assert_sharded_matches(gr.pref_grpo_win_rate, {"wins": jnp.asarray(rng.uniform(size=(8, 8)).astype(np.float32)), "group_ids": ids}, mesh_2x4, num_groups=4)
    assert_sharded_matches(gr.s_grpo_serial_rewards, {"correct": jnp.asarray(rng.integers(0, 2, (8, 4)).astype(np.float32))}, mesh_2x4)
    assert_sharded_matches(gr.adaptthink_reward, {"accuracy": acc, "reference_accuracy": jnp.full(8, 0.5), "no_thinking": jnp.arange(8) % 2 == 0}, mesh_2x4)
    assert_sharded_matches(sel.mmr1_vas_weights, {"success_rates": jnp.asarray(rng.uniform(size=8).astype(np.float32))}, mesh_2x4)
    assert_sharded_matches(sel.dump_ucb_weights, {"mean_abs_advantage": jnp.asarray(rng.uniform(size=8).astype(np.float32)), "counts": jnp.arange(8.0)}, mesh_2x4)


# ----------------------------------------------------------------------------- Knapsack RL


def test_knapsack_golden_values():
    # METHODS.md: p = 0.5, N = 4 -> 1 - 2/16 = 0.875; p = 0.9, N = 4 -> 1 - 0.6561 - 0.0001 = 0.3438.
    assert sel.nonzero_gradient_probability(0.5, 4) == pytest.approx(0.875)
    assert sel.nonzero_gradient_probability(0.9, 4) == pytest.approx(0.3438)


def _brute_force(p, budget, lo, hi, gain):
    best = -np.inf
    for alloc in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
        if sum(alloc) == budget:
            best = max(best, sum(sel.nonzero_gradient_probability(pi, n) * g for pi, n, g in zip(p, alloc, gain)))
    return best


def test_knapsack_own_case_by_hand():
    # p = [0.5, 1.0], budget 6, bounds [2, 4]: prompt 2 (always solved) is worth 0 at any N,
    # so the DP gives prompt 1 its maximum 4 (value 1 - 2/16 = 0.875) and prompt 2 the rest, 2.
    alloc = get("selection", "knapsack_allocation")([0.5, 1.0], 6, min_rollouts=2, max_rollouts=4)
    np.testing.assert_array_equal(alloc, [4, 2])


@pytest.mark.parametrize("seed", range(6))
def test_knapsack_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 5))
    p = rng.uniform(0, 1, m).round(2)
    lo = rng.integers(0, 3, m)
    hi = lo + rng.integers(0, 5, m)
    budget = int(rng.integers(lo.sum(), hi.sum() + 1))
    gain = rng.uniform(0.5, 2.0, m) if seed % 2 else np.ones(m)
    alloc = sel.knapsack_allocation(p, budget, min_rollouts=lo, max_rollouts=hi, gain=gain)
    assert alloc.sum() == budget and np.all(alloc >= lo) and np.all(alloc <= hi)
    value = sum(sel.nonzero_gradient_probability(pi, n) * g for pi, n, g in zip(p, alloc, gain))
    assert value == pytest.approx(_brute_force(p, budget, lo, hi, gain), abs=1e-12)


def test_knapsack_infeasible_budget_is_an_error():
    with pytest.raises(ValueError, match="no allocation sums to budget"):
        sel.knapsack_allocation([0.5, 0.5], 3, min_rollouts=2, max_rollouts=4)


# ----------------------------------------------------------------------------- MMR1 VAS and DUMP


def test_mmr1_golden_and_own_case():
    # METHODS.md: p = 0.5 -> OVS = 0.25.
    assert float(sel.variance_promotion_score(jnp.array([0.5]))[0]) == pytest.approx(0.25)
    # Own: p = [0.5, 1.0, 0.9]: scores [0.25, 0, 0.09], weighted part [0.73529, 0, 0.26471];
    # mixed half with uniform 1/3: [0.53431, 0.16667, 0.29902].
    q = get("selection", "mmr1_vas_weights")(jnp.array([0.5, 1.0, 0.9]))
    np.testing.assert_allclose(q, [0.534314, 0.166667, 0.299020], rtol=1e-5)
    # Example weighting 0.8 OVS + 0.2 TDS: p = 0.5, TDS = 1 -> 0.2 + 0.2 = 0.4.
    s = sel.variance_promotion_score(jnp.array([0.5]), diversity=jnp.array([1.0]), ovs_weight=0.8, tds_weight=0.2)
    assert float(s[0]) == pytest.approx(0.4)


def test_mmr1_all_solved_is_uniform():
    np.testing.assert_allclose(sel.mmr1_vas_weights(jnp.array([1.0, 0.0, 1.0])), [1 / 3] * 3, rtol=1e-6)


def test_dump_golden_and_own_case():
    # METHODS.md: mu = [.3, .1], n = [100, 10] -> N = 110; UCB = .3 + sqrt(2 ln 111 / 101) = 0.60538,
    # .1 + sqrt(2 ln 111 / 11) = 1.02535 -> softmax(UCB / 0.1) = [0.0148, 0.9852].
    w = get("selection", "dump_ucb_weights")(jnp.array([0.3, 0.1]), jnp.array([100, 10]))
    np.testing.assert_allclose(w, [0.014778, 0.985222], rtol=1e-3)
    # Own: equal counts -> exploration terms equal, so softmax(mu / 0.1): mu = [0, 0.1] -> [1, e] / (1 + e).
    w = sel.dump_ucb_weights(jnp.array([0.0, 0.1]), jnp.array([5, 5]))
    np.testing.assert_allclose(w, [1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1, width=32), st.integers(0, 10**6)), min_size=8, max_size=8))
def test_samplers_are_distributions(rows):
    p = jnp.asarray([r[0] for r in rows])
    n = jnp.asarray([r[1] for r in rows])
    for q in (_mmr1_jit(p), _dump_jit(p, n)):
        q = np.asarray(q)
        assert np.all(np.isfinite(q)) and np.all(q >= 0) and q.sum() == pytest.approx(1.0, abs=1e-5)


_mmr1_jit = jax.jit(sel.mmr1_vas_weights)
_dump_jit = jax.jit(sel.dump_ucb_weights)
