"""Numerically safe kernels: huge and non-finite rewards, NaN or inf at masked-out tokens.

Hand-checked cases for the two failure modes, then one property over every advantage
and loss kernel the library registers: finite outputs and finite gradients for rewards
up to +-1e30, NaN or inf wherever a row is invalid or a token masked out, and
degenerate groups. The kernels are enumerated from the registry, so a new kernel is
covered as soon as it is registered; one that needs inputs beyond the common contract
gets them from `ADVANTAGE_INPUTS` / `LOSS_INPUTS`, and a registered kernel missing
from those tables fails `test_every_registered_kernel_has_an_input_builder`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from tests.support.kernel_checks import OUTCOME_SHAPE, TOKEN_SHAPE, extreme_outcome_batches, extreme_token_batches

import jaxgrpo
from jaxgrpo import kernels
from jaxgrpo.catalog.docs import library_kernels
from jaxgrpo.kernels import segments
from jaxgrpo.kernels.kl import KL_KINDS


def f32(*values):
    return jnp.asarray(values, jnp.float32)


def close(got, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected, np.float32), rtol=rtol, atol=atol)


def advantage(name, *rewards, group_ids=None, num_groups=1):
    """The advantages of one batch (one group by default), as one jitted program."""
    rewards = f32(*rewards)
    group_ids = jnp.zeros(rewards.shape, jnp.int32) if group_ids is None else jnp.asarray(group_ids, jnp.int32)
    return jax.jit(lambda: jaxgrpo.get_advantage(name)(rewards, group_ids, num_groups=num_groups))()


# --------------------------------------------------------------- huge and non-finite rewards


def test_huge_rewards_give_the_advantages_of_small_ones():
    # [1, 0, 0, 1]: mean 1/2, unbiased std sqrt(1/3) = 0.57735, so A = +-0.5 / 0.57735 = +-0.86603.
    # Scaled by 1e20 the variance (1e40) used to overflow float32 and every advantage was 0.
    expected = [0.86603, -0.86603, -0.86603, 0.86603]
    for name in ("grpo", "reinforce_pp", "reinforce_pp_baseline"):
        close(advantage(name, 1, 0, 0, 1), expected)
        close(advantage(name, 1e20, 0, 0, 1e20), expected)
    close(jax.jit(kernels.masked_whiten)(f32(1e20, 0, 0, 1e20)[None], jnp.ones((1, 4))), [expected])
    # Dr. GRPO keeps the reward's unit: r - mean = +-5e19.
    close(advantage("dr_grpo", 1e20, 0, 0, 1e20), [5e19, -5e19, -5e19, 5e19])


def test_rewards_near_the_largest_float_give_finite_statistics_and_advantages():
    # [3e38, -3e38]: the sum of squares (1.8e77) and even r - mean for a skewed group overflow float32.
    # GRPO: mean 0, unbiased std 3e38 * sqrt(2), A = +-1 / sqrt(2) = +-0.70711 (used to be NaN).
    close(advantage("grpo", 3e38, -3e38), [0.70711, -0.70711])
    close(advantage("grpo", 3e38, 3e38, -3e38), [0.57735, 0.57735, -1.1547])  # as [1, 1, -1]: mean 1/3, std 1.1547
    close(advantage("reinforce_pp", 3e38, -3e38), [0.70711, -0.70711])
    one_group = jnp.zeros(2, jnp.int32)
    statistics = jax.jit(lambda x: (segments.mean(x, one_group, 1), segments.median(x, one_group, 1)))
    close(statistics(f32(3e38, 3e38)), [[3e38], [3e38]])  # their sum 6e38 overflows; mean and median do not
    close(jax.jit(lambda x: segments.std(x, jnp.zeros(4, jnp.int32), 1, ddof=1))(f32(1e20, 0, 0, 1e20)), [0.57735e20])


def test_a_nan_reward_leaves_its_group_as_a_group_without_that_row():
    # [1, 0, 0, NaN] is the group [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3) = 0.57735,
    # A = (2/3) / 0.57735 = 1.1547 and (-1/3) / 0.57735 = -0.57735; the NaN row gets 0.
    # Before, one NaN reward made the whole group's advantages NaN.
    for bad in (np.nan, np.inf, -np.inf):
        close(advantage("grpo", 1, 0, 0, bad), [1.1547, -0.57735, -0.57735, 0.0])
    # A group with a NaN does not touch another group, nor the batch statistics of REINFORCE++.
    got = advantage("reinforce_pp", 1, 0, np.nan, 1, 0, group_ids=[0, 0, 0, 1, 1], num_groups=2)
    close(got, [0.86603, -0.86603, 0.0, 0.86603, -0.86603])


@pytest.mark.parametrize("name", [i.name for i in library_kernels("advantage")])
def test_a_non_finite_reward_is_an_invalid_row_for_every_estimator(name):
    # Row 2 holds NaN (or inf): the result equals the one with that row marked invalid.
    n, num_groups = OUTCOME_SHAPE
    rewards = np.resize(np.asarray([1.0, 0.0, 0.5, 1.0, 0.25, 0.0, 1.0, 0.75], np.float32), n)
    group_ids = np.repeat(np.arange(num_groups, dtype=np.int32), n // num_groups)
    valid = np.ones(n, bool)
    inputs, rng = _advantage_inputs(name), np.random.default_rng
    fn = _advantage_program(name, n, num_groups)  # the program the property test below runs
    without_row, _ = fn(rewards, group_ids, valid & (np.arange(n) != 2), inputs(rewards, group_ids, valid, rng(0)))
    for bad in (np.nan, np.inf):
        with_bad = rewards.copy()
        with_bad[2] = bad
        got, grad = fn(with_bad, group_ids, valid, inputs(with_bad, group_ids, valid, rng(0)))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(without_row))
        assert np.isfinite(np.asarray(grad)).all()


# --------------------------------------------------------------- NaN or inf at masked-out tokens


def _tokens(real: float, garbage):
    """f32[1, 2]: a real token, then a masked-out one holding `garbage`."""
    return jnp.stack([jnp.float32(real), garbage])[None]


MASK = jnp.asarray([[1.0, 0.0]])
LOG_HALF = math.log(0.5)


@jax.jit
def _loss_with_masked_garbage(garbage):
    logp, old, adv = _tokens(LOG_HALF, garbage), _tokens(LOG_HALF, garbage), _tokens(1.0, garbage)

    def total(logp):
        per_token, _ = jaxgrpo.get_loss("ppo_clip")(logp, old, adv, MASK)
        return jaxgrpo.aggregate(per_token, MASK, "token_mean")[0]

    rewards, values = _tokens(1.0, garbage), _tokens(0.0, garbage)
    token = (kernels.discounted_returns(rewards, MASK), jaxgrpo.gae(rewards, values, MASK)[0])
    return jax.value_and_grad(total)(logp), token


@pytest.mark.parametrize("garbage", [np.nan, -np.inf, np.inf])
def test_masked_out_garbage_gives_no_nan_loss_or_gradient(garbage):
    # Token 0: logp = old = log 0.5, A = 1, so rho = 1, PPO's loss -A rho = -1, gradient -1.
    # Token 1 is masked out and holds garbage in logp, old_logp and the advantage; it used
    # to give a NaN gradient (NaN * 0 in the backward pass).
    (loss, grad), (returns, advantages) = _loss_with_masked_garbage(jnp.float32(garbage))
    close(loss, -1.0)
    close(grad, [[-1.0, 0.0]])
    # Token kernels skip masked-out positions: G = A = [1, 0] for rewards [1, garbage], values [0, garbage].
    close(returns, [[1.0, 0.0]])
    close(advantages, [[1.0, 0.0]])


@jax.jit
def _kl_with_masked_garbage(garbage):
    logp, old, ref = _tokens(LOG_HALF, garbage), _tokens(LOG_HALF, garbage), _tokens(LOG_HALF, garbage)

    def kl(kind):
        def value(logp):
            return jaxgrpo.kl_penalty(logp, ref, kind, old_logp=old, mask=MASK)

        return value(logp), jax.grad(lambda lp: value(lp).sum())(logp)

    return {kind: kl(kind) for kind in KL_KINDS}


@pytest.mark.parametrize("garbage", [np.nan, -np.inf, np.inf])
def test_kl_with_a_mask_ignores_masked_out_garbage(garbage):
    # pi = pi_ref = pi_old = 0.5 on the real token: every KL kind is 0 there, and so is its
    # gradient, except k1's (d(logp - ref_logp) / d logp = 1); the masked-out token gives 0.
    for kind, (value, grad) in _kl_with_masked_garbage(jnp.float32(garbage)).items():
        close(value, [[0.0, 0.0]])
        close(grad, [[1.0 if kind == "k1" else 0.0, 0.0]])


# --------------------------------------------------------------- every registered kernel, generated inputs

# A kernel's inputs beyond the common contract: name -> (static keyword arguments, a function of the
# shape; array keyword arguments, a function of the generated batch and a numpy generator). For an
# advantage: (n, num_groups) and (rewards, group_ids, valid, rng), where "rewards" replaces the
# rewards; for a loss: (shape,) and (mask, rng). Row inputs hold NaN on invalid rows and token
# inputs at masked-out tokens, as the rewards and log-probs do.
NO_EXTRAS = (lambda *shape: {}, lambda *inputs: {})


def _row_floats(rng, valid, low, high):
    return np.where(valid, rng.uniform(low, high, valid.shape), np.nan).astype(np.float32)


def _token_floats(rng, mask, low, high):
    return np.where(mask > 0, rng.uniform(low, high, mask.shape), np.nan).astype(np.float32)


ADVANTAGE_INPUTS = {
    "asymre": NO_EXTRAS,
    "bnpo": NO_EXTRAS,
    "dgpo": NO_EXTRAS,
    "dr_grpo": NO_EXTRAS,
    "experimental/a_grae": NO_EXTRAS,
    "experimental/spo_advantage": (lambda n, g: {}, lambda r, gid, v, rng: {"baseline": _row_floats(rng, v, 0, 1)}),
    "gdpo": (  # two reward columns: the reward and a 0/1 one
        lambda n, g: {},
        lambda r, gid, v, rng: {"rewards": np.stack([r, rng.integers(0, 2, r.shape).astype(np.float32)], 1)},
    ),
    "gigpo": (
        lambda n, g: {"num_anchors": 3, "normalization": "std"},
        lambda r, gid, v, rng: {"step_returns": _row_floats(rng, v, -1e3, 1e3),
                                "anchor_ids": rng.integers(0, 3, r.shape).astype(np.int32)},
    ),
    "gpg": NO_EXTRAS,
    "grpo": NO_EXTRAS,
    "grpo_batch_std": NO_EXTRAS,
    "hapo": (lambda n, g: {}, lambda r, gid, v, rng: {"lengths": np.round(_row_floats(rng, v, 0, 50))}),
    "krpo": NO_EXTRAS,
    "mc_grpo": NO_EXTRAS,
    "ngrpo": NO_EXTRAS,
    "opmd": NO_EXTRAS,
    "opo": (lambda n, g: {}, lambda r, gid, v, rng: {"lengths": np.round(_row_floats(rng, v, 0, 50))}),
    "pass_at_k": NO_EXTRAS,
    "reinforce_pp": (lambda n, g: {}, lambda r, gid, v, rng: {"lengths": np.round(_row_floats(rng, v, 0, 50))}),
    "reinforce_pp_baseline": (
        lambda n, g: {}, lambda r, gid, v, rng: {"lengths": np.round(_row_floats(rng, v, 0, 50))}
    ),
    "remax": (lambda n, g: {}, lambda r, gid, v, rng: {"baseline_rewards": _row_floats(rng, v, -1e3, 1e3)}),
    "riskpo": (lambda n, g: {"num_bundles": 2}, lambda r, gid, v, rng: {"bundle_ids": (gid % 2).astype(np.int32)}),
    "rloo": NO_EXTRAS,
    "seed_grpo": (
        lambda n, g: {"std_normalize": True},
        lambda r, gid, v, rng: {"cluster_ids": rng.integers(0, 3, r.shape).astype(np.int32)},
    ),
    "stratified_grpo": (
        lambda n, g: {"num_strata": 2, "blend": 0.5},
        lambda r, gid, v, rng: {"strata_ids": rng.integers(0, 2, r.shape).astype(np.int32)},
    ),
    "xrpo": (lambda n, g: {}, lambda r, gid, v, rng: {"seq_logp": _row_floats(rng, v, -30, 0)}),
}

LOSS_INPUTS = {
    "bapo": NO_EXTRAS,
    "cispo": NO_EXTRAS,
    "critique_grpo": (
        lambda shape: {}, lambda mask, rng: {"prefix_mask": (rng.random(mask.shape) < 0.5).astype(np.float32)}
    ),
    "degrpo": NO_EXTRAS,
    "clip_cov": (lambda shape: {"clip_cov_ratio": 0.2, "clip_cov_lb": -1e30, "clip_cov_ub": 1e30}, lambda mask, rng: {}),
    "disco": (
        lambda shape: {"num_groups": 2},
        lambda mask, rng: {"rewards": rng.integers(0, 2, mask.shape[0]).astype(np.float32),
                           "group_ids": (np.arange(mask.shape[0]) % 2).astype(np.int32)},
    ),
    "dppo_kl": NO_EXTRAS,
    "dppo_tv": NO_EXTRAS,
    "dro": NO_EXTRAS,
    "experimental/aepo_entropy": NO_EXTRAS,
    "experimental/dhpo": (lambda shape: {}, lambda mask, rng: {"token_entropy": _token_floats(rng, mask, 0, 5)}),
    "experimental/etr_clip": (
        lambda shape: {}, lambda mask, rng: {"group_variance": rng.uniform(0, 0.25, mask.shape[0]).astype(np.float32)}
    ),
    "gmpo": NO_EXTRAS,
    "gspo": NO_EXTRAS,
    "gspo_token": NO_EXTRAS,
    "hapo_clip": (lambda shape: {}, lambda mask, rng: {"entropy": _token_floats(rng, mask, 0, 5)}),
    "kl_cov": (lambda shape: {"kl_cov_ratio": 0.2}, lambda mask, rng: {}),
    "opmd": NO_EXTRAS,
    "ppo_clip": NO_EXTRAS,
    "rec": NO_EXTRAS,
    "reinforce": NO_EXTRAS,
    "sapo": NO_EXTRAS,
    "vespo": (  # with and without the sampler's importance weights (NaN at masked-out tokens)
        lambda shape: {},
        lambda mask, rng: {"importance_weights": _token_floats(rng, mask, 0, 5)} if rng.random() < 0.5 else {},
    ),
}


def _advantage_inputs(name):
    return ADVANTAGE_INPUTS[name][1]


ADVANTAGES = [i.name for i in library_kernels("advantage")]
LOSSES = [i.name for i in library_kernels("loss")]
# At least 10,000 generated inputs per run, shared evenly by the kernels.
EXAMPLES_PER_KERNEL = -(-10_000 // (len(ADVANTAGES) + len(LOSSES)))
GENERATED = settings(max_examples=EXAMPLES_PER_KERNEL, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_every_registered_kernel_has_an_input_builder():
    missing = sorted(set(ADVANTAGES) - set(ADVANTAGE_INPUTS)) + sorted(set(LOSSES) - set(LOSS_INPUTS))
    assert not missing, f"add input builders for {missing} to ADVANTAGE_INPUTS / LOSS_INPUTS in this file"


@functools.cache
def _advantage_program(name, n, num_groups):
    """jit((rewards, group_ids, valid, inputs) -> (advantages, d sum(w * advantages) / d rewards))."""
    fn = jaxgrpo.get_advantage(name)
    static = ADVANTAGE_INPUTS[name][0](n, num_groups)
    weights = jnp.linspace(-1.0, 1.0, n)

    def run(rewards, group_ids, valid, inputs):
        inputs = dict(inputs)
        rewards = inputs.pop("rewards", rewards)

        def total(r):
            adv = fn(r, group_ids, num_groups=num_groups, valid=valid, **static, **inputs)
            return jnp.sum(adv * weights), adv

        (_, adv), grad = jax.value_and_grad(total, has_aux=True)(rewards)
        return adv, grad

    return jax.jit(run)


@pytest.mark.parametrize("name", ADVANTAGES)
@GENERATED
@given(batch=extreme_outcome_batches())
def test_every_advantage_is_finite_with_finite_gradients(name, batch):
    """Rewards up to +-1e30, NaN or inf in invalid rows (and some valid ones), degenerate groups."""
    rewards, group_ids, valid, num_groups, seed = batch
    inputs = _advantage_inputs(name)(rewards, group_ids, valid, np.random.default_rng(seed))
    program = _advantage_program(name, rewards.shape[0], num_groups)
    adv, grad = map(np.asarray, program(rewards, group_ids, valid, inputs))
    assert np.isfinite(adv).all(), f"{name}: advantages {adv} for rewards {rewards}"
    assert np.isfinite(grad).all(), f"{name}: gradient {grad} for rewards {rewards}"
    usable = valid & np.isfinite(inputs.get("rewards", rewards)).reshape(rewards.shape[0], -1).all(1)
    np.testing.assert_array_equal(adv[~usable], 0.0)


@functools.cache
def _loss_program(name):
    """jit((logp, old_logp, advantages, mask, inputs) -> (per-token loss, metrics stacked, d sum(loss) / d logp))."""
    fn = jaxgrpo.get_loss(name)
    static = LOSS_INPUTS[name][0](TOKEN_SHAPE)

    def run(logp, old_logp, advantages, mask, inputs):
        def total(lp):
            per_token, metrics = fn(lp, old_logp, advantages, mask, **static, **inputs)
            return per_token.sum(), (per_token, metrics)

        (_, (per_token, metrics)), grad = jax.value_and_grad(total, has_aux=True)(logp)
        return per_token, jnp.stack([jnp.asarray(v, jnp.float32) for v in metrics.values()]), grad

    return jax.jit(run)


@pytest.mark.parametrize("name", LOSSES)
@GENERATED
@given(batch=extreme_token_batches())
def test_every_loss_is_finite_with_finite_gradients(name, batch):
    """NaN or inf at every masked-out token of logp, old_logp, advantages and extra token inputs."""
    logp, old, adv, mask, seed = batch
    inputs = LOSS_INPUTS[name][1](mask, np.random.default_rng(seed))
    per_token, metrics, grad = _loss_program(name)(logp, old, adv, mask, inputs)
    per_token, metrics, grad = np.asarray(per_token), np.asarray(metrics), np.asarray(grad)
    assert np.isfinite(per_token).all(), f"{name}: loss {per_token}"
    assert np.isfinite(grad).all(), f"{name}: gradient {grad}"
    assert np.isfinite(metrics).all(), f"{name}: metrics {metrics}"
    np.testing.assert_array_equal(per_token[mask == 0], 0.0)
    np.testing.assert_array_equal(grad[mask == 0], 0.0)



# --------------------------------------------------------------- group ids out of range under jit


@pytest.mark.parametrize("name", ADVANTAGES)
def test_out_of_range_group_ids_under_jit_are_invalid_rows_and_leave_the_others_alone(name):
    """Eager use raises; under jit a row whose id lies outside [0, num_groups) is left out of every statistic
    (of its would-be group and of the batch) and gets what an invalid row gets, 0: the in-range rows get the
    advantages of the batch with those rows marked invalid."""
    rng = np.random.default_rng(7)
    n, num_groups = 12, 3
    group_ids = np.repeat(np.arange(num_groups), n // num_groups).astype(np.int32)
    rewards = rng.integers(0, 3, n).astype(np.float32)
    inputs = _advantage_inputs(name)(rewards, group_ids, np.ones(n, bool), rng)
    static = ADVANTAGE_INPUTS[name][0](n, num_groups)
    rewards = inputs.pop("rewards", rewards)
    bad_rows = np.array([2, 7, 11])
    bad_ids = group_ids.copy()
    bad_ids[bad_rows] = [-1, num_groups, num_groups + 5]
    fn = jaxgrpo.get_advantage(name)
    run = jax.jit(lambda r, g, v, extra: fn(r, g, num_groups=num_groups, valid=v, **static, **extra))

    got = np.asarray(run(rewards, bad_ids, np.ones(n, bool), inputs))
    marked_invalid = np.ones(n, bool)
    marked_invalid[bad_rows] = False
    expected = np.asarray(run(rewards, group_ids, marked_invalid, inputs))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(got[bad_rows], 0.0)
    from jaxgrpo.kernels.validation import out_of_range_group_ids  # what a jitted caller counts and logs

    assert int(jax.jit(out_of_range_group_ids, static_argnums=1)(bad_ids, num_groups).sum()) == 3
    with pytest.raises(ValueError, match=r"group_ids must lie in \[0, num_groups=3\), got values in \[-1, 8\]"):
        fn(rewards, bad_ids, num_groups=num_groups, **static, **inputs)
