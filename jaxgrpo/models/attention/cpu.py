"""The CPU implementation: the XLA math for training and scoring, and for the sampler's one-token cached
steps the C++ kernel `cpu_attention`, which reads the live cache slots in place (AVX-512; ~8% faster
bfloat16 decode on a 2-core CPU, docs/sampler.md) wherever it is built and the program is an unsharded
CPU one. Elsewhere the cached path runs its XLA form."""

from __future__ import annotations

from jaxgrpo.models import cpu_attention
from jaxgrpo.models.attention import AttentionImplementation, xla


def cache_kernel(cache_dtype, head_dim: int, query_length: int, mesh) -> bool:
    """Whether a cached call with a run-time cache index reads the cache through `cpu_attention`."""
    return cpu_attention.use_for(cache_dtype, head_dim, query_length, mesh)


IMPLEMENTATION = AttentionImplementation(
    name="cpu", platforms=("cpu",), prepare=xla.prepare, attend=xla.attend, cache_kernel=cache_kernel)
