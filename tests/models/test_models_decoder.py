"""Decoder properties: packed sequences equal separate ones; remat changes memory, not gradients."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgrpo.models import Decoder, DecoderConfig

CONFIG = DecoderConfig(family="gemma3", vocab_size=53, hidden_size=32, intermediate_size=48, num_layers=2,
                       num_heads=2, num_kv_heads=1, head_dim=16, qk_norm=True, sliding_window=3,
                       layer_types=("sliding_attention", "full_attention"), tie_word_embeddings=True)


def test_packed_segments_equal_separate_sequences():
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    first, second = jnp.arange(1, 6)[None], jnp.arange(20, 27)[None]
    packed = jnp.concatenate([first, second, jnp.zeros((1, 2), jnp.int32)], axis=1)
    segment_ids = jnp.array([[1] * 5 + [2] * 7 + [0] * 2])
    logits = np.asarray(jax.jit(lambda m, t, s: m(t, segment_ids=s))(model, packed, segment_ids))
    alone = jax.jit(lambda m, t: m(t))
    np.testing.assert_allclose(logits[:, :5], np.asarray(alone(model, first)), atol=1e-5)
    np.testing.assert_allclose(logits[:, 5:12], np.asarray(alone(model, second)), atol=1e-5)


def test_remat_gives_identical_gradients():
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, CONFIG.vocab_size)

    def gradients(remat):
        graphdef, params = nnx.split(Decoder(CONFIG, remat=remat, rngs=nnx.Rngs(0)))
        loss = lambda p: jnp.mean(nnx.merge(graphdef, p).token_logprobs(tokens, jnp.roll(tokens, -1, 1))[0])  # noqa: E731
        return jax.jit(jax.grad(loss))(params)

    for plain, rematerialized in zip(jax.tree.leaves(gradients(False)), jax.tree.leaves(gradients(True))):
        np.testing.assert_allclose(np.asarray(rematerialized), np.asarray(plain), atol=1e-6)
