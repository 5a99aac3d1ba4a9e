"""The KV-cache contract the sampler relies on: cached decoding equals full forwards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo.models import Decoder, DecoderConfig

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
