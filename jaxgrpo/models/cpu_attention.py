"""Decode attention over the live KV-cache slots as a C++ custom call on XLA:CPU.

A decode step's attention over the completion cache is small batched products, one [G, D] x [D, S]
per (row, kv head), over slots that XLA:CPU first copies out of the cache (it copies every dynamic
slice that a product reads). `cpu_attention.cc` computes the same online-softmax state reading the
cache in place, with AVX-512; on SmolLM2's batch-32 bfloat16 decode it made a step ~8% faster
(docs/sampler.md). The decoder uses it for cached one-token calls with a run-time cache index on an
unsharded CPU program (`use_for`); otherwise, and wherever it cannot be built, the XLA form runs.

The library is compiled at first use with the C++ compiler (`$CXX`, else `g++`) for this machine
(`-march=native`) into `$XDG_CACHE_HOME/jaxgrpo` (else `~/.cache/jaxgrpo`), keyed by the source, the
flags and the jax version, and registered as an XLA FFI target. `JAXGRPO_CPU_ATTENTION=0` turns it off.
The call has no derivative: the decoder uses it only where nothing differentiates (the sampler's decode).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

logger = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_attention.cc")
TARGET = "jaxgrpo_cpu_attention"
ENV_SWITCH = "JAXGRPO_CPU_ATTENTION"
# No -ffast-math: linked into a shared library it sets flush-to-zero for the whole process on load.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-std=c++17", "-shared", "-fPIC")
HEAD_DIMS = (64, 128)
CACHE_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))


def _library_path(compiler: str) -> str:
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + repr((FLAGS, compiler, jax.__version__)).encode()).hexdigest()[:16]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "jaxgrpo", f"cpu_attention-{key}.so")


def _build(compiler: str, path: str) -> None:
    """Compiles the library to `path` (written to a temporary file first, so concurrent builds are safe)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, scratch = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        command = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", "-o", scratch, SOURCE]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
        os.replace(scratch, path)
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)


@functools.cache
def available() -> bool:
    """Whether the kernel is built, loaded and registered here (built at the first call; False, with a
    logged reason, without a compiler, without AVX-512, or when `JAXGRPO_CPU_ATTENTION=0`)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        logger.info("no C++ compiler (CXX or g++): decode attention runs as XLA operations")
        return False
    path = _library_path(compiler)
    try:
        if not os.path.exists(path):
            logger.info("building the CPU decode-attention kernel: %s", path)
            _build(compiler, path)
        library = ctypes.cdll.LoadLibrary(path)
    except (OSError, RuntimeError) as error:
        logger.warning("the CPU decode-attention kernel could not be built (%s): attention runs as XLA operations",
                       error)
        return False
    if not library.jaxgrpo_cpu_attention_available():
        logger.info("this CPU has no AVX-512: decode attention runs as XLA operations")
        return False
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.jaxgrpo_cpu_attention), platform="cpu")
    return True


def use_for(cache_dtype, head_dim: int, query_length: int, mesh) -> bool:
    """Whether a cached call with a run-time cache index should use the kernel: one new token per row,
    a bfloat16 or float32 cache with a supported head size, an unsharded program on the CPU backend."""
    return (query_length == 1 and jnp.dtype(cache_dtype) in CACHE_DTYPES and head_dim in HEAD_DIMS
            and (mesh is None or mesh.size == 1) and jax.default_backend() == "cpu" and available())


def cache_block(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array, layer, mask: jax.Array, live, scale: float):
    """Online-softmax state (max, normalizer [B, kv, G, 1]; output [B, kv, G, 1, D] float32) of the
    queries q [B, 1, kv, G, D] over layer `layer`'s cache slots below `live` that `mask` keeps.

    cache_k, cache_v: the whole caches [L, R, kv, C, D] as stored (bfloat16 caches as their uint16 bits,
    the decoder's `_bits`, or float32) with R = B / share rows, row b reading cache row b // share (a
    prompt cache shared by its samples); mask [R, 1, C].
    """
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
