"""A decode step's weight products as a C++ custom call on XLA:CPU with AVX512-BF16.

At decode batch sizes each weight element serves a few dozen rows, so a product's speed is how fast
the weight streams through the multiply. XLA:CPU's kernels read a [K, N] weight at ~100-230 GFLOP/s
for SmolLM2's shapes at batch 32; `cpu_matmul.cc` reads weights packed in the operand order of the
bfloat16 dot-product instruction, sequentially, at ~400 (docs/sampler.md). The sampler packs the
weights once per call (`pack`, ~270 MB for SmolLM2 in bfloat16) before its decode loop, and the
decoder's one-token calls multiply by the packed weights (`PackedWeight.product`); the prefill and
training keep XLA's products. Operands are bfloat16 and the products accumulate in float32, as the
decoder's `_product` (`jaxgrpo.models.layers`) does; only the order of the float32 additions differs.

Used on an unsharded program on the CPU backend with a bfloat16 compute dtype (`use_for`); the kernel
is built and registered by `cpu_kernels` (`JAXGRPO_CPU_MATMUL=0` turns it off). It has no derivative.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxgrpo.models import cpu_kernels

TARGET = "jaxgrpo_cpu_matmul"
BLOCK = 32  # output columns per packed block


def available() -> bool:
    """Whether the kernel is built, loaded and registered here (False, with a logged reason, without a
    compiler, without AVX512-BF16, or when `JAXGRPO_CPU_MATMUL=0`)."""
    return cpu_kernels.register(TARGET, "JAXGRPO_CPU_MATMUL", "AVX512-BF16")


def use_for(dtype, mesh) -> bool:
    """Whether a decode with compute dtype `dtype` should multiply by packed weights: bfloat16, an
    unsharded program on the CPU backend, and the kernel available."""
    return (jnp.dtype(dtype) == jnp.bfloat16 and (mesh is None or mesh.size == 1)
            and cpu_kernels.targets_cpu(mesh) and available())


@dataclasses.dataclass(frozen=True)
class PackedWeight:
    """A stack of L matrices [L, *in_shape, *out_shape] packed for the kernel, and which one to use.

    bits: uint16 [L, ceil(N / 32), ceil(K / 2), 64] (K, N the sizes of in_shape and out_shape; block b,
    pair p holds W[2p, 32b + c] at 2c and W[2p + 1, 32b + c] at 2c + 1, zero past K or N).
    layer: the matrix that `product` multiplies by (a traced index inside a layer loop).
    """

    bits: jax.Array
    layer: jax.Array | int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]

    def __getitem__(self, key):
        # A module reads its parameters as `param[...]`; the packed weight stands in for the array.
        if key is not Ellipsis:
            raise TypeError(f"a PackedWeight is read whole (`[...]`), got index {key!r}")
        return self

    def at(self, layer) -> PackedWeight:
        """The same stack, multiplying by matrix `layer`."""
        return dataclasses.replace(self, layer=layer)

    def product(self, x: jax.Array) -> jax.Array:
        """x [..., *in_shape] times the matrix: float32 [..., *out_shape] (bfloat16 operands)."""
        if not available():
            raise RuntimeError("the cpu_matmul kernel is not available here (no C++ compiler, no AVX512-BF16, or "
                               "JAXGRPO_CPU_MATMUL=0; the log says which): multiply by the unpacked weights")
        n_in = len(self.in_shape)
        if tuple(x.shape[x.ndim - n_in:]) != self.in_shape:
            raise ValueError(f"x's last axes must be {self.in_shape}, got shape {x.shape}")
        lead = x.shape[: x.ndim - n_in]
        depth = 2 * self.bits.shape[2]
        rows = jnp.reshape(x.astype(jnp.bfloat16), (-1, math.prod(self.in_shape)))
        rows = jnp.pad(rows, ((0, 0), (0, depth - rows.shape[1])))
        out = jax.ffi.ffi_call(
            TARGET, jax.ShapeDtypeStruct((rows.shape[0], self.bits.shape[1] * BLOCK), jnp.float32),
            vmap_method="sequential",
        )(jax.lax.bitcast_convert_type(rows, jnp.uint16), self.bits, jnp.asarray(self.layer, jnp.int32))
        return out[:, : math.prod(self.out_shape)].reshape(*lead, *self.out_shape)


jax.tree_util.register_dataclass(PackedWeight, data_fields=["bits", "layer"],
                                 meta_fields=["in_shape", "out_shape"])


def pack(weights: jax.Array, in_dims: int, *, out_first: bool = False) -> PackedWeight:
    """Packs a stack of matrices for the kernel (an XLA computation; no gradient flows through it).

    weights: [L, *in, *out] with `in_dims` input axes, or with `out_first` [L, *out, *in] (an embedding
    table [V, E] multiplying hidden states [.., E] as its own transpose); cast to bfloat16.
    """
    if in_dims < 1 or weights.ndim < in_dims + 2:
        raise ValueError(f"weights must be a stack [L, *in, *out] with in_dims >= 1 input axes and an output "
                         f"axis, got shape {weights.shape} and in_dims={in_dims}")
    shape = weights.shape[1:]
    in_shape, out_shape = ((shape[len(shape) - in_dims:], shape[: len(shape) - in_dims]) if out_first
                           else (shape[:in_dims], shape[in_dims:]))
    layers, k, n = weights.shape[0], math.prod(in_shape), math.prod(out_shape)
    pairs, blocks = -(-k // 2), -(-n // BLOCK)
    # Integer bits from the start: XLA:CPU moves bfloat16 arrays through float32.
    bits = jax.lax.bitcast_convert_type(jax.lax.stop_gradient(weights).astype(jnp.bfloat16), jnp.uint16)
    if out_first:
        bits = jnp.pad(bits.reshape(layers, n, k), ((0, 0), (0, blocks * BLOCK - n), (0, 2 * pairs - k)))
        bits = bits.reshape(layers, blocks, BLOCK, pairs, 2).transpose(0, 1, 3, 2, 4)
    else:
        bits = jnp.pad(bits.reshape(layers, k, n), ((0, 0), (0, 2 * pairs - k), (0, blocks * BLOCK - n)))
        bits = bits.reshape(layers, pairs, 2, blocks, BLOCK).transpose(0, 3, 1, 4, 2)
    return PackedWeight(bits.reshape(layers, blocks, pairs, 2 * BLOCK), 0, tuple(in_shape), tuple(out_shape))
