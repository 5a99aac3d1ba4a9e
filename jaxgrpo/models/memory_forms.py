"""How the decoder reads and writes its weights and KV cache: one interface, a plain form for every backend
and a form for XLA:CPU.

The decoder's math reads the same on every backend. A few of its memory accesses cost XLA:CPU far more
than they cost an accelerator (bfloat16 slices and gathers run through float32, loop-invariant bitcasts
are hoisted out of loops into whole copies, weight products stream slowly), so for programs that run on
CPUs they are written differently. The decoder makes those accesses through a `MemoryForms`:

* `PLAIN`: the plain `lax` / `jax.numpy` operations, for TPU programs; products returned in the model's dtype
  (`product_in_dtype`, so that their backward products are bfloat16 GEMMs too);
* `GPU`: the plain operations, and a decode loop's weights split into one array per layer before the loop
  (`split_layers`): the layer scan slices a layer's weights out of the stacked arrays, which XLA:GPU copies
  before a Triton GEMM reads them, every step; RoPE's half rotation as the halves swapped (`swap_halves`), which
  XLA:GPU fuses with the new tokens' own scores where it launches a concatenate on its own;
* `jaxgrpo.models.cpu_forms.FORMS`: the XLA:CPU forms (bits behind optimization barriers, custom-JVP
  slices, 32-slot cache chunks, packed weights), each with the measurement that justifies it.

`jaxgrpo.models.backend.memory_for_program()` picks them for the program being traced (the CPU forms when it
runs on CPUs); values and derivatives are the same with either.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np



class MemoryForms(NamedTuple):
    """The decoder's memory accesses, each a function with the plain operation's meaning:

    name: "plain" or "cpu".
    to_carry: cache -> cache, as a decode loop carries it from step to step (a pytree of arrays);
    from_carry: (cache, dtype) -> cache: what `to_carry` gave, read back as `dtype` for the model.
    take_rows: (table, ids) -> table[ids], the embedding lookup.
    layer_weights: (params, stacks, index, packed) -> layer `index`'s weights, from `params` (the layer scan's
      slices of the stacked weights `stacks`), with those named in `packed` (packed weights' layers, or None)
      replaced by their packed stack at `index`.
    product: (spec, x, weight, dtype) -> einsum(spec, x, weight in `dtype`) accumulated in float32, returned in
      float32 or in `dtype` (the caller casts to `dtype`; a packed weight multiplies by its kernel).
    read_slots: (buffer, start, sizes) -> lax.dynamic_slice of a cache;
    write_slots: (buffer, update, start) -> lax.dynamic_update_slice into a cache (in place when donated).
    cache_chunk: capacity -> the slots a decode step reads per iteration when the live length is only known
      at run time (the live slots, rounded up to a chunk, are read).
    unembedding_table: (table, hidden) -> (table, hidden), the tied unembedding's operands as the decode
      loop's body reads them.
    pack_weights: model -> the weights a decode loop's calls multiply by, prepared once before the loop: packed
      for a CPU kernel (`cpu_forms.PackedWeights`), split per layer on a GPU (`LayerWeights`), or None.
    rotate_half: x -> [-x2, x1], x's halves along its last axis (RoPE's rotation, `rotate_half`).
    online_softmax: ((m, s[, w]), z) -> (m, s[, w]) after the float32 logits block z [..., chunk]: the online
      logsumexp of the log-prob head (`jaxgrpo.models.logprobs`) and of the sampler's blocks, m the running
      maximum, s = sum exp(z - m), w (when the state has it) = sum exp(z - m) z; `one_pass_online_softmax` or
      `two_pass_online_softmax`.
    logits_block_positions: (rows, length) -> the positions of each of `rows` rows the log-prob head's logits
      block covers (its sequence chunk; the vocabulary chunk is the head's own).
    """

    name: str
    to_carry: Callable[[Any], Any]
    from_carry: Callable[[Any, Any], Any]
    take_rows: Callable[[jax.Array, jax.Array], jax.Array]
    layer_weights: Callable[..., Any]
    product: Callable[[str, jax.Array, Any, Any], jax.Array]
    read_slots: Callable[..., jax.Array]
    write_slots: Callable[..., jax.Array]
    cache_chunk: Callable[[int], int]
    unembedding_table: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
    pack_weights: Callable[[Any], Any]
    rotate_half: Callable[[jax.Array], jax.Array]
    online_softmax: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]
    logits_block_positions: Callable[[int, int], int]


def rotate_half(x: jax.Array) -> jax.Array:
    """[-x2, x1] for x = [x1, x2] split in halves along its last axis (HF's rotate-half form of RoPE)."""
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _layer_weights(params, stacks, index, packed=None):
    if packed:
        raise ValueError("packed weights are multiplied by CPU programs only (Decoder.pack_weights packs none "
                         "elsewhere): pass packed_weights=None")
    return params


def _as_dtype(weight, dtype):
    """`weight` in `dtype`; the weight object itself when it already is (a quantized weight, whose product qwix
    computes, must reach it unconverted: see `layers._projection_weight`)."""
    return weight if weight.dtype == dtype else weight.astype(dtype)


class LayerWeights(NamedTuple):
    """A decoder's layer weights as one parameter state per layer (`split_layers`; `Decoder.pack_weights` on a
    GPU): the decoder runs its layers one after the other over them instead of scanning the stacks."""

    layers: tuple[Any, ...]


def split_layers(model) -> LayerWeights:
    """`model`'s layer weights split into one state per layer: an XLA computation run once before a decode loop (a
    copy of the layer weights), after which no step slices the stacked arrays. Compiled for an H100, the layer
    scan's slices were 888 MB of copies every decode step for Qwen3-0.6B (`benchmarks/gpu_programs.py`)."""
    from flax import nnx

    _, stacked = nnx.split(model.layers)
    return LayerWeights(tuple(jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(model.config.num_layers)))


def product_in_dtype(spec: str, x: jax.Array, weight, dtype) -> jax.Array:
    """einsum(spec, x, weight in `dtype`) returned in `dtype`: the GEMM accumulates in float32 and rounds once, as
    it writes (a float32 result cast afterwards, `float32_product`'s, rounds the same). What differs is the
    backward pass: differentiating a float32 result gives float32 cotangents, and JAX multiplies a float32
    cotangent by a bfloat16 operand as two float32 operands, so every backward product of a bfloat16 model ran
    as a float32 GEMM (TF32 at best on a GPU, half the bfloat16 rate) over float32 copies of its operands.
    Here the cotangents stay in `dtype` and the backward products are bfloat16 GEMMs accumulating in float32,
    as the forward's are. Compiled for an H100 (`benchmarks/gpu_programs.py --update`, Qwen3-0.6B): the
    update's float32 products went from 173 to none of its 413 TFLOP; for a TPU (`jaxgrpo-compile`, Qwen3-1.7B on
    v5e:2x4) the update's memory-bound estimate from 1.57 to 1.48 s. The CPU forms keep `float32_product`."""
    return jnp.einsum(spec, x, _as_dtype(weight, dtype), preferred_element_type=dtype)


def float32_product(spec: str, x: jax.Array, weight, dtype) -> jax.Array:
    """einsum(spec, x, weight in `dtype`) returned in float32 (the caller casts): XLA:CPU multiplies bfloat16 x
    bfloat16 -> float32 natively (AVX512-BF16) but converts both operands to float32 for a bfloat16 result, so the
    CPU forms (`cpu_forms`) multiply so."""
    return jnp.einsum(spec, x, _as_dtype(weight, dtype), preferred_element_type=jnp.float32)


def two_pass_online_softmax(state, z: jax.Array):
    """The online logsumexp's state (m, s[, w]) after the logits block `z` [..., chunk]: m the running maximum,
    s = sum exp(z - m) and (where the state has it) w = sum exp(z - m) z over the blocks so far, every entry of
    `state` shaped as z less its last axis. The block's maximum first, then its sums against the new maximum: two
    passes over `z`. What the CPU forms take: on a CPU the block's exponentials are the cost, one an element here
    against two in `one_pass_online_softmax` (the log-prob head's forward 1.6x slower with that)."""
    running_max, normalizer, *weighted_sum = state
    new_max = jnp.maximum(running_max, z.max(axis=-1))
    rescale = jnp.exp(running_max - new_max)
    p = jnp.exp(z - new_max[..., None])
    normalizer = normalizer * rescale + p.sum(axis=-1)
    return (new_max, normalizer, *(w * rescale + (p * z).sum(axis=-1) for w in weighted_sum))


def one_pass_online_softmax(state, z: jax.Array):
    """`two_pass_online_softmax` reading `z` once: one reduction whose elements are (maximum, sum, weighted sum)
    triples, combined as the online logsumexp combines blocks, then combined with `state`. A float32 logits block
    is read from memory once instead of twice: compiled for an H100 (`benchmarks/gpu_programs.py --update`,
    Qwen3-0.6B), the log-prob head's forward moved 41 GB less an update (two exponentials an element, which a
    memory-bound pass on an accelerator hides)."""
    def combine(a, b):
        m = jnp.maximum(a[0], b[0])
        scale_a, scale_b = jnp.exp(a[0] - m), jnp.exp(b[0] - m)
        return (m, *(x * scale_a + y * scale_b for x, y in zip(a[1:], b[1:])))

    zero = jnp.zeros((), z.dtype)
    lowest = jnp.asarray(jnp.finfo(z.dtype).min, z.dtype)  # finite: exp(lowest - lowest) is 1, never NaN
    operands, inits = (z, jnp.ones_like(z), z)[:len(state)], (lowest, zero, zero)[:len(state)]
    return combine(tuple(state), jax.lax.reduce(operands, inits, combine, (z.ndim - 1,)))


#: Tokens (rows x positions) an accelerator's log-prob head block covers: [8192, 8192] float32 logits, 268 MB.
LOGITS_BLOCK_TOKENS = 8192


def logits_block_positions(rows: int, length: int) -> int:
    """Positions of each row in an accelerator's log-prob head block: up to `LOGITS_BLOCK_TOKENS` tokens over the
    rows, the length split into that many chunks as evenly as it goes (the fewest padded positions). Each block
    slices the unembedding's vocabulary chunk afresh (a copy on a GPU) and adds its loop's launches: compiled for
    an H100 (Qwen3-0.6B, device_check's update, 16 rows of 512 completion tokens), whole rows (512 positions)
    against 128 moved 39 GB less an update in 10,272 fewer device operations."""
    chunks = -(-length // max(1, min(LOGITS_BLOCK_TOKENS // rows, length)))
    return -(-length // chunks)


PLAIN = MemoryForms(
    name="plain",
    to_carry=lambda cache: cache,
    from_carry=lambda cache, dtype: cache,
    take_rows=lambda table, ids: table[ids],
    layer_weights=_layer_weights,
    product=product_in_dtype,
    read_slots=jax.lax.dynamic_slice,
    write_slots=jax.lax.dynamic_update_slice,
    # A TPU reads the whole cache in one masked block: its vector units gain nothing from smaller steps.
    cache_chunk=lambda capacity: capacity,
    unembedding_table=lambda table, hidden: (table, hidden),
    pack_weights=lambda model: None,
    rotate_half=rotate_half,
    online_softmax=one_pass_online_softmax,
    logits_block_positions=logits_block_positions,
)

def swap_halves(x: jax.Array) -> jax.Array:
    """`rotate_half` as x's halves swapped (a reverse of [2, half]) times [-1, 1]: the same numbers (a sign
    flip is exact). Compiled for an H100, a decode step's query rotation then fuses with the new tokens' scores
    (`benchmarks/gpu_programs.py`: 448 -> 420 operations a step on Qwen3-0.6B); XLA:GPU emits the concatenate of
    `rotate_half` in a launch of its own. Not for TPUs: where the head dimension is split over devices, the reverse
    adds two all-gathers a layer to the decode (Qwen3-1.7B on v5e:2x4)."""
    halves = x.reshape(*x.shape[:-1], 2, x.shape[-1] // 2)
    sign = np.array([[-1], [1]], x.dtype)
    return (jnp.flip(halves, axis=-2) * sign).reshape(x.shape)


GPU = PLAIN._replace(name="gpu", pack_weights=split_layers, rotate_half=swap_halves)
