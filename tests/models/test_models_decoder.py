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


def _norm_then_rope(x, weight, cos, sin, eps, gemma, rotate):
    """The q/k norm and RoPE as the decoder wrote them before `normalized_rope`: differentiated by JAX."""
    from jaxgrpo.models.layers import apply_rope

    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if gemma:
        normed = (normed * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)
    else:
        normed = weight.astype(x.dtype) * normed.astype(x.dtype)
    return apply_rope(normed, cos, sin, rotate)


def test_normalized_rope_equals_norm_then_rope_values_and_gradients():
    """`normalized_rope` (the q and k norms and RoPE, with a written-out backward pass) gives the values of the norm
    followed by RoPE to the bit, and JAX's gradients of them: to float32 rounding in float32; within bfloat16's
    precision in bfloat16, where the written-out pass keeps its intermediates in float32 (autodiff rounds the
    norm's output gradient to bfloat16). Llama's and Gemma's scaling, every memory form's half rotation."""
    from jaxgrpo.models import cpu_forms, memory_forms
    from jaxgrpo.models.layers import normalized_rope, rope_tables

    inv_freq = (1.0 / 10000 ** (np.arange(0, 16, 2) / 16)).astype(np.float32)
    cos, sin = rope_tables(jnp.arange(14).reshape(2, 7) * 5, inv_freq)
    keys = jax.random.split(jax.random.key(4), 3)
    weights = jax.random.normal(keys[1], (7, 3, 16))
    for dtype, gemma, forms in [(jnp.float32, False, memory_forms.PLAIN), (jnp.float32, True, memory_forms.GPU),
                                (jnp.bfloat16, False, memory_forms.GPU), (jnp.bfloat16, True, cpu_forms.FORMS)]:
        x = (3.0 * jax.random.normal(keys[0], (2, 7, 3, 16))).astype(dtype)
        weight = (1.0 + 0.3 * jax.random.normal(keys[2], (16,))).astype(dtype)

        def loss(fn, x, weight):
            out = fn(x, weight, cos, sin, 1e-6, gemma, forms.rotate_half)
            return jnp.sum(out.astype(jnp.float32) * weights), out

        (got_d_x, got_d_w), got = jax.jit(jax.grad(lambda x, w: loss(normalized_rope, x, w), (0, 1), has_aux=True))(
            x, weight)
        (want_d_x, want_d_w), want = jax.jit(jax.grad(lambda x, w: loss(_norm_then_rope, x, w), (0, 1),
                                                      has_aux=True))(x, weight)
        label = f"{jnp.dtype(dtype).name} gemma={gemma} {forms.name}"
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32), err_msg=label)
        assert got_d_x.dtype == dtype and got_d_w.dtype == dtype
        for g, w in ((got_d_x, want_d_x), (got_d_w, want_d_w)):
            g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
            if dtype == jnp.float32:
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=label)
            else:
                np.testing.assert_allclose(g, w, atol=2e-2 * np.abs(w).max(), err_msg=label)


def test_qwen3_layer_gradients_equal_autodiff_of_norm_then_rope(monkeypatch):
    """A Qwen3 decoder's loss gradient with `normalized_rope` equals the one with the norm and RoPE differentiated
    by JAX (float32)."""
    from jaxgrpo.models import layers

    config = DecoderConfig(family="qwen3", vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True)
    model = Decoder(config, rngs=nnx.Rngs(1))
    tokens = jax.random.randint(jax.random.key(5), (2, 9), 0, 61)
    graphdef, state = nnx.split(model)

    def loss(state):
        logits = nnx.merge(graphdef, state)(tokens)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    def gradients():
        jaxpr = str(jax.make_jaxpr(loss)(state))
        return jax.jit(jax.grad(loss))(state), jaxpr.count("custom_vjp_call")

    got, written_out = gradients()
    monkeypatch.setattr(layers, "normalized_rope", _norm_then_rope)
    jax.clear_caches()  # the layer scan's body is traced once per function otherwise
    want, differentiated = gradients()
    assert (written_out, differentiated) == (2, 0)  # q and k in the scanned layer's body; then none (the premise)
    assert float(jnp.abs(got["layers"]["attn"]["q_norm"]["weight"][...]).max()) > 0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)
