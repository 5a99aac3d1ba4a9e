"""How one program runs the decoder: its memory forms and its attention implementation, as one object.

The decoder's math reads the same on every backend. What differs per backend sits behind this one object:

* `memory` (`memory_forms.MemoryForms`): how the weights and the KV cache are read and written, and how the
  weights multiply (the plain `lax` forms on accelerators, with a decode loop's weights split per layer on a GPU;
  the XLA:CPU forms and packed weights on CPUs);
* `attention` (`jaxgrpo.models.attention.AttentionImplementation`): the training and scoring attention over a
  layout, and the reads of a cached call's caches (`cache_state`: a Pallas or C++ kernel, or the decoder's XLA
  math where it has none).

`Decoder.backend(mesh)` picks it once per call from the model's configured attention and the program's target:
the memory forms follow where the program runs (a CPU process compiling for a TPU gets the TPU's), the
attention follows the configuration ("auto": the platform's).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

from jaxgrpo.models import attention as attention_implementations
from jaxgrpo.models import cpu_forms, memory_forms
from jaxgrpo.models.attention import pallas_decode
from jaxgrpo.models.paged_cache import PagedKVCache, PagedRows, write_new_tokens
from jaxgrpo.models.partitioning import active_mesh


class Backend(NamedTuple):
    """The decoder's backend-specific parts for one program (see the module docstring)."""

    memory: memory_forms.MemoryForms
    attention: attention_implementations.AttentionImplementation

    def cache_state(self, q, cache_k, cache_v, layer, live, key_mask, sliding, *, window, scale, query_slot, mesh):
        """The online-softmax state of a cached call's queries over one cache's live slots read by the attention
        implementation's kernel (its `cache_state`), or None where it has none for this call: the decoder's XLA
        math then reads that cache."""
        if self.attention.cache_state is None:
            return None
        return self.attention.cache_state(q, cache_k, cache_v, layer, live, key_mask, sliding, window=window,
                                          scale=scale, query_slot=query_slot, mesh=mesh)

    @property
    def reads_pages_in_place(self) -> bool:
        """Whether the attention implementation reads a paged pool's blocks in place (`paged_state`), so a paged
        decode step costs the live blocks; without it the decoder's paged read gathers every row's blocks."""
        return self.attention.paged_state is not None

    def paged_state(self, q, pool_k, pool_v, tables, layer, lengths, starts, sliding, *, window, scale,
                    query_positions, mesh):
        """The online-softmax state of a paged decode step's queries over the rows' cached positions: the attention
        implementation's in-place reader (`paged_state`) where it has one, else the XLA reference
        (`pallas_decode.xla_paged_attention_state`, under `lax.cond` for a traced `sliding`)."""
        if self.attention.paged_state is not None:
            return self.attention.paged_state(q, pool_k, pool_v, tables, layer, lengths, starts, sliding,
                                              window=window, scale=scale, query_positions=query_positions, mesh=mesh)

        def run(window):
            return pallas_decode.xla_paged_attention_state(q, pool_k, pool_v, tables, layer, lengths, scale,
                                                           starts=starts, window=window,
                                                           query_positions=query_positions, mesh=mesh)

        return attention_implementations.with_window(run, sliding, window)

    def paged_attention(self, q, k, v, new_mask, pools, layer, sliding, *, window, scale, mesh):
        """A paged decode step's attention output [B, T, kv, G, D] over its new tokens (`new_mask` [B, T, T]: which
        each sees) and `pools`' rows, all in the attention implementation's kernels (its `paged_attention`), or
        None where it has none for this call: the decoder then merges `paged_state`'s states itself."""
        if self.attention.paged_attention is None:
            return None
        return self.attention.paged_attention(q, k, v, new_mask, pools, layer, sliding, window=window, scale=scale,
                                              mesh=mesh)

    def write_pages(self, rows: PagedRows, keys, values, valid, mesh) -> PagedKVCache:
        """The pool of `rows` with a paged step's new keys and values [L, R, kv, T, D] written where `valid` [R, T]
        (`paged_cache.write_new_tokens`), in the form the attention implementation asks for
        (`paged_writes_each`: one position at a time where a scatter would relayout the pool its kernel reads)."""
        return write_new_tokens(rows, keys, values, valid, mesh, each=self.attention.paged_writes_each)


_FORCE_CPU_FORMS = [False]


@contextlib.contextmanager
def force_cpu_forms(enabled: bool = True):
    """Within this context `memory_for_program()` gives the CPU forms whatever the target: to compile both and
    compare (`jaxgrpo-compile --cpu-forms`)."""
    previous, _FORCE_CPU_FORMS[0] = _FORCE_CPU_FORMS[0], enabled
    try:
        yield
    finally:
        _FORCE_CPU_FORMS[0] = previous


def memory_for_program() -> memory_forms.MemoryForms:
    """The memory forms of the program being traced: the CPU forms (`cpu_forms.FORMS`) for one that runs on CPUs
    (the active mesh's devices say so: a CPU process compiling for a TPU topology gets the plain forms) or within
    `force_cpu_forms`, `memory_forms.GPU` for one that runs on a GPU, else `memory_forms.PLAIN`."""
    platform = attention_implementations.target_platform(active_mesh())
    if _FORCE_CPU_FORMS[0] or platform == "cpu":
        return cpu_forms.FORMS
    return memory_forms.GPU if platform == "gpu" else memory_forms.PLAIN


def for_program(attention: str, mesh) -> Backend:
    """The backend of a program laid out on `mesh` (None: the default devices) for a model configured with
    `attention` ("auto" or one of `jaxgrpo.models.attention.NAMES`)."""
    platform = attention_implementations.target_platform(mesh)
    return Backend(memory_for_program(), attention_implementations.resolve(attention, platform))
