"""How one program runs the decoder: its memory forms and its attention implementation, as one object.

The decoder's math reads the same on every backend. What differs per backend sits behind this one object:

* `memory` (`memory_forms.MemoryForms`): how the weights and the KV cache are read and written, and how the
  weights multiply (the plain `lax` forms on accelerators, the XLA:CPU forms and packed weights on CPUs);
* `attention` (`jaxgrpo.models.attention.AttentionImplementation`): the training and scoring attention over a
  layout, and the reads of a cached call's caches (`cache_state`: a Pallas or C++ kernel, or the decoder's XLA
  math where it has none).

`Decoder.backend(mesh)` picks it once per call from the model's configured attention and the program's target:
the memory forms follow where the program runs (a CPU process compiling for a TPU gets the TPU's), the
attention follows the configuration ("auto": the platform's).
"""

from __future__ import annotations

from typing import NamedTuple

from jaxgrpo.models import attention as attention_implementations
from jaxgrpo.models import memory_forms


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


def for_program(attention: str, mesh) -> Backend:
    """The backend of a program laid out on `mesh` (None: the default devices) for a model configured with
    `attention` ("auto" or one of `jaxgrpo.models.attention.NAMES`)."""
    platform = attention_implementations.target_platform(mesh)
    return Backend(memory_forms.for_program(), attention_implementations.resolve(attention, platform))
