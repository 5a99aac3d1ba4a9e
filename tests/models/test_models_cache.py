"""The KV-cache contract the sampler relies on: cached decoding equals full forwards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.extend.core import jaxprs_in_params

from jaxgrpo.models import Decoder, DecoderConfig, backend, cpu_forms, memory_forms
from jaxgrpo.models.decoder import KVCache

LLAMA = DecoderConfig(family="llama", vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16)
GEMMA = DecoderConfig(family="gemma3", vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                      num_heads=4, num_kv_heads=1, head_dim=16, layer_types=("sliding_attention", "full_attention"),
                      sliding_window=3, qk_norm=True, query_pre_attn_scalar=16, final_logit_softcapping=5.0,
                      tie_word_embeddings=True)


def _random_model(config):
    model = Decoder(config, rngs=nnx.Rngs(0))
    # Norm weights start at their identity values; perturb them so every code path matters.
    def perturb(path, value):
        if "norm" not in jax.tree_util.keystr(path):
            return value
        return value + 0.3 * jax.random.normal(jax.random.key(value.size), value.shape)

    nnx.update(model, jax.tree_util.tree_map_with_path(perturb, nnx.state(model, nnx.Param)))
    return model


@pytest.mark.parametrize("config", [LLAMA, GEMMA], ids=["llama", "gemma3"])
def test_greedy_decoding_with_cache_equals_full_forward(config):
    model = _random_model(config)
    rng = np.random.default_rng(0)
    prompt_length, new_tokens, capacity = 6, 5, 16
    tokens = rng.integers(0, config.vocab_size, (2, prompt_length))
    real = np.ones((2, prompt_length), bool)
    real[1, :3] = False  # the second prompt is left-padded

    @jax.jit
    def step(model, tokens, positions, cache, cache_index, kv_mask):
        return model(tokens, positions, cache=cache, cache_index=cache_index, kv_mask=kv_mask)

    cache = model.init_cache(2, capacity)
    assert cache.k.shape == (config.num_layers, 2, config.num_kv_heads, capacity, config.head_dim)
    kv_mask = np.zeros((2, capacity), bool)
    kv_mask[:, :prompt_length] = real
    positions = np.maximum(real.cumsum(1) - 1, 0)
    logits, cache = step(model, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions), cache, 0, jnp.asarray(kv_mask))
    sequence, step_logits = tokens, []
    for t in range(new_tokens):
        step_logits.append(np.asarray(logits[:, -1]))
        next_token = step_logits[-1].argmax(-1)
        sequence = np.concatenate([sequence, next_token[:, None]], axis=1)
        index = prompt_length + t
        kv_mask[:, index] = True
        logits, cache = step(model, jnp.asarray(next_token[:, None], jnp.int32), jnp.asarray(positions[:, -1:] + t + 1),
                             cache, jnp.int32(index), jnp.asarray(kv_mask))
    # Causality: one full forward over the final sequence holds every step's reference logits.
    mask = np.concatenate([real, np.ones((2, new_tokens), bool)], axis=1)
    full = np.asarray(jax.jit(lambda m, t, a: m(t, attention_mask=a))(model, jnp.asarray(sequence, jnp.int32), jnp.asarray(mask)))
    reference = full[:, prompt_length - 1 : -1].transpose(1, 0, 2)
    np.testing.assert_allclose(np.stack(step_logits), reference, atol=1e-5)
    assert (np.stack(step_logits).argmax(-1) == reference.argmax(-1)).all()
    # Slots never written stay zero: writes touch only [cache_index, cache_index + S).
    assert not np.asarray(cache.k[:, :, :, prompt_length + new_tokens:]).any()
    assert np.asarray(cache.k[:, :, :, : prompt_length + new_tokens]).any()


def test_cache_update_runs_with_donated_buffers():
    model = _random_model(LLAMA)
    graphdef, state = nnx.split(model)

    @jax.jit
    def decode(state, cache, token, index, kv_mask):
        logits, cache = nnx.merge(graphdef, state)(token, index[None, None], cache=cache, cache_index=index, kv_mask=kv_mask)
        return logits, cache

    donating = jax.jit(decode, donate_argnums=1)
    kv_mask = jnp.zeros((1, 8), bool).at[0, 0].set(True)
    token = jnp.array([[5]], jnp.int32)
    expected, _ = decode(state, model.init_cache(1, 8), token, jnp.int32(0), kv_mask)
    cache = model.init_cache(1, 8)
    logits, new_cache = donating(state, cache, token, jnp.int32(0), kv_mask)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-6)
    assert cache.k.is_deleted()  # the buffer was donated and reused for the update
    assert new_cache.k.shape == cache.k.shape


def test_cached_call_validates_its_arguments():
    model = _random_model(LLAMA)
    cache = model.init_cache(2, 8)
    tokens = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="cache_index"):
        model(tokens, cache=cache)
    with pytest.raises(ValueError, match=r"kv_mask must be \[batch, capacity\]"):
        model(tokens, cache=cache, cache_index=0, kv_mask=jnp.ones((2, 5), bool))


@pytest.mark.parametrize("config", [LLAMA, GEMMA], ids=["llama", "gemma3"])
def test_a_shared_prefix_equals_its_copies_in_every_row(config):
    # Two left-padded prompts, three continuations each: reading each prompt's keys once (prefix=)
    # gives the logits of the cache holding a copy of the prompt in every row, for a static index
    # (several tokens at once) and token by token with a traced one. Gemma's window of 3 makes the
    # sliding layers drop prefix slots as the continuation grows.
    model = _random_model(config)
    rng = np.random.default_rng(1)
    prompts, share, prompt_length, new_tokens = 2, 3, 6, 5
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (prompts, prompt_length)), jnp.int32)
    real = np.ones((prompts, prompt_length), bool)
    real[1, :2] = False
    positions = jnp.asarray(np.maximum(real.cumsum(1) - 1, 0))
    real = jnp.asarray(real)
    continuation = jnp.asarray(rng.integers(0, config.vocab_size, (prompts * share, new_tokens)), jnp.int32)
    next_positions = jnp.repeat(positions[:, -1:], share, axis=0) + 1 + jnp.arange(new_tokens)[None]

    _, prompt_cache = model(tokens, positions, cache=model.init_cache(prompts, prompt_length), cache_index=0, kv_mask=real)
    copies = KVCache(*(jnp.pad(jnp.repeat(x, share, axis=1), [(0, 0)] * 3 + [(0, new_tokens), (0, 0)]) for x in prompt_cache))
    copies_mask = jnp.concatenate([jnp.repeat(real, share, axis=0), jnp.ones((prompts * share, new_tokens), bool)], 1)
    expected, _ = model(continuation, next_positions, cache=copies, cache_index=prompt_length, kv_mask=copies_mask)

    rows_mask = jnp.ones((prompts * share, new_tokens), bool)
    shared = dict(prefix=prompt_cache, prefix_mask=real)
    at_once, _ = model(continuation, next_positions, cache=model.init_cache(prompts * share, new_tokens), cache_index=0,
                       kv_mask=rows_mask, **shared)
    np.testing.assert_allclose(np.asarray(at_once), np.asarray(expected), atol=1e-5)

    step = jax.jit(lambda m, t, p, c, i, k, prefix, prefix_mask: m(t, p, cache=c, cache_index=i, kv_mask=k, prefix=prefix,
                                                                   prefix_mask=prefix_mask))
    cache, one_by_one = model.init_cache(prompts * share, new_tokens), []
    for t in range(new_tokens):
        logits, cache = step(model, continuation[:, t:t + 1], next_positions[:, t:t + 1], cache, jnp.int32(t),
                             rows_mask.at[:, t + 1:].set(False), **shared)
        one_by_one.append(np.asarray(logits[:, 0]))
    np.testing.assert_allclose(np.stack(one_by_one, 1), np.asarray(expected), atol=1e-5)


def test_a_shared_prefix_is_checked():
    model = _random_model(LLAMA)
    prefix = model.init_cache(2, 4)
    tokens = jnp.zeros((6, 1), jnp.int32)
    cached = dict(cache=model.init_cache(6, 3), cache_index=0, kv_mask=jnp.ones((6, 3), bool))
    with pytest.raises(ValueError, match=r"prefix_mask must be \[prefix rows, prefix length\] = \(2, 4\)"):
        model(tokens, **cached, prefix=prefix, prefix_mask=jnp.ones((2, 5), bool))
    with pytest.raises(ValueError, match="needs prefix_mask"):
        model(tokens, **cached, prefix=prefix)
    with pytest.raises(ValueError, match="without a prefix"):
        model(tokens, **cached, prefix_mask=jnp.ones((2, 4), bool))
    with pytest.raises(ValueError, match=r"batch \(4 rows\) must be a multiple of the prefix's rows \(3\)"):
        model(jnp.zeros((4, 1), jnp.int32), cache=model.init_cache(4, 3), cache_index=0, kv_mask=jnp.ones((4, 3), bool),
              prefix=model.init_cache(3, 4), prefix_mask=jnp.ones((3, 4), bool))
    with pytest.raises(ValueError, match="cached calls only"):
        model(tokens, prefix=prefix, prefix_mask=jnp.ones((2, 4), bool))


def test_a_cache_round_trips_through_its_bits_on_a_cpu():
    # The CPU forms carry a bfloat16 cache through a decode loop as its bits; the plain forms as it is.
    forms = cpu_forms.FORMS
    cache = KVCache(jnp.arange(6, dtype=jnp.bfloat16).reshape(1, 1, 1, 6, 1), -jnp.ones((1, 1, 1, 6, 1), jnp.bfloat16))
    bits = forms.to_carry(cache)
    assert isinstance(bits, KVCache) and bits.k.dtype == bits.v.dtype == jnp.uint16
    back = forms.from_carry(bits, jnp.bfloat16)
    assert back.k.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(back.k, np.float32), np.asarray(cache.k, np.float32))
    np.testing.assert_array_equal(np.asarray(back.v, np.float32), np.asarray(cache.v, np.float32))
    wide = KVCache(jnp.ones((2, 3)), jnp.zeros((2, 3)))
    assert forms.to_carry(wide).k is wide.k  # 32-bit caches are kept as they are
    assert forms.from_carry(forms.to_carry(wide), jnp.float32).k is wide.k
    with pytest.raises(ValueError, match="cache's k holds float32, not the bits of bfloat16"):
        forms.from_carry(wide, jnp.bfloat16)
    with pytest.raises(ValueError, match="uint16, not the bits of float32"):
        forms.from_carry(bits, jnp.float32)
    assert memory_forms.PLAIN.to_carry(cache) is cache


@pytest.mark.parametrize("remat", [False, True], ids=["stored", "remat"])
def test_bfloat16_weights_read_through_their_bits_have_the_plain_derivatives(remat, monkeypatch):
    # On a CPU the layer scan slices bfloat16 weights, and the embedding gathers its rows, through their bits
    # (XLA:CPU would otherwise convert them whole to float32); values and gradients are bit-identical to the
    # plain forms' reads (with the CPU's float32 products: the plain forms' bfloat16 ones round elsewhere).
    model = Decoder(LLAMA, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, remat=remat, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, LLAMA.vocab_size)

    def loss(p):
        logits = nnx.merge(graphdef, p)(tokens)
        return (jax.nn.log_softmax(logits)[..., 5]).sum()

    assert backend.memory_for_program() is cpu_forms.FORMS
    text = jax.jit(jax.value_and_grad(loss)).lower(params).as_text()
    assert "optimization_barrier" in text and "bitcast_convert" in text
    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    plain = memory_forms.PLAIN._replace(product=memory_forms.float32_product)
    monkeypatch.setattr(backend, "memory_for_program", lambda: plain)
    text = jax.jit(jax.value_and_grad(loss)).lower(params).as_text()
    assert "optimization_barrier" not in text and "bitcast_convert" not in text
    plain_value, plain_grads = jax.jit(jax.value_and_grad(loss))(params)
    assert float(value) == float(plain_value)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert all(np.abs(np.asarray(g, np.float32)).max() > 0 for g in jax.tree.leaves(grads))



def _has_while(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            return True
        for sub in jaxprs_in_params(eqn.params):
            if _has_while(sub):
                return True
    return False


@pytest.mark.parametrize("capacity, loops", [(16, False), (64, True)])
def test_a_decode_step_loops_over_cache_chunks_only_when_several(capacity, loops):
    """With a run-time cache index, a cache that one chunk of the memory forms covers is read in one block (no
    loop with a run-time trip count of 0 or 1: on a GPU each costs a host round trip per layer and step); a
    larger one is read chunk by chunk up to the live length (the CPU forms' 32-slot chunks)."""
    model = _random_model(LLAMA)
    kv_mask = jnp.ones((2, capacity), bool)

    def step(model, cache, index):
        return model(jnp.zeros((2, 1), jnp.int32), jnp.full((2, 1), 3), cache=cache, cache_index=index,
                     kv_mask=kv_mask)

    assert (backend.memory_for_program().cache_chunk(capacity) < capacity) == loops  # the premise, on this CPU
    jaxpr = jax.make_jaxpr(step)(model, model.init_cache(2, capacity), jnp.int32(3))
    assert _has_while(jaxpr.jaxpr) == loops
