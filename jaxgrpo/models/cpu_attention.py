"""Decode attention over the live KV-cache slots as a C++ custom call on XLA:CPU.

A decode step's attention over the completion cache is small batched products, one [G, D] x [D, S]
per (row, kv head), over slots that XLA:CPU first copies out of the cache (it copies every dynamic
slice that a product reads). `cpu_attention.cc` computes the same online-softmax state reading the
cache in place, with AVX-512; on SmolLM2's batch-32 bfloat16 decode it made a step ~8% faster
(docs/sampler.md). The decoder uses it for cached one-token calls with a run-time cache index on an
unsharded CPU program (`use_for`); otherwise, and wherever it cannot be built, the XLA form runs.

The kernel is built and registered by `cpu_kernels` (`JAXGRPO_CPU_ATTENTION=0` turns it off).
The call has no derivative: the decoder uses it only where nothing differentiates (the sampler's decode).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.models import cpu_kernels

TARGET = "jaxgrpo_cpu_attention"
HEAD_DIMS = (64, 128)
CACHE_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))


def available() -> bool:
    """Whether the kernel is built, loaded and registered here (built at the first call; False, with a
    logged reason, without a compiler, without AVX-512, or when `JAXGRPO_CPU_ATTENTION=0`)."""
    return cpu_kernels.register(TARGET, "JAXGRPO_CPU_ATTENTION", "AVX-512")


def use_for(cache_dtype, head_dim: int, query_length: int, mesh) -> bool:
    """Whether a cached call with a run-time cache index should use the kernel: one new token per row,
    a bfloat16 or float32 cache with a supported head size, an unsharded program on the CPU backend."""
    return (query_length == 1 and jnp.dtype(cache_dtype) in CACHE_DTYPES and head_dim in HEAD_DIMS
            and (mesh is None or mesh.size == 1) and cpu_kernels.targets_cpu(mesh) and available())


def cache_block(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array, layer, mask: jax.Array, live, scale: float):
    """Online-softmax state (max, normalizer [B, kv, G, 1]; output [B, kv, G, 1, D] float32) of the
    queries q [B, 1, kv, G, D] over layer `layer`'s cache slots below `live` that `mask` keeps.

    cache_k, cache_v: the whole caches [L, R, kv, C, D] as stored (bfloat16 caches as their uint16 bits,
    the decoder's `_bits`, or float32) with R = B / share rows, row b reading cache row b // share (a
    prompt cache shared by its samples); mask [R, 1, C].
    """
    if not available():
        raise RuntimeError("the cpu_attention kernel is not available here (no C++ compiler, no AVX-512, or "
                           "JAXGRPO_CPU_ATTENTION=0; the log says which): use the decoder's XLA form")
    if cache_k.dtype not in (jnp.uint16, jnp.float32) or cache_v.dtype != cache_k.dtype:
        raise ValueError(f"caches must be bfloat16 bits (uint16) or float32, got {cache_k.dtype} and {cache_v.dtype}")
    _, cache_rows, kv_heads, _, head_dim = cache_k.shape
    batch, groups = q.shape[0], q.shape[3]
    if batch % cache_rows:
        raise ValueError(f"the cache's {cache_rows} rows must divide the {batch} query rows")
    state = jax.ShapeDtypeStruct((batch, kv_heads, groups), jnp.float32)
    top, total, out = jax.ffi.ffi_call(
        TARGET, (state, state, jax.ShapeDtypeStruct((batch, kv_heads, groups, head_dim), jnp.float32)),
        vmap_method="sequential",
    )(q[:, 0].astype(jnp.float32), cache_k, cache_v, mask[:, 0].astype(bool),
      jnp.asarray(layer, jnp.int32), jnp.asarray(live, jnp.int32), scale=np.float32(scale),
      share=np.int64(batch // cache_rows))
    return top[..., None], total[..., None], out[..., None, :]
