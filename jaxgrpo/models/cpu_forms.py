"""The decoder's memory forms for XLA:CPU (`memory_forms.MemoryForms`; traced only for programs that run on CPUs).

Each form answers a cost of XLA:CPU's, measured on a 2-core CPU, that an accelerator does not have; the
values and derivatives are those of the plain forms (`memory_forms.PLAIN`):

* narrow floats (bfloat16) read and written through their bits, and read inside the loop that uses them
  behind an optimization barrier (`read_slots`, `write_slots`, `layer_weights`, `take_rows`,
  `unembedding_table`), the cache carried by a decode loop as bits (`to_carry`);
* a decode step reads the cache in CACHE_CHUNK-slot chunks (`cache_chunk`);
* a decode loop's one-token products multiply by weights packed for `cpu_matmul`'s kernel
  (`pack_weights`, `product`).

The C++ decode-attention kernel (`cpu_attention`) is the `cpu` attention implementation's
(`jaxgrpo.models.attention.cpu`); it reads a bfloat16 cache through `as_bits`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxgrpo.models import cpu_matmul
from jaxgrpo.models.config import PROJECTIONS
from jaxgrpo.models.memory_forms import MemoryForms, float32_product, rotate_half, two_pass_online_softmax
from jaxgrpo.models.partitioning import active_mesh


class PackedWeights(NamedTuple):
    """The weights a decode step multiplies by, packed for `cpu_matmul` (`Decoder.pack_weights`).

    layers: {(module, parameter), e.g. ("attn", "q"): the layer stack packed}; unembedding: the output
    projection packed.
    """

    layers: dict[tuple[str, str], cpu_matmul.PackedWeight]
    unembedding: cpu_matmul.PackedWeight


# The layers' weights that multiply activations, with how many of their axes (after the layer axis)
# the product contracts: q/k/v [E, heads, D], o [heads, D, E], gate/up [E, F], down [F, E].
_PRODUCT_WEIGHTS = {(p.module, name): p.contracted for name, p in PROJECTIONS.items()}


# Slots of the KV cache read per iteration when the live length is only known at run time: a decode
# step reads the live slots rounded up to a chunk. On a 2-core CPU, SmolLM2's batch-32 decode of 128
# tokens ran ~1.2x faster with 64 than with 128; 32 then measured 5-11% faster than 64 in bfloat16
# (4 of 4 alternating runs; 16 was slower) and no different in float32 (docs/sampler.md).
CACHE_CHUNK = 32


def cache_chunk(capacity: int) -> int:
    """The slots a decode step reads per iteration: CACHE_CHUNK, or the whole capacity if smaller."""
    return min(CACHE_CHUNK, capacity)


# A cache of a narrow float type (bfloat16) is read and written through its bits. XLA's CPU backend
# runs bfloat16 slicing in float32: it converts the whole cache to float32 and back around each decode
# step's one-slot write, and converts it again (hoisted out of the layer loop) to read it. Through the
# bits, a write into a 30-layer, 32-row, 960-slot cache took 1.6 ms instead of 13 ms here, and the
# reads of a step 11 ms instead of 42. A loop that carries a bfloat16 cache should carry its bits
# (`to_carry`), as the sampler does: XLA:CPU otherwise copies the whole cache's bits once per step to
# read them. Derivatives are those of the plain slice and update (the shared-prefix forward takes them).


def _is_narrow(x: jax.Array) -> bool:
    """Whether x is of a float type narrower than 32 bits (bfloat16, float16): read through its bits."""
    return x.dtype.itemsize < 4 and jnp.issubdtype(x.dtype, jnp.floating)


def as_bits(x: jax.Array) -> jax.Array:
    """x of a narrow float type as its bits (an unsigned integer of the same width); others as they are.
    A bitcast costs nothing on any backend."""
    if not _is_narrow(x):
        return x
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))


def from_bits(x: jax.Array, dtype) -> jax.Array:
    """What `as_bits` gave, read back as `dtype` (an array already of `dtype` as it is)."""
    return x if x.dtype == dtype else jax.lax.bitcast_convert_type(x, dtype)


def to_carry(cache):
    """A cache (any pytree of arrays, e.g. a `KVCache`) as a decode loop carries it: a bfloat16 one as its
    bits, wider types as they are. The loop hands the model `from_carry(cache, dtype)` each step, so
    XLA:CPU reads and writes the cache in place instead of copying it whole every step (see above)."""
    return jax.tree.map(as_bits, cache)


def from_carry(cache, dtype):
    """The cache `to_carry` returned, read back as `dtype` (a cache already of `dtype` as it is)."""
    dtype = jnp.dtype(dtype)

    def read(path, x):
        if x.dtype != dtype and (jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize != dtype.itemsize):
            raise ValueError(f"from_carry: the cache's {jax.tree_util.keystr(path, simple=True)} holds {x.dtype}, "
                             f"not the bits of {dtype}")
        return from_bits(x, dtype)

    return jax.tree_util.tree_map_with_path(read, cache)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _read_slots(buffer: jax.Array, start, sizes) -> jax.Array:
    """`lax.dynamic_slice(buffer, start, sizes)` of a cache (see above)."""
    return from_bits(jax.lax.dynamic_slice(as_bits(buffer), start, sizes), buffer.dtype)


@_read_slots.defjvp
def _read_slots_jvp(sizes, primals, tangents):
    (buffer, start), (buffer_dot, _) = primals, tangents
    return _read_slots(buffer, start, sizes), jax.lax.dynamic_slice(buffer_dot, start, sizes)


@jax.custom_jvp
def _write_slots(buffer: jax.Array, update: jax.Array, start) -> jax.Array:
    """`lax.dynamic_update_slice(buffer, update, start)` into a cache, in place when donated (see above)."""
    return from_bits(jax.lax.dynamic_update_slice(as_bits(buffer), as_bits(update), start), buffer.dtype)


@_write_slots.defjvp
def _write_slots_jvp(primals, tangents):
    (buffer, update, start), (buffer_dot, update_dot, _) = primals, tangents
    return _write_slots(buffer, update, start), jax.lax.dynamic_update_slice(buffer_dot, update_dot, start)


# Weights of a narrow float type meet the same XLA:CPU float32 fallback: slicing a layer's weights out of
# the stack (the layer scan) or gathering embedding rows converts the whole bfloat16 stack or table to
# float32 (once per call, hoisted out of the decode loop), and every product then runs in float32. So
# the layer scan slices the weights' bits and the embedding gathers its rows' bits; derivatives are
# those of the plain slice and gather.
#
# The bits are read inside the loop that uses them, behind an optimization barrier with a value that
# changes every iteration (the layer index, the token ids). Otherwise XLA hoists the bitcast out of the
# loop, and XLA:CPU then writes every stack's bits to a new buffer once per call: 270 MB for SmolLM2 in
# each sampler call, ~80,000 freshly faulted pages, ~0.1 s of a 0.46 s prefill. Behind the barrier the
# bitcast fuses into the slice or gather, which reads the parameter in place.


def _read_inside(arrays, varying):
    """`arrays` as a loop body sees them, tied to `varying` (a value of this iteration): computations on
    them stay in the loop instead of being hoisted out of it (see above). No data moves."""
    return jax.lax.optimization_barrier((arrays, varying))


@jax.custom_jvp
def _as_stored(value: jax.Array, bits: jax.Array) -> jax.Array:
    """`value` (a layer's weight, sliced by the scan), computed from `bits` (the same slice of the
    weight's bits); only the tangent of `value` is used, so XLA drops its unused float slice."""
    return from_bits(bits, value.dtype)


@_as_stored.defjvp
def _as_stored_jvp(primals, tangents):
    (value, bits), (value_dot, _) = primals, tangents
    return _as_stored(value, bits), value_dot


def _layer_weights(params, stacks, index, packed=None):
    """Layer `index`'s weights: `params` (the scan's slices of the stacked weights), each narrow-float one
    read from the bits of its stack in `stacks` (the whole stacked weights) inside the loop, and each one
    named in `packed` (`PackedWeights.layers`) replaced by its packed stack at `index`."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [leaf for _, leaf in with_paths]
    stack_leaves = treedef.flatten_up_to(stacks)
    if packed:
        names = [tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey)) for path, _ in with_paths]
        for i, name in enumerate(names):
            if name in packed:
                leaves[i] = packed[name].at(index)
    narrow = [i for i, x in enumerate(stack_leaves)
              if _is_narrow(x) and not isinstance(leaves[i], cpu_matmul.PackedWeight)]
    if narrow:
        frozen, index = _read_inside([jax.lax.stop_gradient(stack_leaves[i]) for i in narrow], index)
        for i, stack in zip(narrow, frozen):
            leaves[i] = _as_stored(leaves[i], jax.lax.dynamic_index_in_dim(as_bits(stack), index, keepdims=False))
    return jax.tree.unflatten(treedef, leaves)


@jax.custom_jvp
def _take_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """`table[ids]` (the embedding lookup), gathered through the table's bits."""
    if not _is_narrow(table):
        return table[ids]
    frozen, ids = _read_inside(table, ids)
    return from_bits(as_bits(frozen)[ids], table.dtype)


@_take_rows.defjvp
def _take_rows_jvp(primals, tangents):
    (table, ids), (table_dot, _) = primals, tangents
    return _take_rows(table, ids), table_dot[ids]


def _unembedding_table(table: jax.Array, hidden: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The tied unembedding's table read inside the decode loop: XLA otherwise hoists a transposed copy of
    it out of the loop."""
    return _read_inside(table, hidden)


def _product(spec: str, x: jax.Array, weight, dtype) -> jax.Array:
    """The plain product, or for a `cpu_matmul.PackedWeight` (a decode's packed weights) the CPU kernel's,
    which contracts x's trailing axes as every `spec` of the decoder does; float32 either way."""
    if isinstance(weight, cpu_matmul.PackedWeight):
        return weight.product(x)
    return float32_product(spec, x, weight, dtype)


def _plain_products(model) -> bool:
    """Whether every projection of `model` multiplies by its parameter as it is: no LoRA adapters beside it, not
    quantized (`jaxgrpo.models.lora`). Those products are qwix's, which a packed weight would bypass."""
    from flax import nnx

    for (module, name) in _PRODUCT_WEIGHTS:
        block = getattr(model.layers, module)
        if not isinstance(getattr(block, name), nnx.Param) or hasattr(block, f"{name}_lora_a"):
            return False
    return True


def pack_weights(model) -> PackedWeights | None:
    """A decoder's weights packed for its decode loop's one-token calls through `cpu_matmul`, or None where
    that kernel does not apply (see `cpu_matmul.use_for`).

    An XLA computation, run once before the loop (a copy of the weights, 270 MB for SmolLM2)."""
    if not cpu_matmul.use_for(model.dtype, active_mesh(model.embed[...])) or not _plain_products(model):
        return None
    layers = {name: cpu_matmul.pack(getattr(getattr(model.layers, name[0]), name[1])[...], in_dims)
              for name, in_dims in _PRODUCT_WEIGHTS.items()}
    if model.config.tie_word_embeddings:
        unembedding = cpu_matmul.pack(model.embed[...][None], 1, out_first=True)
    else:
        unembedding = cpu_matmul.pack(model.lm_head[...][None], 1)
    return PackedWeights(layers, unembedding)


#: Positions of each row in the log-prob head's logits block on a CPU (the head's default before the accelerators
#: took larger blocks; docs/models.md measures the head with it).
LOGITS_BLOCK_POSITIONS = 128


FORMS = MemoryForms(
    name="cpu", to_carry=to_carry, from_carry=from_carry, take_rows=_take_rows, layer_weights=_layer_weights,
    product=_product, read_slots=_read_slots, write_slots=_write_slots, cache_chunk=cache_chunk,
    unembedding_table=_unembedding_table, pack_weights=pack_weights, rotate_half=rotate_half,
    online_softmax=two_pass_online_softmax, logits_block_positions=lambda rows, length: LOGITS_BLOCK_POSITIONS)
