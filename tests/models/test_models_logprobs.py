"""Chunked log-probs and entropy equal the naive full-logits computation, values and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo.models import Decoder, DecoderConfig, backend, cpu_forms, logprobs, memory_forms
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


def test_one_pass_online_softmax_equals_two_passes():
    """The accelerators' one-pass reduction of a logits block against the maximum first, from a running state: the
    head's padding logit (-1e30) in whole rows and part of one, large and equal logits, a running maximum above and
    below the block's."""
    z = 30.0 * jax.random.normal(jax.random.key(1), (3, 5, 777))
    z = z.at[0, 1, 700:].set(-1e30).at[1, 2].set(-1e30).at[2, 3].set(88.0).at[2, 4, ::2].set(1e4)
    state = (jnp.full((3, 5), -1e30).at[0].set(200.0).at[1, :3].set(-5.0), jnp.ones((3, 5)).at[2].set(0.0),
             jnp.full((3, 5), 2.0).at[2].set(0.0))
    got = jax.jit(memory_forms.one_pass_online_softmax)(state, z)
    want = jax.jit(memory_forms.two_pass_online_softmax)(state, z)
    for g, w in zip(got, want):
        assert g.shape == (3, 5) and np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5)


@pytest.mark.parametrize("forms", [memory_forms.PLAIN, memory_forms.GPU, cpu_forms.FORMS], ids=lambda f: f.name)
def test_each_programs_forms_equal_naive(forms, monkeypatch):
    """The head as each backend's program runs it (its block's positions and its softmax sums, the default
    chunking) against the full logits, values and gradients."""
    monkeypatch.setattr(backend, "memory_for_program", lambda: forms)
    hidden, unembedding, targets = _inputs(batch=3, length=45, vocab=700)

    def loss(fn, hidden, unembedding):
        log_probs, entropy = fn(hidden, unembedding, targets)
        return jnp.sum(log_probs * jnp.linspace(-1, 1, 45)) + 0.3 * jnp.sum(entropy), (log_probs, entropy)

    chunked = functools.partial(token_logprobs_and_entropy, temperature=0.8, logit_softcap=5.0, vocab_chunk=256)
    naive = functools.partial(token_logprobs_and_entropy_reference, temperature=0.8, logit_softcap=5.0)
    got, want = (jax.jit(jax.grad(functools.partial(loss, fn), argnums=(0, 1), has_aux=True))(hidden, unembedding)
                 for fn in (chunked, naive))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5)


@pytest.mark.parametrize("rows, length, chunk", [(16, 512, 512), (32, 512, 256), (2, 4352, 2176), (3, 1000, 1000),
                                                 (16, 520, 260), (8192, 4, 1), (1, 20000, 6667)])
def test_accelerator_blocks_cover_8192_tokens_balanced(rows, length, chunk, monkeypatch):
    """On an accelerator a logits block covers up to 8192 tokens (rows x positions), the length split as evenly
    as it goes into the fewest chunks that allows (the least padding for their number); a CPU keeps 128
    positions."""
    seen = []

    def spy(hidden, unembedding, targets, temperature, logit_softcap, sequence_chunk, vocab_chunk, vocab, online):
        seen.append((sequence_chunk, online))
        return jnp.zeros(hidden.shape[:2]), jnp.zeros(hidden.shape[:2])

    monkeypatch.setattr(logprobs, "_chunked_logprobs", spy)
    for forms, want in ((memory_forms.GPU, (chunk, memory_forms.one_pass_online_softmax)),
                        (cpu_forms.FORMS, (min(128, length), memory_forms.two_pass_online_softmax))):
        monkeypatch.setattr(backend, "memory_for_program", lambda forms=forms: forms)
        hidden = jax.ShapeDtypeStruct((rows, length, 8), jnp.bfloat16)
        jax.eval_shape(lambda h: token_logprobs_and_entropy(h, jnp.zeros((8, 64), jnp.bfloat16),
                                                            jnp.zeros((rows, length), jnp.int32)), hidden)
        assert seen.pop() == want
