"""Policy losses (PPO clip / DAPO clip-higher / dual clip, GSPO, GSPO-token, CISPO, REINFORCE) and the value loss.

Golden values are METHODS.md §2 items 1, 3, 4 and 7, computed by hand. A
per-token loss here is the *negative* surrogate: `-min(rho A, clip(rho) A)`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.kernel_checks import assert_sharded_matches, token_batches

import jaxgrpo
from jaxgrpo.kernels import losses

POLICY_LOSSES = ("ppo_clip", "gspo", "gspo_token", "cispo", "reinforce")
PROPERTY = settings(max_examples=25, deadline=None)


def one_token(ratio, advantage, old=-1.0):
    """logp, old_logp, advantages, mask for a single token with the given ratio (f32[1,1])."""
    old_logp = jnp.full((1, 1), old)
    return old_logp + jnp.log(jnp.float32(ratio)), old_logp, jnp.array([advantage], jnp.float32), jnp.ones((1, 1))


@functools.cache
def jitted_value_and_grad_of_sum(loss_fn, hparams=()):
    """jit(d/dlogp sum(per-token loss)), returning (sum, (per-token loss, metrics)) and the gradient."""

    def total(logp, old_logp, advantages, mask):
        loss, metrics = loss_fn(logp, old_logp, advantages, mask, **dict(hparams))
        return loss.sum(), (loss, metrics)

    return jax.jit(jax.value_and_grad(total, has_aux=True))


def value_and_grad_of_token(loss_fn, ratio, advantage, **hparams):
    """The per-token loss of one token and its derivative with respect to logp."""
    (value, _), grad = jitted_value_and_grad_of_sum(loss_fn, tuple(sorted(hparams.items())))(
        *one_token(ratio, advantage)
    )
    return float(value), float(grad[0, 0])


# ---------------------------------------------------------------- PPO clip


@pytest.mark.parametrize(
    "ratio, advantage, hparams, value, grad",
    [
        # GRPO golden: rho=1.5, A=+1, eps=0.2 -> the term is 1.2 (clipped) and the gradient is 0.
        (1.5, 1.0, {}, -1.2, 0.0),
        # DAPO golden: rho=1.25 < 1.28 is not clipped with eps_high=0.28; d(-rho A)/dlogp = -rho A.
        (1.25, 1.0, dict(eps_low=0.2, eps_high=0.28), -1.25, -1.25),
        (1.25, 1.0, {}, -1.2, 0.0),  # ... but is clipped by the symmetric 0.2
        # A < 0: clipping bites below 1 - eps_low, whatever eps_high.
        (0.5, -1.0, dict(eps_high=0.28), 0.8, 0.0),
        (1.1, -1.0, {}, 1.1, 1.1),
        (0.9, 2.0, {}, -1.8, -1.8),  # inside the range: plain -rho A
        # Dual clip (c=3): A < 0 with rho = 5 is bounded by -c A = 3, with zero gradient.
        (5.0, -1.0, dict(clip_ratio_c=3.0), 3.0, 0.0),
        (5.0, -1.0, {}, 5.0, 5.0),
        (2.0, -1.0, dict(clip_ratio_c=3.0), 2.0, 2.0),  # below the bound: untouched
        (5.0, 1.0, dict(clip_ratio_c=3.0), -1.2, 0.0),  # A > 0: no dual clip
    ],
)
def test_ppo_clip_value_and_gradient(ratio, advantage, hparams, value, grad):
    v, g = value_and_grad_of_token(losses.ppo_clip, ratio, advantage, **hparams)
    np.testing.assert_allclose([v, g], [value, grad], atol=1e-5)


def test_ppo_clip_metrics_golden():
    ratio = jnp.array([[1.5, 0.5, 1.1, 1.0, 9.0]])
    adv = jnp.array([[1.0, -1.0, 1.0, 1.0, 1.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the last token is masked out of every statistic
    old = jnp.full((1, 5), -2.0)
    loss, m = losses.ppo_clip(old + jnp.log(ratio), old, adv, mask)
    np.testing.assert_allclose(loss, [[-1.2, 0.8, -1.1, -1.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(m["clip_fraction"], 0.5, atol=1e-6)
    np.testing.assert_allclose(m["clip_fraction_high"], 0.25, atol=1e-6)
    np.testing.assert_allclose(m["clip_fraction_low"], 0.25, atol=1e-6)
    np.testing.assert_allclose(m["ratio_mean"], (1.5 + 0.5 + 1.1 + 1.0) / 4, atol=1e-6)
    np.testing.assert_allclose([m["ratio_max"], m["ratio_min"]], [1.5, 0.5], atol=1e-6)
    r = np.array([1.5, 0.5, 1.1, 1.0])
    np.testing.assert_allclose(m["approx_kl"], np.mean(r - 1 - np.log(r)), atol=1e-6)
    _, m = losses.ppo_clip(old + jnp.log(ratio), old, jnp.array([-1.0]), mask, clip_ratio_c=3.0)
    assert float(m["dual_clip_fraction"]) == 0.0  # no ratio above 3 among the unmasked tokens


def test_token_advantages_equal_broadcast_sequence_advantages():
    rng = np.random.default_rng(0)
    logp, old = jnp.asarray(rng.normal(size=(2, 2, 3)) * 0.3 - 1.0, jnp.float32)
    adv = jnp.array([0.7, -1.3])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    for name in POLICY_LOSSES:
        fn = jaxgrpo.get_loss(name)
        np.testing.assert_allclose(
            fn(logp, old, adv, mask)[0], fn(logp, old, jnp.broadcast_to(adv[:, None], (2, 3)), mask)[0], atol=1e-6
        )


# ---------------------------------------------------------------- GSPO and GSPO-token

GSPO_LOG_RATIO = jnp.array([[0.1, -0.1, 0.3]])  # mean 0.1 -> s = e^0.1 = 1.1052


@pytest.mark.parametrize("name", ("gspo", "gspo_token"))
def test_gspo_golden_is_clipped_to_one_plus_eps_high(name):
    old = jnp.full((1, 3), -1.0)
    (_, (loss, m)), grad = jitted_value_and_grad_of_sum(jaxgrpo.get_loss(name))(
        old + GSPO_LOG_RATIO, old, jnp.array([1.0]), jnp.ones((1, 3))
    )
    np.testing.assert_allclose(loss, -1.0004 * np.ones((1, 3)), atol=1e-6)
    np.testing.assert_allclose(m["clip_fraction"], 1.0)
    np.testing.assert_allclose(m["ratio_mean"], np.exp(0.1), atol=1e-6)
    np.testing.assert_array_equal(grad, 0.0)  # A > 0 and clipped: no gradient


@pytest.mark.parametrize("name", ("gspo", "gspo_token"))
def test_gspo_bounds_the_sequence_log_ratio_at_ten(name):
    # Token log-ratios [15, 15] (logp -1, old -16), A = -1: the sequence log-ratio is 15. The clip does
    # not bound s from above when A < 0, so the loss was max(e^15, 1.0004) = 3.27e6 (up to e^20 = 4.85e8).
    # With verl's bound M = 10 every token carries e^10 = 22026.47 and no gradient.
    fn = jaxgrpo.get_loss(name)
    logp, old, mask = jnp.full((1, 2), -1.0), jnp.full((1, 2), -16.0), jnp.ones((1, 2))
    (total, (loss, _)), grad = jitted_value_and_grad_of_sum(fn)(logp, old, jnp.array([-1.0]), mask)
    np.testing.assert_allclose(loss, [[np.exp(10.0), np.exp(10.0)]], rtol=1e-5)
    np.testing.assert_array_equal(grad, [[0.0, 0.0]])
    (_, (loose, _)), _ = jitted_value_and_grad_of_sum(fn, (("max_seq_log_ratio", 20.0),))(
        logp, old, jnp.array([-1.0]), mask)
    np.testing.assert_allclose(loose, [[np.exp(15.0), np.exp(15.0)]], rtol=1e-5)
    # Below the bound nothing changes: log-ratios [.5, .5], A = -1 -> s = e^.5 = 1.6487 on each token.
    # The summed loss 2 s has gradient 2 s / 2 = s per token (GSPO: d log s / d logp_t = 1/2; GSPO-token:
    # token t's own ratio, d s_t / d logp_t = s).
    (_, (below, _)), grad = jitted_value_and_grad_of_sum(fn)(old + 0.5, old, jnp.array([-1.0]), mask)
    np.testing.assert_allclose(below, [[np.exp(0.5), np.exp(0.5)]], rtol=1e-6)
    np.testing.assert_allclose(grad, [[np.exp(0.5), np.exp(0.5)]], rtol=1e-5)


def test_gspo_ratio_ignores_masked_tokens():
    old = jnp.full((1, 4), -1.0)
    logp = old + jnp.array([[0.1, -0.1, 7.0, 0.3]])
    loss, _ = losses.gspo(logp, old, jnp.array([1.0]), jnp.array([[1.0, 1.0, 0.0, 1.0]]))
    np.testing.assert_allclose(loss, [[-1.0004, -1.0004, 0.0, -1.0004]], atol=1e-6)


def test_gspo_gradient_is_the_sequence_ratio_spread_over_tokens():
    # A = -1, s = 1.1052 > 1 + eps_high is the unclipped branch for A < 0: l = s, and
    # d s / d logp_t = s / |o| for every token.
    old = jnp.full((1, 3), -1.0)
    adv, mask = jnp.array([-1.0]), jnp.ones((1, 3))
    seq_loss = lambda lp: jaxgrpo.aggregate(losses.gspo(lp, old, adv, mask)[0], mask, "seq_mean_token_mean")[0]
    value, grad = jax.value_and_grad(seq_loss)(old + GSPO_LOG_RATIO)
    np.testing.assert_allclose(value, np.exp(0.1), atol=1e-6)
    np.testing.assert_allclose(grad, np.full((1, 3), np.exp(0.1) / 3), atol=1e-6)


@jax.jit
def gspo_and_gspo_token(logp, old, seq_adv, token_adv, c, mask):
    """Values, a weighted gradient with token advantages, and the sequence-mean gradients of both."""
    wide = dict(eps_low=10.0, eps_high=10.0)  # nothing clipped, so gradients are non-zero

    def seq_loss(fn):
        return lambda lp: jaxgrpo.aggregate(fn(lp, old, seq_adv, mask, **wide)[0], mask, "seq_mean_token_mean")[0]

    return dict(
        values=(losses.gspo_token(logp, old, seq_adv, mask)[0], losses.gspo(logp, old, seq_adv, mask)[0]),
        weighted_grad=jax.grad(lambda lp: (c * losses.gspo_token(lp, old, token_adv, mask, **wide)[0]).sum())(logp),
        seq_grads=(jax.grad(seq_loss(losses.gspo_token))(logp), jax.grad(seq_loss(losses.gspo))(logp)),
    )


def test_gspo_token_has_gspo_value_but_per_token_gradients():
    rng = np.random.default_rng(3)
    old = (rng.normal(size=(3, 4)) - 2.0).astype(np.float32)
    logp = old + (rng.normal(size=(3, 4)) * 0.05).astype(np.float32)
    mask = np.array([[1.0, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32)
    seq_adv = np.array([1.0, -2.0, 0.5], np.float32)
    token_adv, c = rng.normal(size=(2, 3, 4)).astype(np.float32)
    out = gspo_and_gspo_token(logp, old, seq_adv, token_adv, c, mask)
    # Value: the same as GSPO's.
    np.testing.assert_allclose(*out["values"], atol=1e-6)
    # With token-level advantages, token t's loss depends on logp_t only: d l_t/d logp_t = -A_t s_i,
    # a diagonal Jacobian diag(-A s); so the gradient of sum(c * l) is -A s c for any weights c.
    seq_ratio = np.exp(((logp - old) * mask).sum(1, keepdims=True) / mask.sum(1, keepdims=True))
    np.testing.assert_allclose(out["weighted_grad"], -token_adv * seq_ratio * c * mask, rtol=1e-5, atol=1e-6)
    # With sequence advantages, GSPO-token and GSPO have the same gradient of the sequence-mean loss.
    np.testing.assert_allclose(*out["seq_grads"], atol=1e-6)
    assert np.all(np.asarray(out["seq_grads"][0])[mask > 0] != 0)


# ---------------------------------------------------------------- CISPO and REINFORCE


@pytest.mark.parametrize(
    "ratio, hparams, weight",
    [
        (10.0, {}, 6.0),  # clipped at 1 + eps_high = 6, yet the gradient is not dropped
        (3.0, {}, 3.0),
        (0.1, {}, 0.1),  # unbounded below by default (MiniMax-M1)
        (0.1, dict(eps_low=0.2), 0.8),
        (1.5, dict(eps_high=0.28), 1.28),
    ],
)
def test_cispo_weight_is_a_clipped_constant(ratio, hparams, weight):
    # l = -sg[w] A logp: value -w A logp and gradient -w A, for A = 2.
    logp = one_token(ratio, 2.0)[0]
    value, grad = value_and_grad_of_token(losses.cispo, ratio, 2.0, **hparams)
    np.testing.assert_allclose(value, -weight * 2.0 * float(logp[0, 0]), rtol=1e-5)
    np.testing.assert_allclose(grad, -weight * 2.0, rtol=1e-5)


def test_cispo_clip_fractions():
    old = jnp.zeros((1, 4)) - 3.0
    logp = old + jnp.log(jnp.array([[10.0, 0.1, 1.0, 10.0]]))
    _, m = losses.cispo(logp, old, jnp.array([1.0]), jnp.array([[1.0, 1.0, 1.0, 0.0]]), eps_low=0.2)
    np.testing.assert_allclose([m["clip_fraction"], m["clip_fraction_low"]], [1 / 3, 1 / 3], atol=1e-6)


def test_reinforce_value_and_gradient_is_minus_advantage():
    rng = np.random.default_rng(4)
    logp, old = jnp.asarray(rng.normal(size=(2, 3, 4)) - 1.0, jnp.float32)
    adv = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
    mask = jnp.array([[1.0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    loss, _ = losses.reinforce(logp, old, adv, mask)
    np.testing.assert_allclose(loss, -adv * logp * mask, atol=1e-6)
    grad = jax.grad(lambda lp: losses.reinforce(lp, old, adv, mask)[0].sum())(logp)
    np.testing.assert_allclose(grad, -adv * mask, atol=1e-6)
    # old_logp only feeds the metrics: no gradient flows into it, and the loss ignores it.
    np.testing.assert_array_equal(losses.reinforce(logp, old + 5.0, adv, mask)[0], loss)


# ---------------------------------------------------------------- value loss


@pytest.mark.parametrize(
    "value, old, ret, loss, grad",
    [
        # |V - V_old| = 0.5 > 0.2: clip(V) = 1.2; unclipped 0.5*0.5^2 = .125 beats clipped 0.5*0.2^2 = .02.
        (1.5, 1.0, 1.0, 0.125, 0.5),
        # clipped (1.2 - 2)^2 / 2 = .32 beats unclipped (1.5 - 2)^2 / 2 = .125: constant in V, zero gradient.
        (1.5, 1.0, 2.0, 0.32, 0.0),
        (0.5, 1.0, 2.0, 1.125, -1.5),  # unclipped (0.5-2)^2/2 beats clipped (0.8-2)^2/2 = .72
        (1.1, 1.0, 2.0, 0.405, -0.9),  # inside the clip range
    ],
)
def test_clipped_value_loss_golden(value, old, ret, loss, grad):
    full = lambda x: jnp.full((1, 1), x, jnp.float32)
    f = lambda v: losses.clipped_value_loss(v, full(old), full(ret), jnp.ones((1, 1)))[0].sum()
    v, g = jax.value_and_grad(f)(full(value))
    np.testing.assert_allclose([float(v), float(g[0, 0])], [loss, grad], atol=1e-6)


def test_clipped_value_loss_metrics_and_mask():
    values = jnp.array([[1.5, 1.5, 9.0]])
    out, m = losses.clipped_value_loss(values, jnp.ones((1, 3)), jnp.array([[1.0, 2.0, 0.0]]), jnp.array([[1.0, 1, 0]]))
    np.testing.assert_allclose(out, [[0.125, 0.32, 0.0]], atol=1e-6)
    np.testing.assert_allclose(m["value_clip_fraction"], 0.5)


# ---------------------------------------------------------------- properties

SHAPE = (6, 8)


@st.composite
def padded_token_batches(draw):
    """`token_batches` plus advantages (per row or per token), zero-padded (masked) to 6 x 8."""
    logp, old, mask = map(np.asarray, draw(token_batches(max_rows=SHAPE[0], max_len=SHAPE[1])))
    n, t = logp.shape
    if draw(st.booleans()):
        adv = np.array(draw(st.lists(st.floats(-10, 10, width=32), min_size=n, max_size=n)), np.float32)
        adv = np.broadcast_to(adv[:, None], (n, t))
    else:
        adv = np.array(draw(st.lists(st.floats(-10, 10, width=32), min_size=n * t, max_size=n * t)), np.float32)
        adv = adv.reshape(n, t)
    pad = lambda x, v: np.pad(x, [(0, SHAPE[0] - n), (0, SHAPE[1] - t)], constant_values=v).astype(np.float32)
    # Padding holds garbage log-probs: masked entries must not matter.
    return pad(logp, -1e4), pad(old, 0.0), pad(adv, 3.0), pad(mask, 0.0)


@pytest.mark.parametrize("name", POLICY_LOSSES)
@PROPERTY
@given(batch=padded_token_batches(), seed=st.integers(0, 2**31 - 1))
def test_properties_on_random_batches(name, batch, seed):
    """Finite loss, metrics and gradient; masked tokens give 0 and no gradient; rows are independent."""
    logp, old, adv, mask = batch
    fn = jitted_value_and_grad_of_sum(jaxgrpo.get_loss(name))
    (_, (loss, metrics)), grad = fn(logp, old, adv, mask)
    loss, grad = np.asarray(loss), np.asarray(grad)
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad))
    assert all(np.isfinite(v) for v in metrics.values())
    np.testing.assert_array_equal(loss[mask == 0], 0.0)
    np.testing.assert_array_equal(grad[mask == 0], 0.0)
    # Other values in the masked entries change nothing.
    (_, (loss2, _)), grad2 = fn(np.where(mask > 0, logp, -3.0), np.where(mask > 0, old, -50.0), adv, mask)
    np.testing.assert_array_equal(loss2, loss)
    np.testing.assert_array_equal(grad2, grad)
    # Permuting rows permutes the per-token losses.
    perm = np.random.default_rng(seed).permutation(SHAPE[0])
    (_, (loss3, _)), _ = fn(logp[perm], old[perm], adv[perm], mask[perm])
    np.testing.assert_allclose(loss3, loss[perm], rtol=1e-6, atol=1e-6)


@functools.cache
def value_loss_and_grad():
    def total(values, old_values, returns, mask):
        loss, metrics = losses.clipped_value_loss(values, old_values, returns, mask)
        return loss.sum(), (loss, metrics)

    return jax.jit(jax.value_and_grad(total, has_aux=True))


@PROPERTY
@given(batch=padded_token_batches())
def test_value_loss_properties_on_random_batches(batch):
    """Finite; at least the unclipped 0.5 (V - R)^2; 0 and no gradient where masked."""
    values, old_values, returns, mask = batch
    (_, (loss, metrics)), grad = value_loss_and_grad()(values, old_values, returns, mask)
    loss, grad = np.asarray(loss), np.asarray(grad)
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad)) and np.isfinite(metrics["value_clip_fraction"])
    np.testing.assert_array_equal(loss[mask == 0], 0.0)
    np.testing.assert_array_equal(grad[mask == 0], 0.0)
    unclipped = 0.5 * np.square(values.astype(np.float64) - returns)
    assert np.all(loss[mask > 0] >= unclipped[mask > 0] * (1 - 1e-6) - 1e-6)


# ---------------------------------------------------------------- transformations


def random_batch(shape, seed=0):
    rng = np.random.default_rng(seed)
    old = jnp.asarray(rng.normal(size=shape) - 2.0, jnp.float32)
    logp = old + jnp.asarray(rng.normal(size=shape) * 0.3, jnp.float32)
    adv = jnp.asarray(rng.normal(size=shape[:-1]), jnp.float32)
    mask = jnp.asarray(rng.random(shape) > 0.3, jnp.float32)
    return dict(logp=logp, old_logp=old, advantages=adv, mask=mask)


@pytest.mark.parametrize(
    "name, hparams", [(n, {}) for n in POLICY_LOSSES] + [("ppo_clip", dict(eps_high=0.28, clip_ratio_c=3.0))]
)
def test_sharded_matches_unsharded(name, hparams, mesh_2x4):
    assert_sharded_matches(jaxgrpo.get_loss(name), random_batch((16, 8)), mesh_2x4, **hparams)


def test_value_loss_sharded_matches_unsharded(mesh_2x4):
    b = random_batch((16, 8))
    arrays = dict(values=b["logp"], old_values=b["old_logp"], returns=b["old_logp"] + 0.5, mask=b["mask"])
    assert_sharded_matches(losses.clipped_value_loss, arrays, mesh_2x4)


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_jit_and_vmap_over_a_batch_of_batches(name):
    fn = jaxgrpo.get_loss(name)
    b = random_batch((2, 16, 8), seed=5)
    batched, metrics = jax.jit(jax.vmap(fn))(b["logp"], b["old_logp"], b["advantages"], b["mask"])
    for k in range(2):
        loss, m = fn(b["logp"][k], b["old_logp"][k], b["advantages"][k], b["mask"][k])
        np.testing.assert_allclose(batched[k], loss, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(metrics["ratio_mean"][k], m["ratio_mean"], rtol=1e-6)


def test_bool_mask_equals_float_mask():
    b = random_batch((16, 8), seed=6)
    for name in POLICY_LOSSES:
        fn = jaxgrpo.get_loss(name)
        got = fn(b["logp"], b["old_logp"], b["advantages"], b["mask"] > 0)[0]
        np.testing.assert_array_equal(got, fn(**b)[0])


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_bad_inputs_name_the_argument_and_expected_shape(name):
    fn = jaxgrpo.get_loss(name)
    lp, adv, mask = jnp.zeros((2, 3)), jnp.zeros(2), jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"old_logp has shape \(2, 4\) but logp has shape \(2, 3\); they must match"):
        fn(lp, jnp.zeros((2, 4)), adv, mask)
    with pytest.raises(ValueError, match=r"mask has shape \(3, 2\) but logp has shape \(2, 3\)"):
        fn(lp, lp, adv, jnp.ones((3, 2)))
    with pytest.raises(ValueError, match=r"advantages has 3 rows but logp has 2; expected \[N\]=\[2\] or \[N, T\]=\[2, 3\]"):
        fn(lp, lp, jnp.zeros(3), mask)
    with pytest.raises(ValueError, match=r"advantages must have shape \[N\]=\[2\] or \[N, T\]=\[2, 3\], got \(2, 4\)"):
        fn(lp, lp, jnp.zeros((2, 4)), mask)
    with pytest.raises(ValueError, match=r"logp must have shape \[N, T\], got shape \(3,\)"):
        fn(jnp.zeros(3), jnp.zeros(3), adv, jnp.ones(3))
    with pytest.raises(TypeError, match="logp must be a floating-point array, got dtype int32"):
        fn(jnp.zeros((2, 3), jnp.int32), lp, adv, mask)
    with pytest.raises(TypeError, match="advantages must be a floating-point array, got dtype int32"):
        fn(lp, lp, jnp.zeros(2, jnp.int32), mask)


def test_bad_hyper_parameters_and_names():
    lp, adv, mask = jnp.zeros((2, 3)), jnp.zeros(2), jnp.ones((2, 3))
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        losses.ppo_clip(lp, lp, adv, mask, clip_ratio_c=0.5)
    with pytest.raises(ValueError, match=r"returns has shape \(2, 2\) but values has shape \(2, 3\)"):
        losses.clipped_value_loss(lp, lp, jnp.zeros((2, 2)), mask)
    with pytest.raises(KeyError, match=r"no loss kernel named 'ppo'; valid names: .*ppo_clip"):
        jaxgrpo.get_loss("ppo")
