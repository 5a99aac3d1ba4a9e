"""The CPU implementation: the XLA math for training and scoring, and for one-token cached steps (the
sampler's, the engine's) the C++ kernel `cpu_attention`, which reads the live cache slots in place (AVX-512;
~8% faster bfloat16 decode on a 2-core CPU, docs/sampler.md) wherever it is built and the program is an
unsharded CPU one. Elsewhere the cached path runs the decoder's XLA math. (How the decoder reads and writes
weights and the cache on a CPU are its memory forms, `jaxgrpo.models.cpu_forms`: they follow the program's
target, not the attention implementation.)"""

from __future__ import annotations

import jax.numpy as jnp

from jaxgrpo.models import cpu_attention, cpu_forms
from jaxgrpo.models.attention import AttentionImplementation, xla


def cache_state(q, cache_k, cache_v, layer, live, key_mask, sliding, *, window=None, scale: float, query_slot=None,
                mesh=None):
    """`cpu_attention.cache_block` over one cache as the decoder holds it (a bfloat16 one read as its bits), for a
    call that the kernel serves (`cpu_attention.use_for`); None otherwise (the decoder's XLA math reads it).
    The interface's `cache_state` (`jaxgrpo.models.attention.AttentionImplementation`)."""
    if not cpu_attention.use_for(cache_k.dtype, cache_k.shape[-1], q.shape[1], mesh):
        return None
    query_slots = (live if query_slot is None else query_slot) + jnp.arange(q.shape[1])
    kept = key_mask.astype(bool) & (jnp.arange(key_mask.shape[1]) < live)[None]
    mask = xla.build_attention_mask(query_slots, kept)
    if window:
        mask = jnp.where(sliding, xla.build_attention_mask(query_slots, kept, window), mask)
    return cpu_attention.cache_block(q, cpu_forms.as_bits(cache_k), cpu_forms.as_bits(cache_v), layer, mask, live,
                                     scale)


IMPLEMENTATION = AttentionImplementation(
    name="cpu", platforms=("cpu",), prepare=xla.prepare, attend=xla.attend, cache_state=cache_state)
