"""Decoder properties: packed sequences equal separate ones; RoPE rotates by its angles in every memory form (remat:
tests/models/test_remat.py)."""

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


def test_rope_rotates_each_pair_of_halves_by_its_angle_in_every_memory_form():
    """`apply_rope` is HF Llama's rotation x cos + [-x2, x1] sin, to the bit, in float32 and bfloat16, with the
    half rotation of every memory form (concatenated halves; the GPU's halves swapped and signed); and each pair
    (x1_i, x2_i) is turned by its angle."""
    from jaxgrpo.models import cpu_forms, memory_forms
    from jaxgrpo.models.layers import apply_rope, rope_tables

    inv_freq = (1.0 / 10000 ** (np.arange(0, 16, 2) / 16)).astype(np.float32)
    cos, sin = rope_tables(jnp.arange(12).reshape(2, 6) * 7, inv_freq)
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jax.random.normal(jax.random.key(1), (2, 6, 3, 16)).astype(dtype)
        rotated_half = jnp.concatenate([-x[..., 8:], x[..., :8]], axis=-1).astype(jnp.float32)
        want = np.asarray((x.astype(jnp.float32) * cos[:, :, None] + rotated_half * sin[:, :, None]).astype(dtype),
                          np.float32)
        for forms in (memory_forms.PLAIN, memory_forms.GPU, cpu_forms.FORMS):
            got = jax.jit(apply_rope, static_argnums=3)(x, cos, sin, forms.rotate_half)
            assert got.dtype == dtype
            np.testing.assert_array_equal(np.asarray(got, np.float32), want, err_msg=forms.name)
    x = jax.random.normal(jax.random.key(2), (2, 6, 3, 16))
    got = apply_rope(x, cos, sin)
    angle = np.arctan2(np.asarray(sin[..., :8]), np.asarray(cos[..., :8]))[:, :, None]
    x1, x2 = np.asarray(x[..., :8]), np.asarray(x[..., 8:])
    np.testing.assert_allclose(got[..., :8], x1 * np.cos(angle) - x2 * np.sin(angle), atol=1e-5)
    np.testing.assert_allclose(got[..., 8:], x2 * np.cos(angle) + x1 * np.sin(angle), atol=1e-5)
