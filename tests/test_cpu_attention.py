"""The C++ decode-attention kernel (jaxgrpo.models.cpu_attention) against the decoder's XLA form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgrpo.models.decoder as dec
from jaxgrpo.models import cpu_attention, cpu_forms
from jaxgrpo.models.attention import cpu as cpu_implementation

pytestmark = pytest.mark.skipif(not cpu_attention.available(),
                                reason="the kernel needs a C++ compiler and an AVX-512 CPU")

LAYERS, ROWS, KV, GROUPS, CAPACITY, PROMPT = 3, 8, 3, 3, 128, 16


def _attend(inputs, use_kernel, monkeypatch):
    """_attend_with_cache on `inputs` (a one-token decode call) with or without the kernel."""
    original = cpu_attention.use_for
    with monkeypatch.context() as patch:
        patch.setattr(cpu_attention, "use_for", lambda *a: use_kernel and original(*a))
        q, new_scores, v, cache, prefix, layer, mask, prefix_mask, live, dtype = inputs
        fn = jax.jit(lambda cache, prefix, layer, live: dec._attend_with_cache(
            q, new_scores, v, cache, layer, mask, live, 0.125, dtype, cpu_forms.FORMS, prefix, prefix_mask,
            cache_reader=cpu_implementation.cache_reader))
        args = (cache, prefix, jnp.int32(layer), jnp.int32(live))
        assert (cpu_attention.TARGET in fn.lower(*args).as_text()) == use_kernel  # the kernel runs, or not
        return np.asarray(fn(*args).astype(jnp.float32))


def _inputs(dtype, head_dim, live, layer, share, seed=0):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)  # noqa: E731
    cache = dec.KVCache(normal(LAYERS, ROWS, KV, CAPACITY, head_dim), normal(LAYERS, ROWS, KV, CAPACITY, head_dim))
    prefix_rows = ROWS // share
    prefix = dec.KVCache(normal(LAYERS, prefix_rows, KV, PROMPT, head_dim), normal(LAYERS, prefix_rows, KV, PROMPT, head_dim))
    # Holes in both masks (left padding, finished slots); the cache mask only below the live length.
    mask = jnp.asarray((rng.random((ROWS, CAPACITY)) < 0.8) & (np.arange(CAPACITY) < live))[:, None]
    prefix_mask = jnp.asarray(rng.random((prefix_rows, PROMPT)) < 0.7)[:, None]
    new_scores = jnp.asarray(rng.standard_normal((ROWS, KV, GROUPS, 1, 1)), jnp.float32)
    return (normal(ROWS, 1, KV, GROUPS, head_dim), new_scores, normal(ROWS, 1, KV, head_dim), cache, prefix, layer,
            mask, prefix_mask, live, dtype)


@pytest.mark.parametrize("dtype,tolerance", [(jnp.float32, 2e-6), (jnp.bfloat16, 1e-2)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("live", [0, 1, 37, CAPACITY])
def test_kernel_equals_the_xla_form(dtype, tolerance, head_dim, live, monkeypatch):
    inputs = _inputs(dtype, head_dim, live, layer=1 + live % 2, share=4, seed=live)
    expected, got = _attend(inputs, False, monkeypatch), _attend(inputs, True, monkeypatch)
    # bfloat16: the XLA form rounds the softmax weights to bfloat16 before the value product, the kernel does not.
    np.testing.assert_allclose(got, expected, atol=tolerance * np.abs(expected).max(), rtol=0)


def test_kernel_state_of_a_block_with_no_kept_slot():
    q = jnp.ones((2, 1, 1, 2, 64), jnp.float32)
    cache = jnp.ones((1, 2, 1, 8, 64), jnp.float32)
    top, total, out = cpu_attention.cache_block(q, cache, cache, 0, jnp.zeros((2, 1, 8), bool), 8, 0.125)
    np.testing.assert_array_equal(top, np.float32(-1e30))
    np.testing.assert_array_equal(total, 0.0)
    np.testing.assert_array_equal(out, 0.0)


def test_use_for_only_unsharded_one_token_calls_it_supports():
    assert cpu_attention.use_for(jnp.bfloat16, 64, 1, None)
    assert cpu_attention.use_for(jnp.float32, 128, 1, None)
    assert not cpu_attention.use_for(jnp.float32, 64, 4, None)      # a prefill
    assert not cpu_attention.use_for(jnp.float32, 256, 1, None)     # head size without a kernel
    assert not cpu_attention.use_for(jnp.float16, 64, 1, None)      # float16 bits are not bfloat16
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    assert not cpu_attention.use_for(jnp.float32, 64, 1, mesh)       # sharded: the XLA form partitions


def test_cache_rows_must_divide_the_query_rows():
    q = jnp.ones((3, 1, 1, 1, 64), jnp.float32)
    cache = jnp.ones((1, 2, 1, 8, 64), jnp.float32)
    with pytest.raises(ValueError, match="rows must divide"):
        cpu_attention.cache_block(q, cache, cache, 0, jnp.ones((2, 1, 8), bool), 8, 0.125)


def test_loading_the_kernel_keeps_subnormal_floats():
    """The library must not switch the process to flush-to-zero (what -ffast-math's startup code does)."""
    assert cpu_attention.available()
    tiny = np.array([1e-40], np.float32)
    assert tiny[0] != 0 and (tiny * np.float32(1.0))[0] != 0


def test_caches_must_be_stored_bfloat16_bits_or_float32():
    q = jnp.ones((2, 1, 1, 1, 64), jnp.float32)
    cache = jnp.ones((1, 2, 1, 8, 64), jnp.bfloat16)  # not its bits
    with pytest.raises(ValueError, match="bfloat16 bits"):
        cpu_attention.cache_block(q, cache, cache, 0, jnp.ones((2, 1, 8), bool), 8, 0.125)
