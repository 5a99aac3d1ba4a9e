"""Tests of the experimental (reconstructed) kernels: hand-computed cases, reductions to baselines,
finite outputs for random and degenerate inputs, and sharded == unsharded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxgrpo
from jaxgrpo.kernels import segments
from jaxgrpo.kernels.advantages import a_grae, grpo, spo_advantage
from jaxgrpo.kernels.credit import gae, grpo_vps_progress, t_ppo_egae
from jaxgrpo.kernels.losses import aepo_entropy, aepo_temperature_update, dhpo, etr_clip, gspo_token, ppo_clip, reinforce
from jaxgrpo.kernels.reward_shaping import conciser_length_reward, grpo_lambda
from jaxgrpo.kernels.selection import (
    SPOTrackerState,
    spo_priority,
    spo_tracker_init,
    spo_value_tracker,
    trapo_selection,
)
from tests.support.kernel_checks import assert_sharded_matches, outcome_batches, token_batches

FAST = settings(max_examples=20, deadline=None)

EXPERIMENTAL = {
    ("loss", "experimental/etr_clip"),
    ("loss", "experimental/dhpo"),
    ("loss", "experimental/aepo_entropy"),
    ("selection", "experimental/spo_value_tracker"),
    ("selection", "experimental/spo_priority"),
    ("selection", "experimental/trapo_selection"),
    ("advantage", "experimental/spo_advantage"),
    ("advantage", "experimental/a_grae"),
    ("token_advantage", "experimental/t_ppo_egae"),
    ("credit", "experimental/grpo_vps_progress"),
    ("reward", "experimental/grpo_lambda"),
    ("reward", "experimental/conciser_length_reward"),
}


def _close(a, b, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-6)


def _finite(tree):
    for leaf in jax.tree.leaves(tree):
        assert np.all(np.isfinite(np.asarray(leaf))), leaf


# Hypothesis draws batches of many shapes; padding them to one shape (with invalid rows and masked
# tokens, which no kernel may read) and jitting keeps compilations, and the test time, small.
# Empty groups are allowed too, so num_groups is fixed at the strategy's maximum.
OUTCOME_ROWS, OUTCOME_GROUPS, TOKEN_SHAPE = 48, 6, (6, 8)


def _pad_outcome(batch):
    rewards, g, valid, _ = batch
    pad = OUTCOME_ROWS - rewards.shape[0]
    return jnp.pad(rewards, (0, pad)), jnp.pad(g, (0, pad)), jnp.pad(valid, (0, pad)), OUTCOME_GROUPS


def _pad_tokens(*arrays):
    n, t = arrays[0].shape
    return tuple(jnp.pad(x, [(0, TOKEN_SHAPE[0] - n), (0, TOKEN_SHAPE[1] - t)][: x.ndim]) for x in arrays)


@st.composite
def token_batches_with_advantages(draw):
    logp, old, mask = _pad_tokens(*draw(token_batches()))
    n, t = logp.shape
    per_token = draw(st.booleans())
    shape = (n, t) if per_token else (n,)
    adv = np.array(draw(st.lists(st.floats(-5, 5, width=32), min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))), np.float32)
    return logp, old, jnp.asarray(adv.reshape(shape)), mask


# Jitted once per module with the hyper-parameters static, so hypothesis examples reuse compilations.
_spo_update = jax.jit(spo_value_tracker)
_spo_priority = jax.jit(spo_priority)
_spo_advantage = jax.jit(spo_advantage, static_argnames=("num_groups",))
_grpo = jax.jit(grpo, static_argnames=("num_groups",))
_a_grae = jax.jit(a_grae, static_argnames=("num_groups", "positive_scale", "difficulty_strength"))
_vps = jax.jit(grpo_vps_progress, static_argnames=("progress_coef",))
_grpo_lambda = jax.jit(grpo_lambda, static_argnames=("num_groups", "top_fraction"))
_conciser = jax.jit(conciser_length_reward, static_argnames=("num_groups", "length_coef"))


def _random_tokens(seed, n=8, t=5):
    rng = np.random.default_rng(seed)
    logp = jnp.asarray(-rng.uniform(0.1, 3.0, (n, t)), jnp.float32)
    old = logp + jnp.asarray(rng.normal(0, 0.3, (n, t)), jnp.float32)
    adv = jnp.asarray(rng.normal(0, 1, (n,)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(n, t)) < 0.8, jnp.float32)
    return logp, old, adv, mask


def test_every_experimental_kernel_is_registered_as_experimental_with_a_paper():
    registered = {(k.kind, k.name): k for k in jaxgrpo.list_kernels() if k.name.startswith("experimental/")}
    assert EXPERIMENTAL <= set(registered)
    for key in EXPERIMENTAL:
        info = registered[key]
        assert info.experimental and info.paper and "(20" in info.paper
        # Every reconstruction says in its docstring what is unverified.
        assert "unverified" in (info.fn.__doc__ or "").lower(), key


# ----------------------------------------------------------------------- ETR


def test_etr_hand_case_wide_range_for_large_advantage_in_high_variance_group():
    # A=+2: micro = 1 + 0.5 (2 - 1) = 1.5; v = 0.25 = v_max: macro = 1 + 0.5 (2 - 1) = 1.5;
    # s = clip(2.25, 0.5, 2) = 2 -> eps_high = 0.4; rho = 1.5 -> clipped at 1.4 -> l = -2 * 1.4 = -2.8.
    # A=-1 row: micro = 1; v = 0: macro = 0.5; s = 0.5 -> eps_low = 0.1; rho = 0.5 -> clip to 0.9,
    # l = -min(-0.5, -0.9) = 0.9.
    logp = jnp.log(jnp.array([[1.5], [0.5]], jnp.float32))
    old = jnp.zeros((2, 1), jnp.float32)
    loss, metrics = etr_clip(logp, old, jnp.array([2.0, -1.0]), jnp.ones((2, 1)), group_variance=jnp.array([0.25, 0.0]))
    _close(loss[:, 0], [-2.8, 0.9], atol=1e-5)
    _close(metrics["clip_fraction"], 1.0)
    # Same row under plain ppo_clip (eps 0.2): rho = 1.5 clipped at 1.2 -> -2.4.
    _close(ppo_clip(logp, old, jnp.array([2.0, -1.0]), jnp.ones((2, 1)))[0][0, 0], -2.4, atol=1e-5)


_ppo_clip = jax.jit(ppo_clip)
_etr = jax.jit(lambda lp, old, adv, m, var: etr_clip(lp, old, adv, m, group_variance=var))
_etr_off = jax.jit(
    lambda lp, old, adv, m, var: etr_clip(
        lp, old, adv, m, group_variance=var, advantage_elasticity=0.0, variance_elasticity=0.0
    )
)


@FAST
@given(token_batches_with_advantages(), st.floats(0.0, 0.5))
def test_etr_without_elasticity_is_ppo_clip_and_always_finite(batch, variance):
    logp, old, adv, mask = batch
    var = jnp.full((logp.shape[0],), variance, jnp.float32)
    loss, metrics = _etr_off(logp, old, adv, mask, var)
    _close(loss, _ppo_clip(logp, old, adv, mask)[0], atol=1e-5)
    loss, metrics = _etr(logp, old, adv, mask, var)
    _finite((loss, metrics))
    assert np.all(np.asarray(loss)[np.asarray(mask) == 0] == 0)


def test_etr_sharded_matches_unsharded(mesh_2x4):
    logp, old, adv, mask = _random_tokens(0, n=16)
    var = jnp.linspace(0, 0.25, 16, dtype=jnp.float32)
    assert_sharded_matches(
        etr_clip, dict(logp=logp, old_logp=old, advantages=adv, mask=mask, group_variance=var), mesh_2x4, atol=1e-5
    )


# ---------------------------------------------------------------------- DHPO


def test_dhpo_reduces_to_ppo_clip_and_gspo_token_in_value_and_gradient():
    logp, old, adv, mask = _random_tokens(1)

    def total(fn, **kw):
        return lambda lp: fn(lp, old, adv, mask, **kw)[0].sum()

    for kw, ref in (
        (dict(token_weight=1.0), lambda lp: ppo_clip(lp, old, adv, mask)[0].sum()),
        (dict(token_weight=0.0), lambda lp: gspo_token(lp, old, adv, mask)[0].sum()),
    ):
        _close(total(dhpo, **kw)(logp), ref(logp), atol=1e-5)
        _close(jax.grad(total(dhpo, **kw))(logp), jax.grad(ref)(logp), atol=1e-5)


def test_dhpo_hand_case_average_and_entropy_weights():
    # One sequence of two tokens, A = +1, rho = [0.7, 2.0]: s = exp((log 0.7 + log 2) / 2) = sqrt(1.4) = 1.183216.
    # Clipped branches: clip(rho, 0.8, 1.2) = [0.8, 1.2]; clip(s, 1 - 3e-4, 1 + 4e-4) = 1.0004.
    # Average (w = 0.5): mixed r = [0.35 + 0.591608, 1.0 + 0.591608] = [0.941608, 1.591608];
    # clipped r = [0.4 + 0.5002, 0.6 + 0.5002] = [0.9002, 1.1002]; l = -min(r, r_clip) = [-0.9002, -1.1002].
    # (Mixing the two branch losses instead would give -(0.5 * 0.7 + 0.5 * 1.0004) = -0.8502 for token 0.)
    logp = jnp.log(jnp.array([[0.7, 2.0]], jnp.float32))
    old = jnp.zeros((1, 2), jnp.float32)
    adv, mask = jnp.array([1.0]), jnp.ones((1, 2))
    _close(dhpo(logp, old, adv, mask)[0], [[-0.9002, -1.1002]], atol=1e-5)
    # Entropy H = [3, 1]: sequence mean 2 -> w = [3/5, 1/3].
    # Token 0: r = 0.6 * 0.7 + 0.4 * 1.183216 = 0.893286, r_clip = 0.48 + 0.40016 = 0.88016 -> -0.88016.
    # Token 1: r = 2/3 + 2/3 * 1.183216 = 1.455477, r_clip = 0.4 + 2/3 * 1.0004 = 1.066933 -> -1.066933.
    loss, metrics = dhpo(logp, old, adv, mask, token_entropy=jnp.array([[3.0, 1.0]]))
    _close(loss, [[-0.88016, -1.066933]], atol=1e-5)
    _close(metrics["token_weight_mean"], (0.6 + 1 / 3) / 2, atol=1e-6)


_dhpo = jax.jit(lambda lp, old, adv, m, h: dhpo(lp, old, adv, m, token_entropy=h))
_dhpo_grad = jax.jit(jax.grad(lambda lp, old, adv, m, h: dhpo(lp, old, adv, m, token_entropy=h)[0].sum()))


@FAST
@given(token_batches_with_advantages(), st.booleans())
def test_dhpo_finite_for_random_inputs(batch, with_entropy):
    logp, old, adv, mask = batch
    entropy = -logp if with_entropy else None  # nonnegative, zero allowed
    loss, metrics = _dhpo(logp, old, adv, mask, entropy)
    _finite((loss, metrics))
    _finite(_dhpo_grad(logp, old, adv, mask, entropy))


def test_dhpo_sharded_matches_unsharded(mesh_2x4):
    logp, old, adv, mask = _random_tokens(2, n=16)
    assert_sharded_matches(
        dhpo, dict(logp=logp, old_logp=old, advantages=adv, mask=mask, token_entropy=-logp), mesh_2x4, atol=1e-5
    )


# ----------------------------------------------------------- single-stream SPO


def test_spo_tracker_hand_case():
    # Prompt 0: prior alpha = beta = 4 (n0 = 8, v0 = 0.5); two rows r = [1, 1], KL = 0 -> rho = 2^0 = 1
    # clipped to 0.96: alpha = 0.96*4 + 2 = 5.84, beta = 0.96*4 + 0 = 3.84.
    # Prompt 1: v0 = 0.25 -> alpha = 2, beta = 6; one row r = 0, KL = 0.12 -> rho = 2^-2 = 0.25 -> 0.875:
    # alpha = 1.75, beta = 5.25 + 1 = 6.25.  Prompt 2 is not in the batch: unchanged (alpha = 4, beta = 4).
    state = spo_tracker_init(3, jnp.array([0.5, 0.25, 0.5]))
    new = spo_value_tracker(state, jnp.array([0, 0, 1]), jnp.array([1.0, 1.0, 0.0]), jnp.array([0.0, 0.0, 0.12]))
    _close(new.alpha, [5.84, 1.75, 4.0], atol=1e-5)
    _close(new.beta, [3.84, 6.25, 4.0], atol=1e-5)
    _close(new.value, [5.84 / 9.68, 1.75 / 8.0, 0.5], atol=1e-6)


def test_spo_tracker_ignores_invalid_rows():
    state = spo_tracker_init(2)
    new = spo_value_tracker(state, jnp.array([0, 1]), jnp.array([1.0, 1.0]), jnp.zeros(2), valid=jnp.array([True, False]))
    _close(new.alpha, [0.96 * 4 + 1, 4.0])
    _close(new.beta, [0.96 * 4, 4.0])


@FAST
@given(outcome_batches(binary=True), st.floats(0.0, 10.0))
def test_spo_tracker_and_advantage_stay_finite_and_in_range(batch, kl):
    rewards, prompt_ids, valid, num_prompts = _pad_outcome(batch)
    state = spo_tracker_init(num_prompts)
    for _ in range(3):
        state = _spo_update(state, prompt_ids, rewards, jnp.full(rewards.shape, kl), valid=valid)
    v = np.asarray(state.value)
    assert np.all((v > 0) & (v < 1))
    weights = _spo_priority(state.value)
    _close(weights.sum(), 1.0, atol=1e-5)
    baseline = segments.gather(state.value, prompt_ids)
    adv = _spo_advantage(rewards, prompt_ids, num_groups=num_prompts, valid=valid, baseline=baseline)
    _finite(adv)
    assert np.all(np.asarray(adv)[~np.asarray(valid)] == 0)


def test_spo_priority_hand_case():
    # sqrt(v (1 - v)) + 0.05: v = 0.5 -> 0.55; v = 1 -> 0.05; v = 0.9 -> 0.3 + 0.05 = 0.35; invalid -> 0.
    # Sum 0.95 -> [0.5789, 0.0526, 0.3684, 0].
    w = spo_priority(jnp.array([0.5, 1.0, 0.9, 0.5]), valid=jnp.array([True, True, True, False]))
    _close(w, [0.55 / 0.95, 0.05 / 0.95, 0.35 / 0.95, 0.0], atol=1e-6)


def test_spo_advantage_hand_case_gives_signal_to_single_and_uniform_prompts():
    # r - v = [1 - 0.5, 1 - 0.75, 0 - 0.25, 0 - 0.5] = [0.5, 0.25, -0.25, -0.5]; mean 0,
    # unbiased var = (0.25 + 0.0625) * 2 / 3 = 0.208333 -> A = x / 0.456435 = [1.0954, 0.5477, -0.5477, -1.0954].
    # Prompt 1 has one row and prompt 0 is all correct, yet both get nonzero advantages (no group statistics).
    adv = spo_advantage(
        jnp.array([1.0, 1.0, 0.0, 0.0]), jnp.array([0, 0, 1, 2]), num_groups=3, baseline=jnp.array([0.5, 0.75, 0.25, 0.5])
    )
    _close(adv, [1.0954451, 0.5477226, -0.5477226, -1.0954451], atol=1e-5)
    with pytest.raises(TypeError, match="baseline"):
        spo_advantage(jnp.zeros(2), jnp.zeros(2, jnp.int32), num_groups=1)


def test_spo_tracker_sharded_matches_unsharded(mesh_2x4):
    rng = np.random.default_rng(3)
    prompt_ids = jnp.asarray(rng.integers(0, 8, 16), jnp.int32)
    rewards = jnp.asarray(rng.integers(0, 2, 16), jnp.float32)
    kl = jnp.asarray(rng.uniform(0, 0.2, 16), jnp.float32)
    state = spo_tracker_init(8, jnp.asarray(rng.uniform(0.1, 0.9, 8), jnp.float32))

    def update(alpha, beta, prompt_ids, rewards, kl):
        return tuple(spo_value_tracker(SPOTrackerState(alpha, beta), prompt_ids, rewards, kl))

    assert_sharded_matches(
        update, dict(alpha=state.alpha, beta=state.beta, prompt_ids=prompt_ids, rewards=rewards, kl=kl), mesh_2x4, atol=1e-5
    )


# --------------------------------------------------------------------- A-GRAE


def test_a_grae_hand_case():
    # Group 0 r = [1, 0, 0, 0]: GRPO (ddof 1) std = 0.5 -> A = [1.5, -0.5, -0.5, -0.5]; p = 0.25.
    # lambda+ = 0.5 -> [0.75, -0.5, -0.5, -0.5]; tau = 0: w = 1 + 0.5 * 1 * (0.5 - 1) = 0.75
    # -> [0.5625, -0.375, -0.375, -0.375]; tau = 1: w = 1 + 0.5 * (-1) * (-0.5) = 1.25
    # -> [0.9375, -0.625, -0.625, -0.625] (hard prompts weigh more late in training).
    # Default progress = batch mean reward 0.25: w = 1 + 0.5 * 0.5 * (-0.5) = 0.875
    # -> [0.65625, -0.4375, -0.4375, -0.4375].
    r, g = jnp.array([1.0, 0.0, 0.0, 0.0]), jnp.zeros(4, jnp.int32)
    _close(a_grae(r, g, num_groups=1), [0.65625, -0.4375, -0.4375, -0.4375], atol=1e-5)
    _close(a_grae(r, g, num_groups=1, progress=0.0), [0.5625, -0.375, -0.375, -0.375], atol=1e-5)
    _close(a_grae(r, g, num_groups=1, progress=1.0), [0.9375, -0.625, -0.625, -0.625], atol=1e-5)
    # progress may be traced: a schedule does not recompile.
    f = jax.jit(lambda r, g, tau: a_grae(r, g, num_groups=1, progress=tau))
    _close(f(r, g, jnp.float32(1.0)), [0.9375, -0.625, -0.625, -0.625], atol=1e-5)


@FAST
@given(outcome_batches(), st.floats(0.0, 1.0))
def test_a_grae_reduces_to_grpo_and_is_finite(batch, progress):
    rewards, g, valid, num_groups = _pad_outcome(batch)
    off = _a_grae(rewards, g, num_groups=num_groups, valid=valid, positive_scale=1.0, difficulty_strength=0.0)
    _close(off, _grpo(rewards, g, num_groups=num_groups, valid=valid), atol=1e-5)
    adv = _a_grae(rewards, g, num_groups=num_groups, valid=valid, progress=progress)
    _finite(adv)
    assert np.all(np.asarray(adv)[~np.asarray(valid)] == 0)


def test_a_grae_sharded_matches_unsharded(mesh_2x4):
    rng = np.random.default_rng(4)
    arrays = dict(
        rewards=jnp.asarray(rng.integers(0, 2, 16), jnp.float32),
        group_ids=jnp.asarray(np.repeat(np.arange(4), 4), jnp.int32),
        valid=jnp.asarray(rng.uniform(size=16) < 0.9),
    )
    assert_sharded_matches(a_grae, arrays, mesh_2x4, atol=1e-5, num_groups=4, progress=0.3)


# ------------------------------------------------------------------- T-PPO EGAE


def test_egae_hand_case_truncated_response():
    # r = [0, 0, 0], V = [0.5, 0.6, 0.7], truncated, V_boot = 0.8, gamma = 1, lambda = 0.95:
    # delta = [0 + 0.6 - 0.5, 0 + 0.7 - 0.6, 0 + 0.8 - 0.7] = [0.1, 0.1, 0.1];
    # A2 = 0.1, A1 = 0.1 + 0.95 * 0.1 = 0.195, A0 = 0.1 + 0.95 * 0.195 = 0.28525; returns = A + V.
    values = jnp.array([[0.5, 0.6, 0.7]])
    adv, ret = t_ppo_egae(
        jnp.zeros((1, 3)), values, jnp.ones((1, 3)), is_complete=jnp.array([False]), bootstrap_values=jnp.array([0.8]), lam=0.95
    )
    _close(adv, [[0.28525, 0.195, 0.1]], atol=1e-6)
    _close(ret, [[0.78525, 0.795, 0.8]], atol=1e-6)
    # Default bootstrap V_boot = V_L = 0.7 with a masked tail: delta = [0.1, 0.1, 0 + 0.7 - 0.7 = 0].
    adv, _ = t_ppo_egae(
        jnp.zeros((1, 4)), jnp.array([[0.5, 0.6, 0.7, 9.0]]), jnp.array([[1.0, 1, 1, 0]]), is_complete=jnp.array([False]), lam=0.95
    )
    _close(adv, [[0.1 + 0.95 * 0.1, 0.1, 0.0, 0.0]], atol=1e-6)


def test_egae_on_complete_response_is_gae_golden():
    # METHODS.md §2 item 7: r = [0, 0, 1], V = [.5, .6, .7], gamma = 1, lambda = .95 -> [0.46575, 0.385, 0.3].
    adv, _ = t_ppo_egae(
        jnp.array([[0.0, 0.0, 1.0]]), jnp.array([[0.5, 0.6, 0.7]]), jnp.ones((1, 3)), is_complete=jnp.array([True]), lam=0.95
    )
    _close(adv, [[0.46575, 0.385, 0.3]], atol=1e-6)


# gamma and lambda are traced, so new values do not recompile.
_gae = jax.jit(lambda r, v, m, g, l: gae(r, v, m, gamma=g, lam=l))
_egae = jax.jit(lambda r, v, m, c, g, l: t_ppo_egae(r, v, m, is_complete=c, gamma=g, lam=l))


@FAST
@given(token_batches(), st.floats(0.5, 1.0), st.floats(0.0, 1.0))
def test_egae_equals_gae_on_complete_responses_and_is_finite(batch, gamma, lam):
    values, rewards, mask = _pad_tokens(*batch)  # any [N, T] floats serve as values and rewards
    n = values.shape[0]
    ref = _gae(rewards, values, mask, gamma, lam)
    got = _egae(rewards, values, mask, jnp.ones(n, bool), gamma, lam)
    _close(got[0], ref[0], atol=1e-4)
    _close(got[1], ref[1], atol=1e-4)
    truncated = _egae(rewards, values, mask, jnp.zeros(n, bool), gamma, lam)
    _finite(truncated)
    assert np.all(np.asarray(truncated[0])[np.asarray(mask) == 0] == 0)


def test_egae_sharded_matches_unsharded(mesh_2x4):
    rng = np.random.default_rng(5)
    arrays = dict(
        token_rewards=jnp.asarray(rng.normal(size=(16, 6)), jnp.float32),
        values=jnp.asarray(rng.normal(size=(16, 6)), jnp.float32),
        mask=jnp.asarray(rng.uniform(size=(16, 6)) < 0.8, jnp.float32),
        is_complete=jnp.asarray(rng.uniform(size=16) < 0.5),
        bootstrap_values=jnp.asarray(rng.normal(size=16), jnp.float32),
    )
    assert_sharded_matches(t_ppo_egae, arrays, mesh_2x4, atol=1e-5, gamma=0.99, lam=0.95)


# ----------------------------------------------------------------- GRPO-VPS


def test_vps_progress_hand_case():
    # P = [0.2, 0.5, 1.0] -> Delta = [0.3, 0.5]; tokens in segments [0, 0, 1], A = 0.5:
    # A_t = 0.5 + [0.3, 0.3, 0.5] = [0.8, 0.8, 1.0]; a masked 4th token gets 0.
    out = grpo_vps_progress(
        jnp.array([0.5]), jnp.array([[0.2, 0.5, 1.0]]), jnp.array([[0, 0, 1, 1]]), jnp.array([[1.0, 1, 1, 0]])
    )
    _close(out, [[0.8, 0.8, 1.0, 0.0]], atol=1e-6)
    # Centered within a group of two rows with Delta = [0.3, 0.5] and [0.1, -0.1]:
    # segment means [0.2, 0.2] -> [0.1, 0.3] and [-0.1, -0.3]; with A = [0.5, -0.5] and one token per segment:
    # [[0.6, 0.8], [-0.6, -0.8]].
    out = grpo_vps_progress(
        jnp.array([0.5, -0.5]),
        jnp.array([[0.2, 0.5, 1.0], [0.4, 0.5, 0.4]]),
        jnp.array([[0, 1], [0, 1]]),
        jnp.ones((2, 2)),
        center=True,
        group_ids=jnp.array([0, 0]),
        num_groups=1,
    )
    _close(out, [[0.6, 0.8], [-0.6, -0.8]], atol=1e-6)


@FAST
@given(token_batches(), st.integers(1, 4))
def test_vps_progress_without_coefficient_broadcasts_outcome_advantage(batch, num_segments):
    logp, mask = _pad_tokens(batch[0], batch[2])
    n, t = logp.shape
    rng = np.random.default_rng(n * 31 + t)
    adv = jnp.asarray(rng.normal(size=n), jnp.float32)
    probs = jnp.asarray(rng.uniform(size=(n, num_segments + 1)), jnp.float32)
    seg = jnp.asarray(np.sort(rng.integers(0, num_segments, (n, t)), axis=1), jnp.int32)
    _close(_vps(adv, probs, seg, mask, progress_coef=0.0), adv[:, None] * mask)
    out = _vps(adv, probs, seg, mask, progress_coef=1.0)
    _finite(out)
    assert np.all(np.abs(np.asarray(out - adv[:, None] * mask)) <= 1.0 + 1e-6)  # |Delta| <= 1 for probabilities


def test_vps_progress_sharded_matches_unsharded(mesh_2x4):
    rng = np.random.default_rng(6)
    arrays = dict(
        advantages=jnp.asarray(rng.normal(size=16), jnp.float32),
        probe_probs=jnp.asarray(rng.uniform(size=(16, 4)), jnp.float32),
        segment_ids=jnp.asarray(np.sort(rng.integers(0, 3, (16, 8)), axis=1), jnp.int32),
        mask=jnp.asarray(rng.uniform(size=(16, 8)) < 0.9, jnp.float32),
    )
    assert_sharded_matches(grpo_vps_progress, arrays, mesh_2x4)


# ---------------------------------------------------------- Arbitrary-Entropy PO


def test_aepo_entropy_is_scaled_reinforce_and_raises_sampled_token_probability():
    logp, old, adv, mask = _random_tokens(7)
    _close(aepo_entropy(logp, old, adv, mask)[0], reinforce(logp, old, adv, mask)[0])
    _close(aepo_entropy(logp, old, adv, mask, coef=0.1)[0], 0.1 * reinforce(logp, old, adv, mask)[0], atol=1e-6)
    # Gradient of the loss w.r.t. a sampled token's log-prob is -c A m: descent raises log pi of positive-A samples.
    grad = jax.grad(lambda lp: aepo_entropy(lp, old, adv, mask, coef=0.5)[0].sum())(logp)
    _close(grad, -0.5 * adv[:, None] * mask)
    # positive_only drops the samples with A <= 0.
    _close(aepo_entropy(logp, old, adv, mask, positive_only=True)[0], -jnp.maximum(adv, 0)[:, None] * logp * mask)


def test_aepo_temperature_update_hand_case():
    # log T = log 1 + 0.1 * (2.0 - 1.0) -> T = e^0.1 = 1.10517; above target it cools: e^-0.1 = 0.904837;
    # far below target the temperature saturates at max 2.0.
    _close(aepo_temperature_update(1.0, 1.0, target_entropy=2.0), np.exp(0.1), atol=1e-6)
    _close(aepo_temperature_update(1.0, 3.0, target_entropy=2.0), np.exp(-0.1), atol=1e-6)
    _close(aepo_temperature_update(1.9, -50.0, target_entropy=2.0), 2.0)


# ----------------------------------------------------------------------- GRPO-λ


def test_grpo_lambda_hand_case():
    # Group 0: correct [1, 1], lengths [100, 300] (ratio 1.0); group 1: correct [1, 0], lengths [100, 200] (0.5).
    # lambda = 0.5 of 2 groups -> 1 group: group 0 (highest ratio) gets the length reward:
    # 0.5 - (100 - 100)/200 = 0.5 and 0.5 - 200/200 = -0.5 -> [1.5, 0.5]; group 1 keeps 0/1: [1, 0].
    correct, lengths, g = jnp.array([1.0, 1, 1, 0]), jnp.array([100.0, 300, 100, 200]), jnp.array([0, 0, 1, 1])
    _close(grpo_lambda(correct, lengths, g, num_groups=2, top_fraction=0.5), [1.5, 0.5, 1.0, 0.0])
    # lambda = 1: group 1 also penalized: correct short one 0.5 - 0 = 0.5 -> 1.5; wrong long one
    # min(0, 0.5 - 1) = -0.5 -> -0.5.
    _close(grpo_lambda(correct, lengths, g, num_groups=2, top_fraction=1.0), [1.5, 0.5, 1.5, -0.5])
    # Ties break by group index; a group whose lengths are all equal has no length signal.
    _close(
        grpo_lambda(jnp.ones(4), jnp.array([5.0, 5, 1, 3]), g, num_groups=2, top_fraction=0.5), [1.0, 1.0, 1.0, 1.0]
    )


@FAST
@given(outcome_batches(binary=True), st.sampled_from([0.3, 0.5, 1.0]))
def test_grpo_lambda_switched_off_is_plain_correctness_and_finite(batch, top_fraction):
    correct, g, valid, num_groups = _pad_outcome(batch)
    lengths = jnp.abs(jnp.arange(correct.shape[0], dtype=jnp.float32) * 37.0 % 101)

    _close(_grpo_lambda(correct, lengths, g, num_groups=num_groups, valid=valid, top_fraction=0.0), jnp.where(valid, correct, 0.0))
    out = _grpo_lambda(correct, lengths, g, num_groups=num_groups, valid=valid, top_fraction=top_fraction)
    _finite(out)
    assert np.all((np.asarray(out) >= -0.5 - 1e-6) & (np.asarray(out) <= 1.5 + 1e-6))


def test_grpo_lambda_sharded_matches_unsharded(mesh_2x4):
    rng = np.random.default_rng(8)
    arrays = dict(
        correct=jnp.asarray(rng.integers(0, 2, 16), jnp.float32),
        lengths=jnp.asarray(rng.integers(10, 500, 16), jnp.float32),
        group_ids=jnp.asarray(rng.integers(0, 4, 16), jnp.int32),
    )
    assert_sharded_matches(grpo_lambda, arrays, mesh_2x4, num_groups=4, top_fraction=0.5)


# ------------------------------------------------------------------- ConciseR


def test_conciser_hand_case():
    # Group 0 all correct, lengths [1024, 2048], L_max 4096: 1 + (1 - 0.25) = 1.75, 1 + (1 - 0.5) = 1.5.
    # Group 1 has a wrong answer: plain [1, 0]. An over-length correct answer in a solved group gets no bonus.
    correct, g = jnp.array([1.0, 1, 1, 0]), jnp.array([0, 0, 1, 1])
    out = conciser_length_reward(correct, jnp.array([1024.0, 2048, 100, 200]), g, num_groups=2, max_len=4096)
    _close(out, [1.75, 1.5, 1.0, 0.0])
    out = conciser_length_reward(jnp.ones(2), jnp.array([5000.0, 0.0]), jnp.zeros(2, jnp.int32), num_groups=1, max_len=4096)
    _close(out, [1.0, 2.0])
    # An invalid wrong row does not stop its group from counting as all correct.
    out = conciser_length_reward(
        correct, jnp.array([1024.0, 2048, 2048, 200]), g, num_groups=2, max_len=4096, valid=jnp.array([True, True, True, False])
    )
    _close(out, [1.75, 1.5, 1.5, 0.0])


@FAST
@given(outcome_batches(binary=True))
def test_conciser_without_length_coefficient_is_plain_correctness(batch):
    correct, g, valid, num_groups = _pad_outcome(batch)
    lengths = jnp.arange(correct.shape[0], dtype=jnp.float32) * 200.0

    _close(_conciser(correct, lengths, g, num_groups=num_groups, valid=valid, length_coef=0.0), jnp.where(valid, correct, 0.0))
    out = _conciser(correct, lengths, g, num_groups=num_groups, valid=valid, length_coef=1.0)
    _finite(out)
    assert np.all(np.asarray(out) >= np.asarray(jnp.where(valid, correct, 0.0)))


def test_conciser_sharded_matches_unsharded(mesh_2x4):
    arrays = dict(
        correct=jnp.asarray([1.0] * 8 + [1.0, 0.0] * 4),
        lengths=jnp.arange(16, dtype=jnp.float32) * 300.0,
        group_ids=jnp.asarray(np.repeat(np.arange(4), 4), jnp.int32),
    )
    assert_sharded_matches(conciser_length_reward, arrays, mesh_2x4, num_groups=4, max_len=4096)


# ------------------------------------------------------------------------ TraPO


def test_trapo_selection_hand_case():
    # Labeled trajectories [1, 0] and [1, 1]/sqrt2 direction. Unlabeled:
    # u0 = [1, 0]: cos = [1, 0.7071] -> mean 0.8536 (kept: >= 0.4);
    # u1 = [0, 1]: cos = [0, 0.7071] -> 0.3536 (kept only if in the top 10%: ceil(0.1 * 4) = 1 -> no);
    # u2 = [0, 0]: cos 0 -> 0 (dropped); u3 = [1, 1]: cos = [0.7071, 1] -> 0.8536 (kept).
    keep, sim = trapo_selection(
        jnp.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]]), jnp.array([[1.0, 0.0], [1.0, 1.0]])
    )
    _close(sim, [0.8535534, 0.3535534, 0.0, 0.8535534], atol=1e-6)
    assert keep.tolist() == [True, False, False, True]
    # With a higher threshold only the top 10% (one prompt, the first of the tie) survives.
    keep, _ = trapo_selection(
        jnp.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]]), jnp.array([[1.0, 0.0], [1.0, 1.0]]), min_similarity=0.9
    )
    assert keep.tolist() == [True, False, False, False]


def test_trapo_selection_sharded_matches_unsharded(mesh_2x4):
    rng = np.random.default_rng(9)
    labeled = jnp.asarray(rng.uniform(size=(5, 4)), jnp.float32)
    unlabeled = jnp.asarray(rng.uniform(size=(16, 4)), jnp.float32)
    fn = lambda unlabeled_pass_rates: trapo_selection(unlabeled_pass_rates, labeled)  # noqa: E731
    assert_sharded_matches(fn, dict(unlabeled_pass_rates=unlabeled), mesh_2x4)


@FAST
@given(
    st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=32, max_size=32),
    st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=12, max_size=12),
    st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_trapo_selection_finite_and_keeps_only_valid_prompts(unlabeled, labeled, valid):
    # All-zero trajectories (never solved) have no direction: similarity 0, never NaN.
    keep, sim = _trapo(jnp.asarray(unlabeled).reshape(8, 4), jnp.asarray(labeled).reshape(3, 4), unlabeled_valid=jnp.asarray(valid))
    _finite(sim)
    assert np.all(np.asarray(sim) <= 1.0 + 1e-6)
    assert not np.any(np.asarray(keep) & ~np.asarray(valid))
    # At least ceil(10%) of the valid prompts are kept.
    assert np.asarray(keep).sum() >= min(1, sum(valid))


_trapo = jax.jit(trapo_selection)
