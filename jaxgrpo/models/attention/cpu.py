"""The CPU implementation: the XLA math for training and scoring, and for the sampler's one-token cached
steps the C++ kernel `cpu_attention`, which reads the live cache slots in place (AVX-512; ~8% faster
bfloat16 decode on a 2-core CPU, docs/sampler.md) wherever it is built and the program is an unsharded
CPU one. Elsewhere the cached path runs its XLA form. (The decoder's other XLA:CPU forms, how it reads
and writes weights and the cache, are `jaxgrpo.models.cpu_forms`: they follow the program's target, not
the attention implementation.)"""

from __future__ import annotations

from jaxgrpo.models import cpu_attention, cpu_forms
from jaxgrpo.models.attention import AttentionImplementation, xla


def read_cache_block(q, cache_k, cache_v, layer, mask, live, scale):
    """`cpu_attention.cache_block` over caches as the decoder holds them (a bfloat16 one read as its bits)."""
    return cpu_attention.cache_block(q, cpu_forms.as_bits(cache_k), cpu_forms.as_bits(cache_v), layer, mask, live,
                                     scale)


def cache_reader(cache_dtype, head_dim: int, query_length: int, mesh):
    """`read_cache_block` for a cached call with a run-time cache index that `cpu_attention` serves, else None."""
    return read_cache_block if cpu_attention.use_for(cache_dtype, head_dim, query_length, mesh) else None


IMPLEMENTATION = AttentionImplementation(
    name="cpu", platforms=("cpu",), prepare=xla.prepare, attend=xla.attend, cache_reader=cache_reader)
