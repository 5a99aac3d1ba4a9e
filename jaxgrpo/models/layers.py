"""The decoder's transformer building blocks (`jaxgrpo.models.decoder.Decoder` stacks them): RoPE, RMSNorm, the
parameters with their `logical_axes`, the weight products, grouped-query attention, the gated MLP and the pre-norm
residual block.

A block's attention runs through the `attend(q, k, v)` its caller binds (the attention implementation's over a
layout in a forward, `jaxgrpo.models.cached_attention` in a cached call), so nothing here depends on how a call
reads its keys; its weights multiply through the program's memory forms (`jaxgrpo.models.memory_forms`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgrpo.models import memory_forms, remat
from jaxgrpo.models.config import PROJECTIONS, DecoderConfig, RopeConfig
from jaxgrpo.models.partitioning import constrain_activation


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """Inverse frequencies [head_dim // 2] of RoPE ("RoFormer", Su et al. 2021) with the config's scaling."""
    inv_freq = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if rope.rope_type == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.rope_type == "llama3":
        wavelength = 2 * np.pi / inv_freq
        low_freq_wavelength = rope.original_max_position_embeddings / rope.low_freq_factor
        high_freq_wavelength = rope.original_max_position_embeddings / rope.high_freq_factor
        scaled = np.where(wavelength > low_freq_wavelength, inv_freq / rope.factor, inv_freq)
        smooth = (rope.original_max_position_embeddings / wavelength - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
        inv_freq = np.where(is_medium, smoothed, scaled)
    return inv_freq.astype(np.float32)


def rope_tables(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos and sin [B, T, head_dim] for integer `positions` [B, T] (halves duplicated, HF layout)."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, rotate=memory_forms.rotate_half) -> jax.Array:
    """Rotate x [B, T, heads, head_dim] by the angles in cos/sin [B, T, head_dim] (rotate-half form); `rotate`
    computes [-x2, x1] (`memory_forms.rotate_half`, or a program's form of it: the same numbers)."""
    rotated = rotate(x)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


def rms_normalize(x: jax.Array, weight: jax.Array, eps: float, gemma: bool) -> tuple[jax.Array, jax.Array]:
    """(RMSNorm of x over its last axis scaled by `weight`, in x's dtype; the reciprocal root mean square
    r [..., 1], float32): Gemma scales by `(1 + w)` in float32 before casting back, Llama casts first, then scales
    by `w`."""
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    normed = x32 * r
    if gemma:
        return (normed * (1.0 + weight.astype(jnp.float32))).astype(x.dtype), r
    return weight.astype(x.dtype) * normed.astype(x.dtype), r


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def normalized_rope(x: jax.Array, weight: jax.Array, cos: jax.Array, sin: jax.Array, eps: float, gemma: bool,
                    rotate=memory_forms.rotate_half) -> jax.Array:
    """`apply_rope(RMSNorm(x))`, the per-head q and k norms and RoPE of Qwen3 and Gemma 3, x [B, T, heads,
    head_dim], with a backward pass of its own: the same values, the gradients written out in float32
    (`_normalized_rope_backward`). Differentiated as written, the norm's and the rotation's backward passes
    are several element-wise passes over bfloat16 intermediates that XLA:GPU runs apart: compiled for an H100
    (`benchmarks/gpu_programs.py --update`, Qwen3-0.6B), the update's q and k backward moved 234 GB; written
    out, 166 GB (the update 1.17 -> 1.10 TB outside its GEMMs)."""
    return apply_rope(rms_normalize(x, weight, eps, gemma)[0], cos, sin, rotate)


def _normalized_rope_forward(x, weight, cos, sin, eps, gemma, rotate):
    normed, r = rms_normalize(x, weight, eps, gemma)
    return apply_rope(normed, cos, sin, rotate), (x, weight, cos, sin, r)


def _normalized_rope_backward(eps, gemma, rotate, residuals, d_out):
    """With n = s * x r (s the weight, or 1 + the weight in Gemma; r = 1 / rms(x)) and out = n cos + rotate(n) sin:
    dn = d_out cos - rotate(d_out sin) (the rotation's transpose is its negation), dx = r (g - x r mean(g x r))
    with g = s dn, and ds = the sum of dn x r over every position and head."""
    del eps  # r is a residual
    x, weight, cos, sin, r = residuals
    d_out = d_out.astype(jnp.float32)
    d_normed = d_out * cos[:, :, None, :] - rotate(d_out * sin[:, :, None, :])
    normed = x.astype(jnp.float32) * r
    scale = weight.astype(jnp.float32) + (1.0 if gemma else 0.0)
    g = d_normed * scale
    d_x = r * (g - normed * jnp.mean(g * normed, axis=-1, keepdims=True))
    d_weight = jnp.sum(d_normed * normed, axis=tuple(range(x.ndim - 1)))
    return d_x.astype(x.dtype), d_weight.astype(weight.dtype), None, None


normalized_rope.defvjp(_normalized_rope_forward, _normalized_rope_backward)


def param(rngs: nnx.Rngs | None, shape, axes, param_dtype, init: str = "normal") -> nnx.Param:
    """A parameter with `logical_axes` metadata; `init` is normal(0.02), zeros or ones."""
    if init == "normal":
        value = 0.02 * jax.random.normal(rngs.params(), shape, param_dtype)
    else:
        value = (jnp.zeros if init == "zeros" else jnp.ones)(shape, param_dtype)
    return nnx.Param(value, logical_axes=tuple(axes))


class RMSNorm(nnx.Module):
    """RMSNorm ("Root Mean Square Layer Normalization", Zhang & Sennrich 2019), statistics in float32.

    Gemma scales by `(1 + w)` in float32 before casting back; Llama casts first, then scales by `w`.
    """

    def __init__(self, stack: tuple[int, ...], dim: int, axis_name: str, config: DecoderConfig, param_dtype):
        self.eps = config.rms_norm_eps
        self.gemma = config.is_gemma
        init = "zeros" if self.gemma else "ones"
        self.weight = param(None, (*stack, dim), ("layers",) * len(stack) + (axis_name,), param_dtype, init)

    @jax.named_scope("norm")
    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_normalize(x, self.weight[...], self.eps, self.gemma)[0]

    def with_rope(self, x: jax.Array, cos: jax.Array, sin: jax.Array, rotate=memory_forms.rotate_half) -> jax.Array:
        """`apply_rope(self(x), cos, sin, rotate)`, differentiated by `normalized_rope`'s backward pass."""
        return normalized_rope(x, self.weight[...], cos, sin, self.eps, self.gemma, rotate)


def _projection_weight(module: nnx.Module, name: str):
    """`module`'s projection weight `name` as its product takes it: a parameter's array, or the weight itself where
    it is not a parameter (qwix's quantized weights, QLoRA). The object itself, not a view of it: qwix's
    interception (`jaxgrpo.models.lora`) finds which weight a product multiplies by identity."""
    weight = getattr(module, name)
    return weight[...] if isinstance(weight, nnx.Variable) else weight


def _product(spec: str, x: jax.Array, weight, dtype, forms: memory_forms.MemoryForms) -> jax.Array:
    """`einsum(spec, x, weight)` in `dtype`, accumulated in float32 and rounded once: `forms.product` returns
    `dtype` on accelerators (`memory_forms.product_in_dtype`: the backward's products stay bfloat16 GEMMs) and
    float32 on CPUs (`memory_forms.float32_product`, what XLA:CPU multiplies natively), cast here. A decode's
    packed weight multiplies through its kernel."""
    return forms.product(spec, x, weight, dtype).astype(dtype)


class Attention(nnx.Module):
    """Grouped-query attention with RoPE; optional q/k/v bias (Qwen2) and per-head q/k RMSNorm (Qwen3, Gemma 3)."""

    def __init__(self, config: DecoderConfig, stack, *, dtype, param_dtype, rngs: nnx.Rngs):
        c = config
        lead = ("layers",) * len(stack)
        self.config = c
        self.dtype = dtype
        self.q = param(rngs, (*stack, c.hidden_size, c.num_heads, c.head_dim), lead + PROJECTIONS["q"].axes, param_dtype)
        self.k = param(rngs, (*stack, c.hidden_size, c.num_kv_heads, c.head_dim), lead + PROJECTIONS["k"].axes, param_dtype)
        self.v = param(rngs, (*stack, c.hidden_size, c.num_kv_heads, c.head_dim), lead + PROJECTIONS["v"].axes, param_dtype)
        self.o = param(rngs, (*stack, c.num_heads, c.head_dim, c.hidden_size), lead + PROJECTIONS["o"].axes, param_dtype)
        if c.qkv_bias:
            self.q_bias = param(rngs, (*stack, c.num_heads, c.head_dim), lead + ("heads", "head_dim"), param_dtype)
            self.k_bias = param(rngs, (*stack, c.num_kv_heads, c.head_dim), lead + ("kv_heads", "head_dim"), param_dtype)
            self.v_bias = param(rngs, (*stack, c.num_kv_heads, c.head_dim), lead + ("kv_heads", "head_dim"), param_dtype)
        if c.qk_norm:
            self.q_norm = RMSNorm(stack, c.head_dim, "head_dim", c, param_dtype)
            self.k_norm = RMSNorm(stack, c.head_dim, "head_dim", c, param_dtype)

    def _project(self, x, name, forms):
        y = _product("btd,dhk->bthk", x, _projection_weight(self, name), self.dtype, forms)
        if self.config.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(self.dtype)
        return remat.name(y, remat.QKV)

    def __call__(self, x, cos, sin, attend, forms, mesh=None):
        """x [B, T, E] -> (output [B, T, E], the new tokens' (k, v) [B, T, kv_heads, head_dim]).

        `attend(q, k, v)` is this layer's attention over the call's keys (the decoder binds it: the attention
        implementation's over a layout in a forward, `attend_cached` in a cached call), q [B, T, kv_heads,
        G, head_dim] -> [B, T, kv_heads, G, head_dim]. `forms` (`memory_forms`) multiplies the weights. `mesh`
        (or None) lays out the activations: rows over the batch axes, heads over `model`.
        """
        c = self.config
        heads = lambda y, name: constrain_activation(y, ("batch", None, name, None), mesh)  # noqa: E731
        # Named scopes label the parts in profiles (jaxgrpo.profiling).
        with jax.named_scope("attention"), jax.named_scope("qkv"):
            q, k, v = self._project(x, "q", forms), self._project(x, "k", forms), self._project(x, "v", forms)
            if c.qk_norm:
                q = self.q_norm.with_rope(q, cos, sin, forms.rotate_half)
                k = self.k_norm.with_rope(k, cos, sin, forms.rotate_half)
            else:
                q, k = apply_rope(q, cos, sin, forms.rotate_half), apply_rope(k, cos, sin, forms.rotate_half)
            q, k, v = heads(q, "heads"), heads(k, "kv_heads"), heads(v, "kv_heads")
        batch, length = q.shape[:2]
        with jax.named_scope("attention"), jax.named_scope("core"):
            out = attend(q.reshape(batch, length, c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim), k, v)
            out = remat.name(out, remat.ATTENTION)
        with jax.named_scope("attention"), jax.named_scope("out"):
            out = heads(out.reshape(batch, length, c.num_heads, c.head_dim), "heads")
            out = remat.name(_product("bthk,hkd->btd", out, _projection_weight(self, "o"), self.dtype, forms),
                             remat.ATTENTION_OUT)
            return constrain_activation(out, ("batch", None, None), mesh), (k, v)


class MLP(nnx.Module):
    """Gated MLP: down(act(gate(x)) * up(x)), SiLU (Llama, Qwen) or tanh-GELU (Gemma)."""

    def __init__(self, config: DecoderConfig, stack, *, dtype, param_dtype, rngs: nnx.Rngs):
        lead = ("layers",) * len(stack)
        e, f = config.hidden_size, config.intermediate_size
        self.dtype = dtype
        self.gemma = config.is_gemma
        self.gate = param(rngs, (*stack, e, f), lead + PROJECTIONS["gate"].axes, param_dtype)
        self.up = param(rngs, (*stack, e, f), lead + PROJECTIONS["up"].axes, param_dtype)
        self.down = param(rngs, (*stack, f, e), lead + PROJECTIONS["down"].axes, param_dtype)

    @jax.named_scope("mlp")
    def __call__(self, x, forms, mesh=None):
        hidden = lambda y: constrain_activation(y, ("batch", None, "mlp"), mesh)  # noqa: E731
        project = lambda name: remat.name(  # noqa: E731
            hidden(_product("bte,ef->btf", x, _projection_weight(self, name), self.dtype, forms)), remat.MLP_HIDDEN)
        gate = project("gate")
        gate = jax.nn.gelu(gate, approximate=True) if self.gemma else jax.nn.silu(gate)
        up = project("up")
        out = _product("btf,fe->bte", gate * up, _projection_weight(self, "down"), self.dtype, forms)
        return constrain_activation(out, ("batch", None, None), mesh)


class Block(nnx.Module):
    """Pre-norm residual block; Gemma also normalizes the attention and MLP outputs."""

    def __init__(self, config: DecoderConfig, stack, *, dtype, param_dtype, rngs: nnx.Rngs):
        e = config.hidden_size
        self.attn_norm = RMSNorm(stack, e, "norm", config, param_dtype)
        self.attn = Attention(config, stack, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.mlp_norm = RMSNorm(stack, e, "norm", config, param_dtype)
        self.mlp = MLP(config, stack, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gemma = config.is_gemma
        if self.gemma:
            self.attn_out_norm = RMSNorm(stack, e, "norm", config, param_dtype)
            self.mlp_out_norm = RMSNorm(stack, e, "norm", config, param_dtype)

    def __call__(self, x, cos, sin, attend, forms, mesh=None):
        rows = lambda y: constrain_activation(y, ("batch", "sequence", None), mesh)  # noqa: E731
        x = rows(x)
        y, new_kv = self.attn(self.attn_norm(x), cos, sin, attend, forms, mesh)
        x = rows(x + (self.attn_out_norm(y) if self.gemma else y))
        y = self.mlp(self.mlp_norm(x), forms, mesh)
        return rows(x + (self.mlp_out_norm(y) if self.gemma else y)), new_kv
