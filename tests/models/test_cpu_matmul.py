"""The C++ decode weight products (jaxgrpo.models.cpu_matmul): packing, products against float32
references, and the decoder and sampler with packed weights against XLA's products."""

import dataclasses
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxgrpo.models
from jaxgrpo import engine, sampler
from jaxgrpo.models import Decoder, cpu_matmul
from tests.support import processes
from tests.support.tiny_models import llama_and_gemma3

pytestmark = pytest.mark.skipif(not cpu_matmul.available(),
                                reason="the kernel needs a C++ compiler and an AVX512-BF16 CPU")


def _bfloat16(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)


@pytest.mark.parametrize("rows", [1, 7, 8, 33])  # whole 8-row tiles and every remainder path
@pytest.mark.parametrize("in_shape,out_shape", [((64,), (96,)), ((33,), (40,)), ((4, 8), (32,)), ((64,), (3, 8))])
def test_product_equals_float32_reference(rows, in_shape, out_shape):
    # Odd K and N off the 32-column blocks are padded with zeros; several input or output axes flatten.
    rng = np.random.default_rng(rows)
    stack = _bfloat16(rng, 3, *in_shape, *out_shape)
    x = _bfloat16(rng, rows, *in_shape)
    packed = cpu_matmul.pack(stack, len(in_shape))
    got = jax.jit(lambda x, packed, layer: packed.at(layer).product(x))(x, packed, jnp.int32(2))
    k, n = np.prod(in_shape), np.prod(out_shape)
    expected = (np.asarray(x, np.float64).reshape(rows, k) @ np.asarray(stack[2], np.float64).reshape(k, n))
    assert got.dtype == jnp.float32 and got.shape == (rows, *out_shape)
    # Products of bfloat16 values are exact in float32; only the order of the float32 sums differs.
    np.testing.assert_allclose(np.asarray(got).reshape(rows, n), expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_out_first_packs_a_table_as_its_own_transpose():
    rng = np.random.default_rng(0)
    table, hidden = _bfloat16(rng, 100, 24), _bfloat16(rng, 2, 5, 24)  # an embedding [V, E]; hidden [.., E]
    packed = cpu_matmul.pack(table[None], 1, out_first=True)
    assert packed.in_shape == (24,) and packed.out_shape == (100,)
    expected = np.asarray(hidden, np.float64) @ np.asarray(table, np.float64).T
    np.testing.assert_allclose(packed.product(hidden), expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_packed_layout():
    # Block b, pair p: W[2p, 32b + c] at 2c and W[2p + 1, 32b + c] at 2c + 1, zero past K or N.
    weights = jnp.arange(1 * 3 * 40, dtype=jnp.float32).reshape(1, 3, 40).astype(jnp.bfloat16)
    bits = np.asarray(jax.lax.bitcast_convert_type(cpu_matmul.pack(weights, 1).bits, jnp.bfloat16), np.float32)
    assert bits.shape == (1, 2, 2, 64)
    w = np.asarray(weights[0], np.float32)
    assert bits[0, 1, 0, 2 * 3] == w[0, 35] and bits[0, 1, 0, 2 * 3 + 1] == w[1, 35]
    assert bits[0, 0, 1, 2 * 5] == w[2, 5] and bits[0, 0, 1, 2 * 5 + 1] == 0  # no row 3
    assert not bits[0, 1, :, 2 * 8:].any()  # no column 40 or beyond


def test_bad_input_names_the_problem():
    stack = jnp.ones((2, 8, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="in_dims >= 1"):
        cpu_matmul.pack(stack, 0)
    with pytest.raises(ValueError, match="an output axis"):
        cpu_matmul.pack(stack, 2)
    packed = cpu_matmul.pack(stack, 1)
    with pytest.raises(ValueError, match=r"last axes must be \(8,\)"):
        packed.product(jnp.ones((4, 9), jnp.bfloat16))
    with pytest.raises(TypeError, match="read whole"):
        packed[0]


def test_use_for():
    assert cpu_matmul.use_for(jnp.bfloat16, None)
    assert not cpu_matmul.use_for(jnp.float32, None)  # float32 decodes keep XLA's products
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    assert not cpu_matmul.use_for(jnp.bfloat16, mesh)  # sharded: XLA partitions the products


# Hidden 32, MLP 48 and a 61-token vocabulary: the MLP's and the unembedding's columns need padding.
CONFIGS = llama_and_gemma3(sliding_window=2)
CONFIGS["qwen2"] = dataclasses.replace(CONFIGS["llama"], family="qwen2", qkv_bias=True)
CONFIGS["qwen3"] = dataclasses.replace(CONFIGS["llama"], family="qwen3", qk_norm=True)


def _model(family, dtype=jnp.bfloat16):
    return Decoder(CONFIGS[family], dtype=dtype, param_dtype=dtype, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_decoder_with_packed_weights_equals_xla_products(family):
    model = _model(family)
    packed = model.pack_weights()
    names = {("attn", n) for n in "qkvo"} | {("mlp", n) for n in ("gate", "up", "down")}
    assert packed is not None and set(packed.layers) == names
    rows, capacity = 3, 8
    cache = model.init_cache(rows, capacity)
    kv_mask = jnp.zeros((rows, capacity), bool).at[:, :3].set(True)
    tokens = jnp.array([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    # A prefill, then a one-token call reading the cache: the decode loop's call, with and without packing.
    _, cache = model(tokens, cache=cache, cache_index=0, kv_mask=kv_mask)
    step = jax.jit(lambda model, cache, packed: model(
        tokens[:, :1], jnp.full((rows, 1), 3), cache=cache, cache_index=3, kv_mask=kv_mask.at[:, 3].set(True),
        packed_weights=packed)[0])
    expected, got = step(model, cache, None), step(model, cache, packed)
    assert "jaxgrpo_cpu_matmul" in step.lower(model, cache, packed).as_text()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-2 * np.abs(expected).max())


def test_float32_models_pack_nothing():
    assert _model("llama", jnp.float32).pack_weights() is None


def _generate_both_ways(model, prompts, monkeypatch, **kwargs):
    """(with the kernel, with XLA's products): the same `engine.generate` call, each compiled afresh."""
    results = []
    for use in (cpu_matmul.use_for, lambda *args: False):
        with monkeypatch.context() as patch:
            patch.setattr(cpu_matmul, "use_for", use)
            jax.clear_caches()
            results.append(engine.generate(model, prompts, **kwargs))
    jax.clear_caches()
    return results


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_bfloat16_sampling_with_packed_weights_equals_xla_products(family, monkeypatch):
    model = _model(family)
    kernel, xla = _generate_both_ways(model, [[3, 17, 42, 8], [5, 6, 7, 8, 9, 10], [60, 2]], monkeypatch,
                                      num_samples=2, max_new_tokens=10, key=jax.random.key(0), temperature=0.8)
    np.testing.assert_array_equal(np.asarray(kernel.completion_tokens), np.asarray(xla.completion_tokens))
    np.testing.assert_allclose(kernel.logprobs, xla.logprobs, rtol=0, atol=2e-2)


def test_smollm2_in_bfloat16_answers_five_with_packed_weights(monkeypatch):
    model, tokenizer = jaxgrpo.models.load("smollm2-135m-instruct", dtype=jnp.bfloat16)
    prompts = sampler.encode_prompts(tokenizer, ["What is 2+3?", "What is the capital of France?"])
    kernel, xla = _generate_both_ways(model, prompts, monkeypatch, max_new_tokens=16, greedy=True,
                                      stop_tokens=sampler.default_stop_tokens(tokenizer), pad_id=tokenizer.pad_token_id)
    np.testing.assert_array_equal(np.asarray(kernel.completion_tokens), np.asarray(xla.completion_tokens))
    tokens, mask = np.asarray(kernel.completion_tokens), np.asarray(kernel.completion_mask)
    assert "5" in tokenizer.decode(tokens[0][mask[0]].tolist(), skip_special_tokens=True)
    assert "Paris" in tokenizer.decode(tokens[1][mask[1]].tolist(), skip_special_tokens=True)


_CONCURRENT_CALLS = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jaxgrpo.models import cpu_attention, cpu_matmul
    rng = np.random.default_rng(0)
    weights = [cpu_matmul.pack(jnp.asarray(rng.standard_normal((1, 256, 2048)), jnp.bfloat16), 1) for _ in range(2)]
    x = jnp.asarray(rng.standard_normal((32, 256)), jnp.bfloat16)
    cache = jnp.asarray(rng.standard_normal((2, 16, 3, 128, 64)), jnp.float32)
    q, mask = jnp.asarray(rng.standard_normal((16, 1, 3, 3, 64)), jnp.float32), jnp.ones((16, 1, 128), bool)

    def body(i, acc):  # a dozen independent calls of each kernel per iteration
        products = sum(w.product(x * (i + j).astype(x.dtype)).sum() for j, w in enumerate(weights * 6))
        attention = sum(cpu_attention.cache_block(q + i + j, cache, cache, j % 2, mask, 100, 0.1)[2].sum()
                        for j in range(12))
        return acc + products + attention

    run = jax.jit(lambda: jax.lax.fori_loop(0, 50, body, jnp.float32(0)))
    for _ in range(20):
        jax.block_until_ready(run())
    print("finished")
""")


def test_concurrent_kernel_calls_finish():
    # XLA:CPU runs independent custom calls at once on its intra-op pool's threads. A kernel that waited for
    # the part it had queued on the pool, while every pool thread ran such a kernel, waited forever (a
    # float32 decode hung with its prompt- and completion-cache attention calls side by side). Both kernels
    # now split their work with cpu_parallel.h's ParallelFor, whose caller runs the parts nobody started.
    # One CPU device, as in a real run (the pool's threads are then all the kernels have; with the 8 fake
    # devices of the other tests, the hang did not show).
    result = subprocess.run([sys.executable, "-c", _CONCURRENT_CALLS], capture_output=True, text=True, timeout=120,
                            env=processes.child_env())
    assert result.returncode == 0 and "finished" in result.stdout, result.stderr[-2000:]
