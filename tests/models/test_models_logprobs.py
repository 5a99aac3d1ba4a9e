"""Chunked log-probs and entropy equal the naive full-logits computation, values and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo.models import Decoder, DecoderConfig
from jaxgrpo.models.logprobs import token_logprobs_and_entropy, token_logprobs_and_entropy_reference


def _inputs(batch=2, length=37, width=32, vocab=1000, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    hidden = jax.random.normal(keys[0], (batch, length, width))
    unembedding = 0.5 * jax.random.normal(keys[1], (width, vocab))
    targets = jax.random.randint(keys[2], (batch, length), 0, vocab)
    return hidden, unembedding, targets


@pytest.mark.parametrize("temperature, softcap", [(1.0, None), (0.7, 5.0)])
def test_chunked_equals_naive_with_ragged_chunks(temperature, softcap):
    hidden, unembedding, targets = _inputs()
    # 37 tokens in chunks of 16 and 1000 words in chunks of 256: both need padding.
    chunked = jax.jit(functools.partial(token_logprobs_and_entropy, temperature=temperature, logit_softcap=softcap,
                                        sequence_chunk=16, vocab_chunk=256))
    naive = jax.jit(functools.partial(token_logprobs_and_entropy_reference, temperature=temperature, logit_softcap=softcap))
    for got, want in zip(chunked(hidden, unembedding, targets), naive(hidden, unembedding, targets)):
        assert got.shape == targets.shape and got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


@pytest.mark.parametrize("fn", [token_logprobs_and_entropy, token_logprobs_and_entropy_reference])
@pytest.mark.parametrize("temperature", [0.0, -0.5])
def test_temperature_must_be_positive(fn, temperature):
    """Temperature 0 (the sampler's greedy) would divide the logits by zero: NaN log-probs, then NaN weights."""
    hidden, unembedding, targets = _inputs(length=4, vocab=50)
    with pytest.raises(ValueError, match="temperature must be > 0 to score tokens"):
        fn(hidden, unembedding, targets, temperature=temperature)


@pytest.mark.parametrize("temperature, softcap", [(0.9, None), (0.7, 5.0)])
def test_chunked_gradients_equal_naive(temperature, softcap):
    """The written-out backward pass (`_chunked_backward`) against autodiff of the full logits: log-probs and
    entropies weighted, the soft cap and temperature, ragged chunks (padding in both axes)."""
    hidden, unembedding, targets = _inputs(length=20, vocab=300)

    def loss(fn, hidden, unembedding):
        log_probs, entropy = fn(hidden, unembedding, targets)
        return jnp.sum(log_probs * jnp.linspace(-1, 1, 20)) + 0.3 * jnp.sum(entropy)

    chunked = functools.partial(token_logprobs_and_entropy, temperature=temperature, logit_softcap=softcap,
                                sequence_chunk=8, vocab_chunk=128)
    naive = functools.partial(token_logprobs_and_entropy_reference, temperature=temperature, logit_softcap=softcap)
    got = jax.jit(jax.grad(functools.partial(loss, chunked), argnums=(0, 1)))(hidden, unembedding)
    want = jax.jit(jax.grad(functools.partial(loss, naive), argnums=(0, 1)))(hidden, unembedding)
    for g, w in zip(got, want):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5)


def test_model_token_logprobs_match_log_softmax_of_logits():
    config = DecoderConfig(family="gemma3", vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2,
                           num_heads=2, num_kv_heads=1, head_dim=16, qk_norm=True, final_logit_softcapping=4.0,
                           tie_word_embeddings=True)
    model = Decoder(config, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, 97)
    targets = jnp.roll(tokens, -1, axis=1)
    log_probs, entropy = jax.jit(lambda m: m.token_logprobs(tokens, targets, temperature=0.8, vocab_chunk=32))(model)
    logits = jax.jit(lambda m: m(tokens))(model) / 0.8
    expected = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(log_probs), np.asarray(expected), atol=1e-5)
    expected_entropy = -jnp.sum(jax.nn.softmax(logits) * jax.nn.log_softmax(logits), axis=-1)
    np.testing.assert_allclose(np.asarray(entropy), np.asarray(expected_entropy), atol=1e-5)


def test_bfloat16_gradients_equal_naive_to_bfloat16_precision():
    """bfloat16 hidden states and projection, as the trainer scores: gradients in their dtypes, within bfloat16's
    precision of the float32 autodiff of the full logits."""
    hidden, unembedding, targets = _inputs(length=24, vocab=500)
    weights = jnp.linspace(-1, 1, 24)

    def loss(fn, hidden, unembedding):
        log_probs, entropy = fn(hidden, unembedding, targets)
        return jnp.sum(log_probs * weights) + 0.3 * jnp.sum(entropy)

    chunked = functools.partial(token_logprobs_and_entropy, sequence_chunk=8, vocab_chunk=128)
    got = jax.jit(jax.grad(functools.partial(loss, chunked), argnums=(0, 1)))(hidden.astype(jnp.bfloat16),
                                                                               unembedding.astype(jnp.bfloat16))
    want = jax.jit(jax.grad(functools.partial(loss, token_logprobs_and_entropy_reference), argnums=(0, 1)))(
        hidden.astype(jnp.bfloat16).astype(jnp.float32), unembedding.astype(jnp.bfloat16).astype(jnp.float32))
    for g, w in zip(got, want):
        assert g.dtype == jnp.bfloat16
        scale = float(jnp.abs(w).max())
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w), atol=2e-2 * scale)
