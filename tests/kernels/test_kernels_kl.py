"""KL estimators k1, k2, k3, the straight-through k1+/k3+, and the importance-corrected k3.

Golden value: METHODS.md §2 item 1, pi = 0.5, pi_ref = 0.25 -> k3 = 0.1931.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from tests.support.kernel_checks import assert_sharded_matches, token_batches

import jaxgrpo
from jaxgrpo.kernels.kl import KL_KINDS, kl_penalty

PROPERTY = settings(max_examples=25, deadline=None)
LOGP, REF = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
LOG2 = np.log(2.0)


def test_kinds_are_the_documented_ones():
    assert KL_KINDS == ("k1", "k2", "k3", "abs", "k1+", "k3+", "abs+", "k3_unbiased") == jaxgrpo.KL_KINDS
    assert sorted(i.name for i in jaxgrpo.list_kernels("kl")) == sorted(KL_KINDS)


@pytest.mark.parametrize(
    "kind, value",
    [
        ("k1", LOG2),  # log pi - log pi_ref = log 2
        ("k2", 0.5 * LOG2**2),  # 0.2402
        ("k3", 0.5 + LOG2 - 1.0),  # pi_ref/pi - log(pi_ref/pi) - 1 = 0.1931
        ("k1+", LOG2),
        ("k3+", 0.5 + LOG2 - 1.0),
        ("abs", LOG2),  # |log pi - log pi_ref| = log 2
        ("abs+", LOG2),
    ],
)
def test_golden_values(kind, value):
    np.testing.assert_allclose(kl_penalty(LOGP, REF, kind), [[value]], atol=1e-6)
    np.testing.assert_allclose(jaxgrpo.get("kl", kind)(LOGP, REF), [[value]], atol=1e-6)


def test_k3_golden_from_methods():
    np.testing.assert_allclose(kl_penalty(LOGP, REF, "k3"), [[0.1931]], atol=1e-4)


def test_k3_unbiased_weights_k3_by_the_ratio():
    # pi_old = 0.25 -> pi / pi_old = 2 -> 2 * 0.1931; with pi_old = pi it is k3.
    k3 = 0.5 + LOG2 - 1.0
    np.testing.assert_allclose(kl_penalty(LOGP, REF, "k3_unbiased", old_logp=REF), [[2 * k3]], atol=1e-6)
    np.testing.assert_allclose(kl_penalty(LOGP, REF, "k3_unbiased", old_logp=LOGP), [[k3]], atol=1e-6)
    np.testing.assert_allclose(jaxgrpo.get("kl", "k3_unbiased")(LOGP, REF, old_logp=REF), [[2 * k3]], atol=1e-6)


def test_clamp_bounds_value_and_zeroes_the_gradient():
    logp = jnp.array([[-1.0, -20.0, -1.0]])
    ref = jnp.array([[-16.0, -1.0, -1.5]])  # k1 = [15, -19, 0.5]
    np.testing.assert_allclose(kl_penalty(logp, ref, "k1", clamp=10.0), [[10.0, -10.0, 0.5]], atol=1e-6)
    grad = jax.grad(lambda lp: kl_penalty(lp, ref, "k1", clamp=10.0).sum())(logp)
    np.testing.assert_allclose(grad, [[0.0, 0.0, 1.0]], atol=1e-6)
    # k3 of x = log pi_ref - log pi = 19 is about 1.8e8; verl clamps it at 10.
    np.testing.assert_allclose(kl_penalty(logp, ref, "k3", clamp=10.0)[0, 1], 10.0)


def test_large_log_ratios_stay_finite_with_finite_gradients():
    # Garbage log-probs at a masked position: k3's exp would overflow without the +-20 clamp,
    # and inf * 0 in the backward pass would turn the whole gradient into NaN.
    logp = jnp.array([[-1.0, -1e4]])
    ref = jnp.array([[-1.2, -0.5]])
    mask = jnp.array([[1.0, 0.0]])
    for kind in KL_KINDS:
        loss = lambda lp: jaxgrpo.aggregate(kl_penalty(lp, ref, kind, old_logp=lp), mask)[0]
        value, grad = jax.value_and_grad(loss)(logp)
        assert np.isfinite(value) and np.all(np.isfinite(grad)), kind
        assert np.all(np.isfinite(kl_penalty(logp, ref, kind, old_logp=ref))), kind


# ---------------------------------------------------------------- gradients


def grad_of(kind, logp, ref, **kw):
    return jax.grad(lambda lp: kl_penalty(lp, ref, kind, **kw).sum())(logp)


def test_gradients_match_the_math():
    rng = np.random.default_rng(0)
    logp = jnp.asarray(rng.normal(size=(3, 4)) - 2.0, jnp.float32)
    ref = jnp.asarray(rng.normal(size=(3, 4)) - 2.0, jnp.float32)
    delta = logp - ref
    np.testing.assert_allclose(grad_of("k1", logp, ref), np.ones((3, 4)), atol=1e-6)
    np.testing.assert_allclose(grad_of("k2", logp, ref), delta, atol=1e-5)
    # d/dlogp [pi_ref/pi - log(pi_ref/pi) - 1] = 1 - pi_ref/pi.
    np.testing.assert_allclose(grad_of("k3", logp, ref), 1 - np.exp(-delta), rtol=1e-5, atol=1e-5)
    # |x|' = sign(log pi - log pi_ref).
    np.testing.assert_allclose(grad_of("abs", logp, ref), np.sign(delta), atol=1e-6)
    # Straight-through: the value of k1 / k3 / abs, the gradient of k2.
    for kind in ("k1+", "k3+", "abs+"):
        np.testing.assert_allclose(grad_of(kind, logp, ref), delta, atol=1e-5)
    # (pi/pi_old) k3 at pi_old = pi: its gradient is log pi - log pi_ref, the KL's per-sample gradient.
    np.testing.assert_allclose(
        grad_of("k3_unbiased", logp, ref, old_logp=jax.lax.stop_gradient(logp)), delta, rtol=1e-5, atol=1e-5
    )


def test_straight_through_values_equal_the_plain_estimators():
    rng = np.random.default_rng(1)
    logp, ref = jnp.asarray(rng.normal(size=(2, 3, 5)) - 2.0, jnp.float32)
    np.testing.assert_allclose(kl_penalty(logp, ref, "k1+"), kl_penalty(logp, ref, "k1"), atol=1e-6)
    np.testing.assert_allclose(kl_penalty(logp, ref, "k3+"), kl_penalty(logp, ref, "k3"), atol=1e-6)
    np.testing.assert_allclose(kl_penalty(logp, ref, "abs+"), kl_penalty(logp, ref, "abs"), atol=1e-6)


def _finite_difference_of_k2(logp, ref, h=1e-2):
    """d/dlogp of k2 = (logp - ref)^2 / 2 by central differences, in float64 (exact for a quadratic)."""
    logp, ref = np.asarray(logp, np.float64), np.asarray(ref, np.float64)
    k2 = lambda lp: 0.5 * (lp - ref) ** 2
    return (k2(logp + h) - k2(logp - h)) / (2 * h)


@pytest.mark.parametrize("kind", ["k1+", "k3+", "abs+"])
def test_clamped_straight_through_keeps_the_gradient_of_k2_above_the_clamp(kind):
    # x = log pi_ref - log pi = [3, 0.5, -2.5, 19]: k3 = e^x - x - 1 = [16.09, 0.149, 1.582, 1.8e8],
    # so with clamp=10 tokens 0 and 3 are above the clamp. Their value is clamped (10), yet the
    # gradient is k2's, log pi - log pi_ref = [-3, -0.5, 2.5, -19], at every token. Before the fix
    # the clamp came after the straight-through step and gave those tokens a zero gradient.
    logp = jnp.array([[-4.0, -1.5, -0.5, -20.0]])
    ref = jnp.array([[-1.0, -1.0, -3.0, -1.0]])
    expected_grad = _finite_difference_of_k2(logp, ref)
    np.testing.assert_allclose(expected_grad, [[-3.0, -0.5, 2.5, -19.0]], atol=1e-9)
    np.testing.assert_allclose(grad_of(kind, logp, ref, clamp=10.0), expected_grad, atol=1e-5)
    plain = {"k1+": "k1", "k3+": "k3", "abs+": "abs"}[kind]
    np.testing.assert_allclose(kl_penalty(logp, ref, kind, clamp=10.0), kl_penalty(logp, ref, plain, clamp=10.0),
                               rtol=1e-6)
    if kind == "k3+":
        np.testing.assert_allclose(kl_penalty(logp, ref, kind, clamp=10.0),
                                   [[10.0, np.exp(0.5) - 1.5, np.exp(-2.5) + 1.5, 10.0]], rtol=1e-5)


# ---------------------------------------------------------------- properties

SHAPE = (6, 8)


@functools.cache
def jitted_value_and_grad(kind):
    def total(logp, ref, old):
        kl = kl_penalty(logp, ref, kind, old_logp=old)
        return kl.sum(), kl

    return jax.jit(jax.value_and_grad(total, has_aux=True))


@pytest.mark.parametrize("kind", KL_KINDS)
@PROPERTY
@given(batch=token_batches(max_rows=SHAPE[0], max_len=SHAPE[1]))
def test_properties_on_random_log_probs(kind, batch):
    """Finite value and gradient, without clamp, even for garbage padding; k2, k3, k3+, k3_unbiased >= 0."""
    logp, ref, _ = (np.asarray(x) for x in batch)
    n, t = logp.shape
    pad = lambda x, c: np.pad(x, [(0, SHAPE[0] - n), (0, SHAPE[1] - t)], constant_values=c)
    logp, ref = pad(logp, -1e4), pad(ref, 0.0)
    old = np.roll(logp, 1, axis=1)
    (_, kl), grad = jitted_value_and_grad(kind)(logp, ref, old)
    kl = np.asarray(kl)
    assert np.all(np.isfinite(kl)) and np.all(np.isfinite(grad))
    if kind in ("k2", "k3", "k3+", "abs", "abs+", "k3_unbiased"):
        assert np.all(kl >= -1e-6)  # k3+ is k2 + sg(k3 - k2): exact up to rounding


# ---------------------------------------------------------------- transformations


def random_pair(shape, seed=0):
    rng = np.random.default_rng(seed)
    logp = jnp.asarray(rng.normal(size=shape) - 2.0, jnp.float32)
    return logp, logp + jnp.asarray(rng.normal(size=shape) * 0.5, jnp.float32)


@pytest.mark.parametrize("kind", KL_KINDS)
def test_sharded_matches_unsharded(kind, mesh_2x4):
    logp, ref = random_pair((16, 8))
    arrays = dict(logp=logp, ref_logp=ref, old_logp=logp - 0.1)
    assert_sharded_matches(kl_penalty, arrays, mesh_2x4, kind=kind, clamp=10.0)


@pytest.mark.parametrize("kind", ("k3", "k3+", "k3_unbiased"))
def test_jit_and_vmap_over_a_batch_of_batches(kind):
    logp, ref = random_pair((2, 16, 8), seed=1)
    fn = jaxgrpo.get("kl", kind)
    batched = jax.jit(jax.vmap(lambda a, b, c: fn(a, b, old_logp=c)))(logp, ref, logp * 0.9)
    for k in range(2):
        np.testing.assert_allclose(batched[k], fn(logp[k], ref[k], old_logp=logp[k] * 0.9), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- bad input


def test_bad_inputs():
    lp = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"unknown KL kind 'k4'; valid kinds: k1, k2, k3, abs, k1\+, k3\+, abs\+, k3_unbiased"):
        kl_penalty(lp, lp, "k4")
    with pytest.raises(ValueError, match="kind='k3_unbiased' needs old_logp"):
        kl_penalty(lp, lp, "k3_unbiased")
    with pytest.raises(ValueError, match=r"ref_logp has shape \(2, 4\) but logp has shape \(2, 3\); they must match"):
        kl_penalty(lp, jnp.zeros((2, 4)), "k3")
    with pytest.raises(ValueError, match=r"old_logp has shape \(3,\) but logp has shape \(2, 3\)"):
        kl_penalty(lp, lp, "k3_unbiased", old_logp=jnp.zeros(3))
    with pytest.raises(ValueError, match=r"logp must have shape \[N, T\], got shape \(3,\)"):
        kl_penalty(jnp.zeros(3), jnp.zeros(3), "k1")
    with pytest.raises(TypeError, match="ref_logp must be a floating-point array, got dtype int32"):
        kl_penalty(lp, jnp.zeros((2, 3), jnp.int32), "k1")
    with pytest.raises(KeyError, match=r"no kl kernel named 'k5'; valid names: abs, abs\+, k1, k1\+, k2, k3, k3\+, k3_unbiased"):
        jaxgrpo.get("kl", "k5")


def test_k3_is_accurate_near_zero_and_never_negative():
    """exp(x) - x - 1 in float32 is rounding noise for |x| < ~1e-3 (policy close to the reference, as at
    the start of training); expm1(x) - x is right to about ulp(x), and its gradient expm1(x) too."""
    x = np.array([[1e-4, -1e-4, 1e-3, -2e-3, 5.96e-8, 0.0]], np.float32)
    x64 = x.astype(np.float64)
    grad = jax.grad(lambda r: kl_penalty(jnp.zeros_like(r), r, "k3").sum())(jnp.asarray(x))
    per_token = np.asarray(kl_penalty(jnp.zeros_like(jnp.asarray(x)), jnp.asarray(x), "k3"))
    np.testing.assert_allclose(per_token, np.expm1(x64) - x64, rtol=1e-3, atol=2e-11)  # ~ulp(x); exp(x) - x - 1 was off by up to 1.2e-7
    np.testing.assert_allclose(np.asarray(grad), np.expm1(x64), rtol=1e-6)
    # Found by hypothesis: a tiny log-ratio times the clamped importance weight exp(20) of k3_unbiased
    # was -28.9 with the cancelling formula.
    unbiased = kl_penalty(jnp.array([[-5.9604645e-08]]), jnp.zeros((1, 1)), "k3_unbiased", old_logp=jnp.array([[-1e4]]))
    assert float(unbiased[0, 0]) >= 0.0
