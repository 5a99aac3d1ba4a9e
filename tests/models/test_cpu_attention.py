"""The C++ decode-attention kernel (jaxgrpo.models.cpu_attention) against the decoder's XLA form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo.models import Decoder, DecoderConfig, cpu_attention, cpu_forms

needs_kernel = pytest.mark.skipif(not cpu_attention.available(),
                                  reason="the kernel needs a C++ compiler and an AVX-512 CPU")

ROWS, CAPACITY, PROMPT = 8, 128, 16
LLAMA = DecoderConfig(family="llama", vocab_size=97, hidden_size=96, intermediate_size=64, num_layers=3,
                      num_heads=6, num_kv_heads=3, head_dim=64)
GEMMA = DecoderConfig(family="gemma3", vocab_size=97, hidden_size=96, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=128, qk_norm=True, query_pre_attn_scalar=64,
                      layer_types=("sliding_attention", "full_attention"), sliding_window=20, tie_word_embeddings=True)


def _inputs(config, dtype, live, share, seed=0):
    """A one-token decode call: random caches (holes in both masks: left padding, finished slots), the new
    token at slot `live`, `ROWS // share` prefix rows shared by `share` rows each."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)  # noqa: E731
    shape = (config.num_layers, ROWS, config.num_kv_heads, CAPACITY, config.head_dim)
    prefix_shape = shape[:1] + (ROWS // share,) + shape[2:3] + (PROMPT,) + shape[4:]
    kv_mask = (rng.random((ROWS, CAPACITY)) < 0.8) & (np.arange(CAPACITY) < live)
    kv_mask[:, live] = True
    return dict(tokens=jnp.asarray(rng.integers(0, config.vocab_size, (ROWS, 1)), jnp.int32),
                positions=jnp.full((ROWS, 1), PROMPT + live, jnp.int32),
                cache=(normal(*shape), normal(*shape)), prefix=(normal(*prefix_shape), normal(*prefix_shape)),
                kv_mask=jnp.asarray(kv_mask), prefix_mask=jnp.asarray(rng.random((ROWS // share, PROMPT)) < 0.7),
                live=live)


def _decode(config, dtype, attention, inputs):
    """(hidden states, updated cache) of `Decoder.decode_step` with `attention`, the cache index traced, and the
    lowered program's text."""
    model = Decoder(config, dtype=dtype, param_dtype=dtype, attention=attention, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    i = inputs

    def step(state, cache, prefix, index):
        from jaxgrpo.models.decoder import KVCache

        return nnx.merge(graphdef, state).decode_step(
            i["tokens"], i["positions"], cache=KVCache(*cache), cache_index=index, kv_mask=i["kv_mask"],
            prefix=KVCache(*prefix), prefix_mask=i["prefix_mask"])

    args = (state, i["cache"], i["prefix"], jnp.int32(i["live"]))
    text = jax.jit(step).lower(*args).as_text()
    hidden, cache = jax.jit(step)(*args)
    return np.asarray(hidden.astype(jnp.float32)), np.asarray(cache.k.astype(jnp.float32)), text


@needs_kernel
@pytest.mark.parametrize("dtype,tolerance", [(jnp.float32, 2e-5), (jnp.bfloat16, 3e-2)])
@pytest.mark.parametrize("config", [LLAMA, GEMMA], ids=["llama_d64", "gemma3_d128_sliding"])
@pytest.mark.parametrize("live", [0, 1, 37, CAPACITY - 1])
def test_kernel_equals_the_xla_form(dtype, tolerance, config, live):
    """A decode step reading the row cache and a shared prefix through the kernel (`attention="cpu"`) equals the
    XLA math (`attention="xla"`)."""
    inputs = _inputs(config, dtype, live, share=4, seed=live)
    expected, expected_cache, xla_text = _decode(config, dtype, "xla", inputs)
    got, got_cache, cpu_text = _decode(config, dtype, "cpu", inputs)
    assert cpu_attention.TARGET in cpu_text and cpu_attention.TARGET not in xla_text  # the kernel runs, or not
    # bfloat16: the XLA form rounds the softmax weights to bfloat16 before the value product, the kernel does not.
    np.testing.assert_allclose(got, expected, atol=tolerance * np.abs(expected).max(), rtol=0)
    np.testing.assert_allclose(got_cache, expected_cache, atol=tolerance * np.abs(expected_cache).max(), rtol=0)


def _emulated_cache_block(calls):
    """`cpu_attention.cache_block`'s contract in XLA (float32), counting its calls: the decoder's plumbing of the
    kernel (which caches it reads, with which masks) checked on hosts that cannot build it."""

    def cache_block(q, cache_k, cache_v, layer, mask, live, scale):
        calls.append(cache_k.shape)
        read = lambda c: cpu_forms.from_bits(c, jnp.bfloat16).astype(jnp.float32) if c.dtype == jnp.uint16 else c  # noqa: E731
        share = q.shape[0] // cache_k.shape[1]
        keys, values = (jnp.repeat(read(c)[layer], share, axis=0) for c in (cache_k, cache_v))  # [B, kv, C, D]
        kept = jnp.repeat(mask[:, 0], share, axis=0) & (jnp.arange(mask.shape[-1]) < live)  # [B, C]
        scores = jnp.einsum("bkgd,bkcd->bkgc", q[:, 0].astype(jnp.float32), keys) * scale
        scores = jnp.where(kept[:, None, None], scores, -1e30)
        top = scores.max(-1)
        weights = jnp.where(kept[:, None, None], jnp.exp(scores - top[..., None]), 0.0)
        out = jnp.einsum("bkgc,bkcd->bkgd", weights, values)
        return top[..., None], weights.sum(-1)[..., None], out[..., None, :]

    return cache_block


@pytest.mark.parametrize("config", [LLAMA, GEMMA], ids=["llama_d64", "gemma3_d128_sliding"])
@pytest.mark.parametrize("live", [0, 37])
def test_the_decoder_reads_both_caches_through_the_implementations_kernel(config, live, monkeypatch):
    """On every host: with the kernel's contract emulated, `attention="cpu"` routes the prefix's and the row
    cache's reads of every layer through it, with the masks (holes, sliding windows) the XLA math uses."""
    calls = []
    monkeypatch.setattr(cpu_attention, "available", lambda: True)
    monkeypatch.setattr(cpu_attention, "cache_block", _emulated_cache_block(calls))
    inputs = _inputs(config, jnp.float32, live, share=4, seed=live + 1)
    expected, expected_cache, _ = _decode(config, jnp.float32, "xla", inputs)
    got, got_cache, _ = _decode(config, jnp.float32, "cpu", inputs)
    assert sorted({shape[1] for shape in calls}) == [ROWS // 4, ROWS]  # the prefix's rows and the cache's
    np.testing.assert_allclose(got, expected, atol=2e-5 * np.abs(expected).max(), rtol=0)
    # The new keys of layers after the first follow the earlier layers' outputs.
    np.testing.assert_allclose(got_cache, expected_cache, atol=2e-5 * np.abs(expected_cache).max(), rtol=0)


@needs_kernel
def test_kernel_state_of_a_block_with_no_kept_slot():
    q = jnp.ones((2, 1, 1, 2, 64), jnp.float32)
    cache = jnp.ones((1, 2, 1, 8, 64), jnp.float32)
    top, total, out = cpu_attention.cache_block(q, cache, cache, 0, jnp.zeros((2, 1, 8), bool), 8, 0.125)
    np.testing.assert_array_equal(top, np.float32(-1e30))
    np.testing.assert_array_equal(total, 0.0)
    np.testing.assert_array_equal(out, 0.0)


@needs_kernel
def test_use_for_only_unsharded_one_token_calls_it_supports():
    assert cpu_attention.use_for(jnp.bfloat16, 64, 1, None)
    assert cpu_attention.use_for(jnp.float32, 128, 1, None)
    assert not cpu_attention.use_for(jnp.float32, 64, 4, None)      # a prefill
    assert not cpu_attention.use_for(jnp.float32, 256, 1, None)     # head size without a kernel
    assert not cpu_attention.use_for(jnp.float16, 64, 1, None)      # float16 bits are not bfloat16
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    assert not cpu_attention.use_for(jnp.float32, 64, 1, mesh)       # sharded: the XLA form partitions


@needs_kernel
def test_cache_rows_must_divide_the_query_rows():
    q = jnp.ones((3, 1, 1, 1, 64), jnp.float32)
    cache = jnp.ones((1, 2, 1, 8, 64), jnp.float32)
    with pytest.raises(ValueError, match="rows must divide"):
        cpu_attention.cache_block(q, cache, cache, 0, jnp.ones((2, 1, 8), bool), 8, 0.125)


@needs_kernel
def test_loading_the_kernel_keeps_subnormal_floats():
    """The library must not switch the process to flush-to-zero (what -ffast-math's startup code does)."""
    assert cpu_attention.available()
    tiny = np.array([1e-40], np.float32)
    assert tiny[0] != 0 and (tiny * np.float32(1.0))[0] != 0


@needs_kernel
def test_caches_must_be_stored_bfloat16_bits_or_float32():
    q = jnp.ones((2, 1, 1, 1, 64), jnp.float32)
    cache = jnp.ones((1, 2, 1, 8, 64), jnp.bfloat16)  # not its bits
    with pytest.raises(ValueError, match="bfloat16 bits"):
        cpu_attention.cache_block(q, cache, cache, 0, jnp.ones((2, 1, 8), bool), 8, 0.125)
