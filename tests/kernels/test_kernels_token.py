"""Token-level kernels: GAE, discounted returns, REINFORCE++ returns, masked whitening.

Golden value: METHODS.md §2 item 7, r = [0,0,1], V = [.5,.6,.7], gamma = 1,
lambda = .95 -> A = [0.46575, 0.385, 0.3]; item 6 for the whitened returns.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.kernel_checks import assert_sharded_matches

import jaxgrpo
from jaxgrpo.kernels.credit import discounted_returns, gae, masked_whiten, reinforce_pp_returns

PROPERTY = settings(max_examples=25, deadline=None)


def rows(*xs):
    return jnp.asarray(xs, jnp.float32).reshape(1, -1)


# ---------------------------------------------------------------- GAE


def test_gae_golden():
    adv, ret = gae(rows(0, 0, 1), rows(0.5, 0.6, 0.7), rows(1, 1, 1), gamma=1.0, lam=0.95)
    np.testing.assert_allclose(adv, [[0.46575, 0.385, 0.3]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0.96575, 0.985, 1.0]], atol=1e-6)  # returns = A + V
    assert jaxgrpo.gae is gae and jaxgrpo.get("token_advantage", "gae") is gae


def test_gae_skips_masked_tokens():
    # The same sequence with a masked token inside, a masked prefix and padding: masked
    # positions neither receive credit nor pass it on (their r and V are ignored).
    r = rows(5, 0, 7, 0, 1, 3)
    v = rows(9, 0.5, 9, 0.6, 0.7, 9)
    m = rows(0, 1, 0, 1, 1, 0)
    adv, ret = gae(r, v, m, gamma=1.0, lam=0.95)
    np.testing.assert_allclose(adv, [[0, 0.46575, 0, 0.385, 0.3, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0, 0.96575, 0, 0.985, 1.0, 0]], atol=1e-6)


def test_gae_with_lambda_one_and_zero_values_is_the_discounted_return():
    r, m = rows(0, 0, 1), rows(1, 1, 1)
    adv, _ = gae(r, jnp.zeros_like(r), m, gamma=0.5, lam=1.0)
    np.testing.assert_allclose(adv, [[0.25, 0.5, 1.0]], atol=1e-6)
    np.testing.assert_allclose(adv, discounted_returns(r, m, gamma=0.5), atol=1e-6)


def test_gae_jacobians():
    # A_t = sum_l (g lam)^l delta_{t+l}, delta_j = r_j + g V_{j+1} - V_j, so
    # dA_t/dr_k = (g lam)^(k-t) and dA_t/dV_k = g (g lam)^(k-t-1) (1 - lam) for k > t, -1 for k = t.
    g, lam, t = 0.9, 0.8, 4
    r = jnp.asarray(np.random.default_rng(0).normal(size=(1, t)), jnp.float32)
    v = jnp.asarray(np.random.default_rng(1).normal(size=(1, t)), jnp.float32)
    m = jnp.ones((1, t))
    k = np.arange(t)
    lag = k[None, :] - k[:, None]
    d_r = np.where(lag >= 0, (g * lam) ** np.maximum(lag, 0), 0.0)
    d_v = np.where(lag > 0, g * (g * lam) ** np.maximum(lag - 1, 0) * (1 - lam), 0.0) - np.eye(t)
    jac_r = jax.jacobian(lambda x: gae(x, v, m, gamma=g, lam=lam)[0])(r)[0, :, 0, :]
    jac_v = jax.jacobian(lambda x: gae(r, x, m, gamma=g, lam=lam)[0])(v)[0, :, 0, :]
    np.testing.assert_allclose(jac_r, d_r, atol=1e-6)
    np.testing.assert_allclose(jac_v, d_v, atol=1e-6)


# ---------------------------------------------------------------- returns and whitening


def test_discounted_returns_golden_and_gradient():
    r, m = rows(1, 99, 2, 3), rows(1, 0, 1, 1)
    # Masked token skipped: G = [1 + .5*2 + .25*3, 0, 2 + .5*3, 3].
    np.testing.assert_allclose(discounted_returns(r, m, gamma=0.5), [[2.75, 0, 3.5, 3.0]], atol=1e-6)
    jac = jax.jacobian(lambda x: discounted_returns(x, m, gamma=0.5))(r)[0, :, 0, :]
    expected = np.array([[1, 0, 0.5, 0.25], [0, 0, 0, 0], [0, 0, 1, 0.5], [0, 0, 0, 1]])
    np.testing.assert_allclose(jac, expected, atol=1e-6)


def test_reinforce_pp_returns_golden():
    # Returns [[1,1,1],[0,0,0]] (gamma = 1), whitened over the 6 tokens: mean .5, unbiased std sqrt(.3).
    r = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    z = 0.5 / np.sqrt(0.3)
    np.testing.assert_allclose(reinforce_pp_returns(r, jnp.ones((2, 3))), [[z] * 3, [-z] * 3], atol=1e-5)


def test_masked_whiten_golden():
    x, m = rows(1, 3, 5, 100), rows(1, 1, 1, 0)  # mean 3, unbiased std 2; the 100 is masked
    np.testing.assert_allclose(masked_whiten(x, m), [[-1, 0, 1, 0]], atol=1e-6)
    np.testing.assert_allclose(masked_whiten(x, m, shift_mean=False), [[2, 3, 4, 0]], atol=1e-6)


def test_masked_whiten_gradient_of_the_sum_is_zero():
    # Whitened values always sum to zero, so d(sum)/dx = 0; masked entries get no gradient at all.
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
    m = jnp.asarray(rng.random((3, 5)) > 0.3, jnp.float32)
    c = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
    grads = jax.jit(jax.vmap(jax.grad(lambda y, w: (w * masked_whiten(y, m)).sum()), in_axes=(None, 0)))(
        x, jnp.stack([jnp.ones_like(c), c])
    )
    np.testing.assert_allclose(grads[0], 0.0, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(grads[1])[np.asarray(m) == 0], 0.0)
    assert np.all(np.asarray(grads[1])[np.asarray(m) > 0] != 0)


# ---------------------------------------------------------------- properties

SHAPE = (6, 8)


@st.composite
def token_arrays(draw):
    """(rewards, values, mask) f32[6, 8] of a random n x t batch, padded (masked) with garbage."""
    n, t = draw(st.integers(1, SHAPE[0])), draw(st.integers(1, SHAPE[1]))
    floats = lambda lo, hi: st.lists(st.floats(lo, hi, width=32), min_size=n * t, max_size=n * t)
    r = np.array(draw(floats(-10, 10)), np.float32).reshape(n, t)
    v = np.array(draw(floats(-10, 10)), np.float32).reshape(n, t)
    m = np.array(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n * t, max_size=n * t)), np.float32)
    pad = lambda x, c: np.pad(x, [(0, SHAPE[0] - n), (0, SHAPE[1] - t)], constant_values=c)
    return pad(r, 1e4), pad(v, -1e4), pad(m.reshape(n, t), 0.0)


KERNELS = {
    "gae": lambda r, v, m: gae(r, v, m, gamma=0.99, lam=0.95),
    "discounted_returns": lambda r, v, m: discounted_returns(r, m, gamma=0.99),
    "reinforce_pp_returns": lambda r, v, m: reinforce_pp_returns(r, m, gamma=0.99),
    "masked_whiten": lambda r, v, m: masked_whiten(r, m),
}


@functools.cache
def jitted(name):
    return jax.jit(KERNELS[name])


@pytest.mark.parametrize("name", sorted(KERNELS))
@PROPERTY
@given(batch=token_arrays(), seed=st.integers(0, 2**31 - 1))
def test_properties_on_random_batches(name, batch, seed):
    """Finite; 0 where masked; masked inputs change nothing; permuting rows permutes the output."""
    r, v, m = batch
    fn = jitted(name)
    out = fn(r, v, m)
    for x in jax.tree.leaves(out):
        assert np.all(np.isfinite(x))
        np.testing.assert_array_equal(np.asarray(x)[m == 0], 0.0)
    other = fn(np.where(m > 0, r, -3.0), np.where(m > 0, v, 2.0), m)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), out, other)
    perm = np.random.default_rng(seed).permutation(SHAPE[0])
    permuted = fn(r[perm], v[perm], m[perm])
    # Whitening sums over the batch in another order: equal up to rounding.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(b, np.asarray(a)[perm], rtol=1e-5, atol=1e-5), out, permuted)


# ---------------------------------------------------------------- transformations


def random_arrays(shape, seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        token_rewards=jnp.asarray(rng.normal(size=shape), jnp.float32),
        values=jnp.asarray(rng.normal(size=shape), jnp.float32),
        mask=jnp.asarray(rng.random(shape) > 0.2, jnp.float32),
    )


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_sharded_matches_unsharded(name, mesh_2x4):
    a = random_arrays((16, 8))
    fn = lambda token_rewards, values, mask: KERNELS[name](token_rewards, values, mask)
    assert_sharded_matches(fn, a, mesh_2x4)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_jit_and_vmap_over_a_batch_of_batches(name):
    a = random_arrays((2, 16, 8), seed=1)
    r, v, m = a["token_rewards"], a["values"], a["mask"]
    batched = jax.jit(jax.vmap(KERNELS[name]))(r, v, m)
    for k in range(2):
        expected = KERNELS[name](r[k], v[k], m[k])
        jax.tree.map(lambda b, e: np.testing.assert_allclose(b[k], e, rtol=1e-6, atol=1e-6), batched, expected)


# ---------------------------------------------------------------- bad input


def test_bad_inputs():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"values has shape \(2, 4\) but token_rewards has shape \(2, 3\)"):
        gae(x, jnp.zeros((2, 4)), x)
    with pytest.raises(ValueError, match=r"mask has shape \(3,\) but token_rewards has shape \(2, 3\)"):
        discounted_returns(x, jnp.ones(3))
    with pytest.raises(ValueError, match=r"token_rewards must have shape \[N, T\], got shape \(3,\)"):
        reinforce_pp_returns(jnp.zeros(3), jnp.ones(3))
    with pytest.raises(TypeError, match="x must be a floating-point array, got dtype int32"):
        masked_whiten(jnp.zeros((2, 3), jnp.int32), x)
    with pytest.raises(KeyError, match=r"no token_advantage kernel named 'gea'; valid names: .*gae"):
        jaxgrpo.get("token_advantage", "gea")
