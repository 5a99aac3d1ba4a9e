"""Aggregation modes, their (total, denominator) parts, and exact micro-batching.

Golden values: METHODS.md §2 items 2 and 3 (sequence lengths 1 and 3).
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
from jaxgrpo import AGGREGATION_MODES, LossParts, aggregate, aggregation_denominator, aggregation_parts

PROPERTY = settings(max_examples=25, deadline=None)

# Two sequences of lengths 1 and 3 (T = 4), a fully masked padding row, per-token losses a = 2 and b = 5.
MASK = jnp.array([[1.0, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
LOSS = jnp.array([[2.0, 7, 7, 7], [5, 5, 5, 7], [7, 7, 7, 7]])  # the 7s are masked out


def test_mode_names():
    assert AGGREGATION_MODES == (
        "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "token_sum"
    )


@pytest.mark.parametrize(
    "mode, kw, expected",
    [
        ("token_mean", {}, (2 + 3 * 5) / 4),  # DAPO: (a + 3b) / 4
        ("seq_mean_token_mean", {}, (2 + 5) / 2),  # GRPO: mean of the sequence means
        ("seq_mean_token_sum", {}, (2 + 15) / 2),
        ("seq_mean_token_sum_norm", {}, (2 + 15) / (2 * 4)),  # Dr. GRPO: / (N * L_max), L_max = T
        ("seq_mean_token_sum_norm", dict(max_len=10), (2 + 15) / (2 * 10)),
        ("seq_mean_token_sum_norm", dict(max_len=np.int64(10)), (2 + 15) / (2 * 10)),  # e.g. from a numpy config
        ("token_sum", {}, 2 + 3 * 5),  # verl's token-sum: the plain sum over every token of every row
    ],
)
def test_golden_values(mode, kw, expected):
    loss, parts = aggregate(LOSS, MASK, mode, **kw)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    np.testing.assert_allclose(parts.value, expected, rtol=1e-6)
    # The fully masked padding row is not a sequence: dropping it changes nothing.
    np.testing.assert_allclose(aggregate(LOSS[:2], MASK[:2], mode, **kw)[0], expected, rtol=1e-6)


def test_dr_grpo_and_grpo_goldens_from_methods():
    # Lengths 1 and 3 with per-token loss 1: Dr. GRPO gives (1 + 3) / (2 L_max), GRPO (1 + 1) / 2.
    ones, max_len = jnp.ones((2, 5)), 5
    mask = jnp.array([[1.0, 0, 0, 0, 0], [1, 1, 1, 0, 0]])
    np.testing.assert_allclose(aggregate(ones, mask, "seq_mean_token_sum_norm", max_len=max_len)[0], 4 / (2 * max_len))
    np.testing.assert_allclose(aggregate(ones, mask, "seq_mean_token_mean")[0], 1.0)


def test_gradients_are_the_mode_weights():
    # d loss / d l_{i,t} = m / sum m; m / (|o_i| N_seq); m / N_seq; m / (N_seq L).
    lengths = MASK.sum(1, keepdims=True)
    expected = {
        "token_mean": MASK / 4,
        "seq_mean_token_mean": MASK / jnp.maximum(lengths, 1) / 2,
        "seq_mean_token_sum": MASK / 2,
        "seq_mean_token_sum_norm": MASK / (2 * 4),
        "token_sum": MASK,
    }
    for mode, weights in expected.items():
        grad = jax.grad(lambda l: aggregate(l, MASK, mode)[0])(LOSS)
        np.testing.assert_allclose(grad, weights, atol=1e-7, err_msg=mode)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_empty_batch_gives_zero_not_nan(mode):
    loss, parts = aggregate(LOSS, jnp.zeros_like(MASK), mode)
    assert float(loss) == 0.0 and float(parts.value) == 0.0
    assert float(parts.denominator) == (1.0 if mode == "token_sum" else 0.0)  # token_sum's is the constant 1
    grad = jax.grad(lambda l: aggregate(l, jnp.zeros_like(MASK), mode)[0])(LOSS)
    np.testing.assert_array_equal(grad, 0.0)


def test_loss_parts_add_up():
    a, b = LossParts(jnp.float32(3.0), jnp.float32(2.0)), LossParts(jnp.float32(5.0), jnp.float32(6.0))
    total = a + b
    assert isinstance(total, LossParts)
    np.testing.assert_allclose([total.total, total.denominator, total.value], [8.0, 8.0, 1.0])


def test_bool_mask_and_denominator_helper():
    for mode in AGGREGATION_MODES:
        np.testing.assert_array_equal(aggregate(LOSS, MASK > 0, mode)[0], aggregate(LOSS, MASK, mode)[0])
        np.testing.assert_array_equal(aggregation_denominator(MASK, mode), aggregation_parts(LOSS, MASK, mode).denominator)
    np.testing.assert_allclose([aggregation_denominator(MASK, m) for m in AGGREGATION_MODES], [4, 2, 2, 8, 1])


# ---------------------------------------------------------------- micro-batch invariance


def micro_batch_case(seed=0):
    rng = np.random.default_rng(seed)
    n, t = 8, 6
    old = jnp.asarray(rng.normal(size=(n, t)) - 2.0, jnp.float32)
    logp = old + jnp.asarray(rng.normal(size=(n, t)) * 0.3, jnp.float32)  # some ratios clipped
    adv = jnp.asarray(rng.normal(size=n), jnp.float32)
    lengths = np.array([6, 1, 0, 3, 6, 2, 0, 5])  # uneven, with fully masked rows
    mask = jnp.asarray(np.arange(t)[None, :] < lengths[:, None], jnp.float32)
    return logp, old, adv, mask


def ppo_loss(logp, old, adv, mask, mode, denominator=None):
    per_token, _ = jaxgrpo.get_loss("ppo_clip")(logp, old, adv, mask, eps_high=0.28)
    return aggregate(per_token, mask, mode, max_len=8, denominator=denominator)


@functools.partial(jax.jit, static_argnames="mode")
def full_and_accumulated(logp, old, adv, mask, mode):
    """The full batch's (loss, parts, grad), and for 1, 2 and 4 micro-batches the same accumulated.

    Each micro-batch is its own loss and gradient computation, as in gradient
    accumulation; one jit around them all only saves compilations.
    """
    value_and_grad = jax.value_and_grad(ppo_loss, has_aux=True)
    (loss, parts), grad = value_and_grad(logp, old, adv, mask, mode)
    denominator = aggregation_denominator(mask, mode, max_len=8)  # from the full batch, before accumulating
    accumulated = {}
    for k in (1, 2, 4):
        total_loss, total_parts, grads = 0.0, None, []
        for rows in np.split(np.arange(logp.shape[0]), k):
            (mb_loss, mb_parts), mb_grad = value_and_grad(logp[rows], old[rows], adv[rows], mask[rows], mode, denominator)
            total_loss += mb_loss
            total_parts = mb_parts if total_parts is None else total_parts + mb_parts
            grads.append(mb_grad)
        accumulated[k] = (total_loss, total_parts, jnp.concatenate(grads))
    return (loss, parts, grad), accumulated


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_micro_batches_give_the_full_batch_loss_and_gradient(mode):
    (full_loss, full_parts, full_grad), accumulated = full_and_accumulated(*micro_batch_case(), mode)
    assert np.any(np.asarray(full_grad) == 0) and np.any(np.asarray(full_grad) != 0)  # some tokens clipped
    for k, (loss, parts, grad) in accumulated.items():
        np.testing.assert_allclose(loss, full_loss, rtol=1e-6, atol=1e-6, err_msg=f"{k} micro-batches")
        np.testing.assert_allclose(grad, full_grad, rtol=1e-6, atol=1e-6, err_msg=f"{k} micro-batches")
        # The LossParts of the micro-batches add up to the full batch's.
        np.testing.assert_allclose(parts.total, full_parts.total, rtol=1e-6, atol=1e-6)
        if mode == "token_sum":
            # A constant denominator (1 per batch, as Dr. GRPO's L_max is per sequence): the totals add up,
            # and the full batch's denominator is the same 1, which every micro-batch was divided by.
            np.testing.assert_array_equal(full_parts.denominator, 1.0)
            np.testing.assert_allclose(parts.total / full_parts.denominator, full_loss, rtol=1e-6, atol=1e-6)
            continue
        np.testing.assert_array_equal(parts.denominator, full_parts.denominator)
        np.testing.assert_allclose(parts.value, full_loss, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- properties

SHAPE = (6, 8)


@st.composite
def loss_and_mask(draw):
    n, t = draw(st.integers(1, SHAPE[0])), draw(st.integers(1, SHAPE[1]))
    loss = np.array(draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=n * t, max_size=n * t)), np.float32)
    mask = np.array(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n * t, max_size=n * t)), np.float32)
    pad = lambda x, c: np.pad(x.reshape(n, t), [(0, SHAPE[0] - n), (0, SHAPE[1] - t)], constant_values=c)
    return pad(loss, np.nan), pad(mask, 0.0)  # NaN padding: masked entries must never leak


@jax.jit
def all_modes(loss, mask):
    return {mode: jax.value_and_grad(lambda l: aggregate(l, mask, mode)[0])(loss) for mode in AGGREGATION_MODES}


@PROPERTY
@given(batch=loss_and_mask())
def test_properties_on_random_losses(batch):
    """Finite value and gradient (even with NaN in masked entries); values match a numpy reference."""
    loss, mask = batch
    out = all_modes(loss, mask)
    masked = np.where(mask > 0, loss, 0.0).astype(np.float64)
    lengths, n_seq = mask.sum(1), (mask.sum(1) > 0).sum()
    reference = {
        "token_mean": masked.sum() / max(mask.sum(), 1),
        "seq_mean_token_mean": (masked.sum(1) / np.maximum(lengths, 1)).sum() / max(n_seq, 1),
        "seq_mean_token_sum": masked.sum() / max(n_seq, 1),
        "seq_mean_token_sum_norm": masked.sum() / max(n_seq * SHAPE[1], 1),
        "token_sum": masked.sum(),
    }
    for mode, (value, grad) in out.items():
        assert np.isfinite(value) and np.all(np.isfinite(grad)), mode
        np.testing.assert_array_equal(np.asarray(grad)[mask == 0], 0.0)
        np.testing.assert_allclose(value, reference[mode], rtol=1e-5, atol=1e-3, err_msg=mode)


# ---------------------------------------------------------------- transformations


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_sharded_matches_unsharded(mode, mesh_2x4):
    rng = np.random.default_rng(1)
    arrays = dict(
        per_token_loss=jnp.asarray(rng.normal(size=(16, 8)), jnp.float32),
        mask=jnp.asarray(rng.random((16, 8)) > 0.4, jnp.float32),
    )
    assert_sharded_matches(aggregate, arrays, mesh_2x4, mode=mode)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_jit_and_vmap_over_a_batch_of_batches(mode):
    rng = np.random.default_rng(2)
    loss = jnp.asarray(rng.normal(size=(2, 16, 8)), jnp.float32)
    mask = jnp.asarray(rng.random((2, 16, 8)) > 0.4, jnp.float32)
    batched, parts = jax.jit(jax.vmap(lambda l, m: aggregate(l, m, mode)))(loss, mask)
    for k in range(2):
        value, p = aggregate(loss[k], mask[k], mode)
        np.testing.assert_allclose(batched[k], value, rtol=1e-6)
        np.testing.assert_allclose(parts.denominator[k], p.denominator)


# ---------------------------------------------------------------- bad input


def test_bad_inputs():
    valid = "valid modes: token_mean, seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm, token_sum"
    with pytest.raises(ValueError, match=f"unknown aggregation mode 'token-sum'; {valid}"):
        aggregate(LOSS, MASK, "token-sum")
    with pytest.raises(ValueError, match=f"unknown aggregation mode 'mean'; {valid}"):
        aggregation_denominator(MASK, "mean")
    with pytest.raises(ValueError, match=r"mask has shape \(3, 3\) but per_token_loss has shape \(3, 4\)"):
        aggregate(LOSS, MASK[:, :3])
    with pytest.raises(ValueError, match=r"per_token_loss must have shape \[N, T\], got shape \(4,\)"):
        aggregate(LOSS[0], MASK[0])
    with pytest.raises(TypeError, match="per_token_loss must be a floating-point array, got dtype int32"):
        aggregate(LOSS.astype(jnp.int32), MASK)
    with pytest.raises(ValueError, match=r"mask must have shape \[N, T\], got shape \(4,\)"):
        aggregation_denominator(MASK[0])
    for bad in (0, -3.0, True, "8"):
        with pytest.raises(ValueError, match=f"max_len must be a positive number, got {bad!r}"):
            aggregate(LOSS, MASK, "seq_mean_token_sum_norm", max_len=bad)
