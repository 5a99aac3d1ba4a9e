"""Outcome advantage estimators: GRPO, Dr. GRPO, RLOO, REINFORCE++ (+baseline).

Golden values are METHODS.md §2 items 1, 2, 5 and 6, computed by hand.
"""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.kernel_checks import assert_sharded_matches, outcome_batches

import jaxgrpo
from jaxgrpo.kernels import advantages

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
# Estimators whose baseline is the group: a group with one valid row gets exactly 0.
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")
PROPERTY = settings(max_examples=25, deadline=None)


def run(name, rewards, group_ids, num_groups, valid=None, **hparams):
    return jaxgrpo.get_advantage(name)(
        jnp.asarray(rewards, jnp.float32), jnp.asarray(group_ids, jnp.int32), num_groups=num_groups, valid=valid, **hparams
    )


# ---------------------------------------------------------------- golden values


def test_grpo_golden_unbiased_and_population_std():
    # r = [1,0,0,1]: mean 0.5; unbiased std sqrt(1/3) -> 0.5/0.57735 = 0.8660; population std 0.5 -> 1.0.
    r, g = [1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0]
    np.testing.assert_allclose(run("grpo", r, g, 1), [0.8660, -0.8660, -0.8660, 0.8660], atol=1e-4)
    np.testing.assert_allclose(run("grpo", r, g, 1, std_ddof=0), [1.0, -1.0, -1.0, 1.0], atol=1e-5)
    # eps is added to the std: 0.5 / (0.5 + 0.5) with eps=0.5.
    np.testing.assert_allclose(run("grpo", r, g, 1, std_ddof=0, eps=0.5), [0.5, -0.5, -0.5, 0.5], atol=1e-6)


def test_grpo_documented_defaults():
    params = inspect.signature(advantages.grpo).parameters
    assert params["std_ddof"].default == 1 and params["eps"].default == 1e-6
    doc = inspect.getdoc(advantages.grpo)
    assert "std_ddof" in doc and "eps" in doc


def test_dr_grpo_golden():
    np.testing.assert_allclose(run("dr_grpo", [1.0, 0.0, 0.0, 1.0], [0] * 4, 1), [0.5, -0.5, -0.5, 0.5], atol=1e-6)


def test_rloo_golden():
    # A_1 = 1 - mean(0, 0, 1) = 2/3; A_2 = 0 - mean(1, 0, 1) = -2/3.
    np.testing.assert_allclose(
        run("rloo", [1.0, 0.0, 0.0, 1.0], [0] * 4, 1), [2 / 3, -2 / 3, -2 / 3, 2 / 3], atol=1e-6
    )


def test_reinforce_pp_baseline_golden():
    # groups [1,0],[1,1] -> centered [.5,-.5,0,0]; unbiased batch std sqrt(0.5/3) -> .5/.40825 = 1.2247.
    np.testing.assert_allclose(
        run("reinforce_pp_baseline", [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], 2), [1.2247, -1.2247, 0.0, 0.0], atol=1e-4
    )


def test_reinforce_pp_golden_ignores_groups():
    # Batch whitening of [1,0,1,1]: mean .75, unbiased var .25 -> [.5, -1.5, .5, .5].
    expected = [0.5, -1.5, 0.5, 0.5]
    np.testing.assert_allclose(run("reinforce_pp", [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], 2), expected, atol=1e-6)
    np.testing.assert_allclose(run("reinforce_pp", [1.0, 0.0, 1.0, 1.0], [0, 1, 2, 3], 4), expected, atol=1e-6)


def test_reinforce_pp_baseline_single_row_group_keeps_its_raw_reward():
    # Groups [1, 0] and [1] (one row). As verl, the single row keeps r = 1 (group mean taken as 0),
    # so x = [.5, -.5, 1]: mean 1/3, deviations [1/6, -5/6, 2/3], unbiased var (1/36 + 25/36 + 16/36) / 2
    # = 7/12, std 0.76376 -> [0.21822, -1.09109, 0.87287]. Centering the single row to 0 instead gave
    # x = [.5, -.5, 0] -> [1, -1, 0]: every row's advantage differed from verl's.
    got = run("reinforce_pp_baseline", [1.0, 0.0, 1.0], [0, 0, 1], 2, whiten="rows")
    std = np.sqrt(7 / 12)
    np.testing.assert_allclose(got, [(1 / 6) / std, (-5 / 6) / std, (2 / 3) / std], atol=1e-5)
    np.testing.assert_allclose(got, [0.21822, -1.09109, 0.87287], atol=1e-5)


def test_reinforce_pp_whitens_over_tokens_by_default():
    # r = [1, 0] with lengths [1, 3] tokens: over tokens the mean is (1 + 0) / 4 = .25 and the unbiased
    # variance (.75^2 + 3 * .25^2) / 3 = .25, so A = [.75, -.25] / .5 = [1.5, -.5]. Over rows: mean .5,
    # variance .5 -> [.7071, -.7071]. Equal lengths give the row result up to (L - 1) vs (N - 1).
    r, g, lengths = [1.0, 0.0], [0, 0], jnp.array([1.0, 3.0])
    np.testing.assert_allclose(run("reinforce_pp", r, g, 1, lengths=lengths), [1.5, -0.5], atol=1e-6)
    np.testing.assert_allclose(run("reinforce_pp", r, g, 1, lengths=lengths, whiten="tokens"), [1.5, -0.5], atol=1e-6)
    np.testing.assert_allclose(run("reinforce_pp", r, g, 1, lengths=lengths, whiten="rows"), [0.70711, -0.70711],
                               atol=1e-5)
    # Without lengths every row counts as one token: row whitening.
    np.testing.assert_allclose(run("reinforce_pp", r, g, 1), [0.70711, -0.70711], atol=1e-5)


def test_reinforce_pp_baseline_token_whitening_hand_case():
    # x = [.5, -.5, 1] (as above) with lengths [1, 3, 2]: L = 6, mean (.5 - 1.5 + 2) / 6 = 1/6, deviations
    # [1/3, -2/3, 5/6], unbiased token variance (1/9 + 3 * 4/9 + 2 * 25/36) / 5 = 17/30 -> std 0.75277.
    got = run("reinforce_pp_baseline", [1.0, 0.0, 1.0], [0, 0, 1], 2, lengths=jnp.array([1.0, 3.0, 2.0]))
    std = np.sqrt(17 / 30)
    np.testing.assert_allclose(got, [(1 / 3) / std, (-2 / 3) / std, (5 / 6) / std], atol=1e-5)
    # An invalid row's length is ignored; a bad whiten mode names the valid ones.
    with pytest.raises(ValueError, match="whiten must be one of tokens, rows, got 'batch'"):
        run("reinforce_pp", [1.0, 0.0], [0, 0], 1, whiten="batch")
    with pytest.raises(ValueError, match=r"lengths must have shape \[N\]=\[2\]"):
        run("reinforce_pp", [1.0, 0.0], [0, 0], 1, lengths=jnp.ones(3))


def test_uneven_interleaved_groups():
    # Group 0 = rows 0, 2, 4 with r = [3, 0, 0]; group 1 = rows 1, 3 with r = [1, 0].
    r, g = [3.0, 1.0, 0.0, 0.0, 0.0], [0, 1, 0, 1, 0]
    np.testing.assert_allclose(run("dr_grpo", r, g, 2), [2.0, 0.5, -1.0, -0.5, -1.0], atol=1e-6)
    # RLOO: group 0 scale 3/2, group 1 scale 2.
    np.testing.assert_allclose(run("rloo", r, g, 2), [3.0, 1.0, -1.5, -1.0, -1.5], atol=1e-6)
    # GRPO: group 0 std (ddof=1) sqrt(3) -> 2/sqrt3; group 1 std sqrt(.5) -> .5/.7071.
    s3, s2 = np.sqrt(3.0), np.sqrt(0.5)
    np.testing.assert_allclose(run("grpo", r, g, 2), [2 / s3, 0.5 / s2, -1 / s3, -0.5 / s2, -1 / s3], atol=1e-5)


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_singleton_and_constant_groups_get_zero(name):
    # Group 0 has one row, group 1 is all correct, group 2 has a single *valid* row.
    r = [1.0, 1.0, 1.0, 1.0, 0.7, 0.2]
    g = [0, 1, 1, 1, 2, 2]
    valid = jnp.array([True, True, True, True, True, False])
    np.testing.assert_array_equal(run(name, r, g, 3, valid=valid), np.zeros(6))


def test_invalid_rows_are_left_out_of_group_statistics():
    # With row 3 invalid, group [1, 0, 0, (5)] is [1, 0, 0]: mean 1/3.
    a = run("dr_grpo", [1.0, 0.0, 0.0, 5.0], [0] * 4, 1, valid=jnp.array([True, True, True, False]))
    np.testing.assert_allclose(a, [2 / 3, -1 / 3, -1 / 3, 0.0], atol=1e-6)
    # Batch whitening too: rows [1, 0] of [1, 0, 7] -> mean .5, unbiased var .5.
    a = run("reinforce_pp", [1.0, 0.0, 7.0], [0, 0, 0], 1, valid=jnp.array([True, True, False]))
    np.testing.assert_allclose(a, [0.7071, -0.7071, 0.0], atol=1e-4)


# ---------------------------------------------------------------- gradients


def test_dr_grpo_and_rloo_jacobians_are_the_centering_matrices():
    # A = C r with C = I - 1/G inside a group (Dr. GRPO) and G/(G-1) C (RLOO); groups of sizes 3 and 2.
    g = jnp.array([0, 0, 1, 0, 1], jnp.int32)
    r = jnp.array([0.3, -1.0, 2.0, 0.5, 0.0])
    same = np.asarray(g)[:, None] == np.asarray(g)[None, :]
    size = same.sum(1, keepdims=True)
    centering = np.eye(5) - same / size
    jac = jax.jacobian(lambda x: advantages.dr_grpo(x, g, num_groups=2))(r)
    np.testing.assert_allclose(jac, centering, atol=1e-6)
    jac = jax.jacobian(lambda x: advantages.rloo(x, g, num_groups=2))(r)
    np.testing.assert_allclose(jac, size / (size - 1) * centering, atol=1e-6)


def whitening_jacobian(x, ddof, eps, eps_inside_sqrt):
    """d/dx of (x - mean) / scale for one group, in float64: scale = std + eps or sqrt(var + eps)."""
    x = np.asarray(x, np.float64)
    n, d = len(x), x - x.mean()
    var = (d * d).sum() / (n - ddof)
    centering = np.eye(n) - 1.0 / n
    if eps_inside_sqrt:  # A = d / S, S = sqrt(var + eps), dS/dx_j = d_j / ((n - ddof) S)
        scale = np.sqrt(var + eps)
        return centering / scale - np.outer(d, d) / ((n - ddof) * scale**3)
    std = np.sqrt(var)  # A = d / (std + eps), d std/dx_j = d_j / ((n - ddof) std)
    return centering / (std + eps) - np.outer(d, d) / ((n - ddof) * std * (std + eps) ** 2)


def test_grpo_and_reinforce_pp_jacobians_are_the_whitening_jacobians():
    r = np.array([0.3, -1.0, 2.0, 0.5, 1.0, 0.0, 0.0], np.float32)
    g = np.array([0, 0, 0, 0, 1, 1, 1], np.int32)  # groups of 4 and 3
    jac = jax.jit(jax.jacobian(lambda x: advantages.grpo(x, g, num_groups=2, eps=0.1)))(r)
    expected = np.zeros((7, 7))
    for k in range(2):
        rows = np.flatnonzero(g == k)
        expected[np.ix_(rows, rows)] = whitening_jacobian(r[rows], ddof=1, eps=0.1, eps_inside_sqrt=False)
    np.testing.assert_allclose(jac, expected, rtol=1e-5, atol=1e-6)
    # REINFORCE++ whitens the whole batch, whatever the groups.
    jac = jax.jit(jax.jacobian(lambda x: advantages.reinforce_pp(x, g, num_groups=2, eps=0.1)))(r)
    np.testing.assert_allclose(jac, whitening_jacobian(r, ddof=1, eps=0.1, eps_inside_sqrt=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_gradients_are_finite_for_constant_and_singleton_groups(name):
    # std and sqrt have infinite derivatives at 0; the kernels keep them finite.
    r = jnp.array([1.0, 1.0, 1.0, 0.0, 0.5])
    g = jnp.array([0, 0, 0, 1, 2], jnp.int32)
    grad = jax.grad(lambda x: (run(name, x, g, 3) * jnp.arange(1.0, 6.0)).sum())(r)
    assert np.all(np.isfinite(grad))


# ---------------------------------------------------------------- properties

MAX_GROUPS = 6


@st.composite
def padded_outcome_batches(draw):
    """`outcome_batches` padded with invalid rows (in random groups) to 8 or 48 rows.

    Two capacities keep both shapes random and jit recompilations few; the
    padding rows are themselves a test that invalid rows change nothing.
    """
    rewards, group_ids, valid, num_groups = map(np.asarray, draw(outcome_batches(max_groups=MAX_GROUPS)))
    n = rewards.shape[0]
    pad = (8 if n <= 8 else 48) - n
    pad_groups = draw(st.lists(st.integers(0, int(num_groups) - 1), min_size=pad, max_size=pad))
    rewards = np.concatenate([rewards, np.full(pad, 5.0, np.float32)])
    group_ids = np.concatenate([group_ids, np.asarray(pad_groups, np.int32)])
    return rewards, group_ids, np.concatenate([valid, np.zeros(pad, bool)])


@functools.cache
def jitted(name):
    return jax.jit(functools.partial(jaxgrpo.get_advantage(name), num_groups=MAX_GROUPS))


@pytest.mark.parametrize("name", ESTIMATORS)
@PROPERTY
@given(batch=padded_outcome_batches(), seed=st.integers(0, 2**31 - 1))
def test_properties_on_random_groups(name, batch, seed):
    """Finite; 0 on invalid rows; invariant to invalid rows' rewards, to row order and group labels.

    Groups of size 1, all-equal groups and fully invalid groups get 0 (group baselines).
    """
    r, g, v = batch
    fn = jitted(name)
    a = np.asarray(fn(r, g, valid=v))
    assert a.shape == r.shape and np.all(np.isfinite(a))
    np.testing.assert_array_equal(a[~v], 0.0)

    scrambled = np.where(v, r, 1e3 - 7.0 * r)
    np.testing.assert_allclose(fn(scrambled, g, valid=v), a, rtol=1e-5, atol=1e-5)

    # Rewards on a coarse grid make every group sum exact in float32, so a
    # permutation cannot change the result by rounding (near-equal rewards
    # divided by a tiny std would otherwise amplify reordering error).
    rg = np.clip(np.round(r / 64.0) / 4.0, -4.0, 4.0).astype(np.float32)
    ag = np.asarray(fn(rg, g, valid=v))
    rng = np.random.default_rng(seed)
    perm = rng.permutation(r.shape[0])
    relabel = rng.permutation(MAX_GROUPS).astype(np.int32)
    b = fn(rg[perm], relabel[g[perm]], valid=v[perm])
    np.testing.assert_allclose(b, ag[perm], rtol=1e-5, atol=1e-5)

    if name in GROUP_ESTIMATORS:
        for k in range(MAX_GROUPS):
            rows = (g == k) & v
            if rows.sum() == 1 or (rows.any() and np.ptp(r[rows]) == 0):
                np.testing.assert_array_equal(a[rows], 0.0)


# ---------------------------------------------------------------- transformations


@pytest.mark.parametrize("name", ESTIMATORS)
def test_sharded_matches_unsharded(name, mesh_2x4):
    rng = np.random.default_rng(1)
    n = 32  # 8 groups of 4, shuffled so groups straddle devices
    rewards = jnp.asarray(rng.integers(0, 2, n), jnp.float32)
    group_ids = jnp.asarray(rng.permutation(np.repeat(np.arange(8), 4)), jnp.int32)
    valid = jnp.asarray(rng.random(n) > 0.2)
    fn = jaxgrpo.get_advantage(name)
    assert_sharded_matches(fn, dict(rewards=rewards, group_ids=group_ids, valid=valid), mesh_2x4, num_groups=8)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_jit_and_vmap_over_a_batch_of_batches(name):
    rng = np.random.default_rng(2)
    rewards = jnp.asarray(rng.normal(size=(3, 12)), jnp.float32)
    group_ids = jnp.asarray(np.repeat(np.arange(3), 4), jnp.int32)
    fn = jaxgrpo.get_advantage(name)
    batched = jax.jit(jax.vmap(lambda r: fn(r, group_ids, num_groups=3)))(rewards)
    for b in range(3):
        np.testing.assert_allclose(batched[b], fn(rewards[b], group_ids, num_groups=3), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- bad input


def test_bad_inputs_name_the_argument_and_expected_shape():
    r, g = jnp.zeros(4), jnp.zeros(4, jnp.int32)
    with pytest.raises(ValueError, match=r"group_ids must have shape \[N\]=\[4\].*got shape \(3,\)"):
        advantages.grpo(r, g[:3], num_groups=1)
    with pytest.raises(ValueError, match=r"rewards must have shape \[N\], got shape \(4, 1\)"):
        advantages.grpo(r[:, None], g, num_groups=1)
    with pytest.raises(TypeError, match="rewards must be a floating-point array, got dtype int32"):
        advantages.grpo(jnp.zeros(4, jnp.int32), g, num_groups=1)
    with pytest.raises(TypeError, match="group_ids must be an integer array, got dtype float32"):
        advantages.grpo(r, jnp.zeros(4), num_groups=1)
    with pytest.raises(ValueError, match=r"valid must have shape \[N\]=\[4\], got shape \(5,\)"):
        advantages.grpo(r, g, num_groups=1, valid=jnp.ones(5, bool))
    with pytest.raises(ValueError, match="num_groups must be a positive Python int"):
        advantages.grpo(r, g, num_groups=0)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_group_ids_out_of_range_are_rejected_eagerly(name):
    r = jnp.zeros(4)
    with pytest.raises(ValueError, match=r"group_ids must lie in \[0, num_groups=2\), got values in \[0, 2\]"):
        run(name, r, [0, 1, 2, 0], 2)
    with pytest.raises(ValueError, match=r"group_ids must lie in \[0, num_groups=2\), got values in \[-1, 1\]"):
        run(name, r, [0, 1, -1, 0], 2)


def test_unknown_estimator_lists_the_valid_names():
    with pytest.raises(KeyError, match=r"no advantage kernel named 'gpro'; valid names: .*\bdr_grpo, .*\bgrpo\b"):
        jaxgrpo.get_advantage("gpro")
