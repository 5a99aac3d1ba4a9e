"""A decoder-only transformer in `flax.nnx` covering Llama, Qwen2, Qwen3 and Gemma 3.

The layers' parameters are stacked along a leading `layers` axis and run with one `lax.scan`,
so compile time does not grow with depth. Every parameter carries `logical_axes` metadata
(e.g. `("layers", "embed", "heads", "head_dim")`) that `partitioning.shard_model` maps onto a mesh.

Calling conventions (`B` batch, `T` new tokens, `C` cache capacity, `L` layers, `V` vocabulary):

* Training / scoring: `logits = model(tokens[B, T])`, optionally with `positions[B, T]` and either
  `attention_mask[B, T]` (True for real tokens; left padding) or `segment_ids[B, T]` (packed
  sequences; tokens attend within their own segment, id 0 is padding). Without `positions`, they
  count real tokens (left padding) or restart at each segment.
* Packed prompt groups (a tree of branches): with `segment_ids`, `branch_ids[B, T]` splits a segment
  into a shared trunk (branch 0, e.g. a prompt) and branches (ids >= 1, e.g. the G completions of that
  prompt, laid out one after the other). A token attends to the earlier trunk tokens of its segment and
  the earlier tokens of its own branch, never to another branch; `positions` are then required (each
  branch continues the trunk's positions) and Gemma's sliding windows count positions, not slots.
* Sampling with the KV cache:

      cache = model.init_cache(batch_size, capacity)          # KVCache of [L, B, kv_heads, C, head_dim]
      logits, cache = model(tokens, positions, cache=cache, cache_index=i, kv_mask=kv_mask)

  writes the T new tokens' keys and values at cache slots [i, i + T) with `lax.dynamic_update_slice`
  (in place when the cache is donated), and the query at slot i + t attends to the slots
  s <= i + t for which `kv_mask[b, s]` is True (for Gemma's sliding layers, also s > i + t - window).
  `kv_mask` is bool[B, C] and must already mark the T slots being written. Prefill is the same
  call with the prompt and `cache_index=0`; RoPE uses `positions`, so left-padded prompts decode
  exactly like unpadded ones. `cache_index` may be traced.
* A shared prefix: G rows continuing the same prompt can read that prompt's keys and values from
  one copy instead of G. Pass `prefix=KVCache` of [L, P_rows, kv_heads, P, head_dim] (a prefill's
  cache) and `prefix_mask` bool[P_rows, P] with a cached call whose batch is a multiple of P_rows:
  row r reads prefix row r // (batch // P_rows) in full, its slots placed before the row cache's
  (so with the row cache's slot i at distance P + i - s from prefix slot s for sliding windows).
  Each prompt's keys are then read once per step for all its rows, with their queries stacked
  into one product, and stored once.
* Packed weights (a decode loop on CPU): `packed = model.pack_weights()` once before the loop, then
  `model(..., packed_weights=packed)` multiplies by them through `cpu_matmul`'s kernel (bfloat16,
  unsharded, AVX512-BF16; None elsewhere, where passing None changes nothing). No derivative.

The two purposes have their own entry points: `forward(tokens, positions, layout)` (training and scoring:
hidden states, with an `AttentionLayout` saying padded, segments or branches) and `decode_step(...)` (a
cached call); `hidden_states` and `__call__` dispatch to them from the keyword arguments above. Training
and scoring attention runs through an implementation of `jaxgrpo.models.attention` (`attention=` at
construction: "auto" is splash attention on a TPU, with the Pallas decode kernel for the sampler's decode steps,
and the XLA math plus the CPU decode kernel on a CPU).

Logits are float32 whatever the compute dtype.

On a mesh (one set with `jax.set_mesh`, or the one the parameters are sharded on) activations are
constrained as `partitioning.constrain_activation` says: rows over `data`/`fsdp`, attention heads and
the MLP hidden over `model`; without one nothing is constrained and the numerics are unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgrpo.models import attention as attention_implementations
from jaxgrpo.models import cpu_attention, cpu_kernels, cpu_matmul
from jaxgrpo.models.attention import AttentionLayout
from jaxgrpo.models.attention.xla import MASKED_SCORE as _MASKED_SCORE
from jaxgrpo.models.attention.xla import build_attention_mask, build_branch_mask  # noqa: F401 (re-exported)
from jaxgrpo.models.config import DecoderConfig, RopeConfig
from jaxgrpo.models.logprobs import soft_cap, token_logprobs_and_entropy
from jaxgrpo.models.partitioning import active_mesh, constrain_activation

class KVCache(NamedTuple):
    """Keys and values of every layer: `k`, `v` of shape [layers, batch, kv_heads, capacity, head_dim].

    Heads-major, so a decode step reads each (row, head)'s live slots as one contiguous block.
    """

    k: jax.Array
    v: jax.Array

    def as_bits(self) -> KVCache:
        """This cache with a 16-bit float type (bfloat16) held as its bits (uint16); wider types as they are.

        A loop that carries a bfloat16 cache from step to step should carry its bits, and hand the model
        `from_bits(dtype)` each step: XLA:CPU then reads and writes the cache in place instead of copying
        it whole every step (see `_read_slots`). A bitcast costs nothing on any backend.
        """
        return KVCache(_bits(self.k), _bits(self.v))

    def from_bits(self, dtype) -> KVCache:
        """The cache `as_bits` returned, read back as `dtype` (a cache already of `dtype` as it is)."""
        dtype = jnp.dtype(dtype)
        for name, x in zip(self._fields, self):
            if x.dtype != dtype and (jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize != dtype.itemsize):
                raise ValueError(f"KVCache.from_bits: {name} holds {x.dtype}, not the bits of {dtype}")
        return KVCache(_from_bits(self.k, dtype), _from_bits(self.v, dtype))


class PackedWeights(NamedTuple):
    """The weights a decode step multiplies by, packed for `cpu_matmul` (`Decoder.pack_weights`).

    layers: {(module, parameter), e.g. ("attn", "q"): the layer stack packed}; unembedding: the output
    projection packed.
    """

    layers: dict[tuple[str, str], cpu_matmul.PackedWeight]
    unembedding: cpu_matmul.PackedWeight


# The layers' weights that multiply activations, with how many of their axes (after the layer axis)
# the product contracts: q/k/v [E, heads, D], o [heads, D, E], gate/up [E, F], down [F, E].
_PRODUCT_WEIGHTS = {("attn", "q"): 1, ("attn", "k"): 1, ("attn", "v"): 1, ("attn", "o"): 2,
                    ("mlp", "gate"): 1, ("mlp", "up"): 1, ("mlp", "down"): 1}


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """Inverse frequencies [head_dim // 2] of RoPE ("RoFormer", Su et al. 2021) with the config's scaling."""
    inv_freq = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if rope.rope_type == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.rope_type == "llama3":
        wavelength = 2 * np.pi / inv_freq
        low_freq_wavelength = rope.original_max_position_embeddings / rope.low_freq_factor
        high_freq_wavelength = rope.original_max_position_embeddings / rope.high_freq_factor
        scaled = np.where(wavelength > low_freq_wavelength, inv_freq / rope.factor, inv_freq)
        smooth = (rope.original_max_position_embeddings / wavelength - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
        inv_freq = np.where(is_medium, smoothed, scaled)
    return inv_freq.astype(np.float32)


def rope_tables(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos and sin [B, T, head_dim] for integer `positions` [B, T] (halves duplicated, HF layout)."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, T, heads, head_dim] by the angles in cos/sin [B, T, head_dim] (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


def positions_from_mask(attention_mask: jax.Array | None, segment_ids: jax.Array | None, length: int) -> jax.Array:
    """Default positions [B, T]: count of earlier real tokens (left padding) or offset within the segment."""
    index = jnp.arange(length)
    if segment_ids is not None:
        starts = jnp.concatenate(
            [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
        )
        segment_start = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
        return (index - segment_start).astype(jnp.int32)
    if attention_mask is not None:
        return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)
    return jnp.broadcast_to(index, (1, length)).astype(jnp.int32)


def _param(rngs: nnx.Rngs | None, shape, axes, param_dtype, init: str = "normal") -> nnx.Param:
    """A parameter with `logical_axes` metadata; `init` is normal(0.02), zeros or ones."""
    if init == "normal":
        value = 0.02 * jax.random.normal(rngs.params(), shape, param_dtype)
    else:
        value = (jnp.zeros if init == "zeros" else jnp.ones)(shape, param_dtype)
    return nnx.Param(value, logical_axes=tuple(axes))


class RMSNorm(nnx.Module):
    """RMSNorm ("Root Mean Square Layer Normalization", Zhang & Sennrich 2019), statistics in float32.

    Gemma scales by `(1 + w)` in float32 before casting back; Llama casts first, then scales by `w`.
    """

    def __init__(self, stack: tuple[int, ...], dim: int, axis_name: str, config: DecoderConfig, param_dtype):
        self.eps = config.rms_norm_eps
        self.gemma = config.is_gemma
        init = "zeros" if self.gemma else "ones"
        self.weight = _param(None, (*stack, dim), ("layers",) * len(stack) + (axis_name,), param_dtype, init)

    @jax.named_scope("norm")
    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.gemma:
            return (normed * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


# Slots of the KV cache read per iteration when the live length is only known at run time: a decode
# step reads the live slots rounded up to a chunk. On a 2-core CPU, SmolLM2's batch-32 decode of 128
# tokens ran ~1.2x faster with 64 than with 128; 32 then measured 5-11% faster than 64 in bfloat16
# (4 of 4 alternating runs; 16 was slower) and no different in float32 (docs/sampler.md).
CACHE_CHUNK = 32


def _softmax_block(scores: jax.Array, values_fn) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A block of keys as (max, normalizer, unnormalized output), the online-softmax state.

    The max is held constant under differentiation: the normalized output does not depend on it.
    """
    top = jax.lax.stop_gradient(scores.max(axis=-1))
    weights = jnp.exp(scores - top[..., None])
    return top, weights.sum(axis=-1), values_fn(weights)


def _merge_blocks(a, b):
    """The online-softmax state of two blocks of keys together (exact: rescales both to the larger max)."""
    top = jnp.maximum(a[0], b[0])
    scale_a, scale_b = jnp.exp(a[0] - top), jnp.exp(b[0] - top)
    return top, a[1] * scale_a + b[1] * scale_b, a[2] * scale_a[..., None] + b[2] * scale_b[..., None]


# A cache of a narrow float type (bfloat16) is read and written through its bits. XLA's CPU backend
# runs bfloat16 slicing in float32: it converts the whole cache to float32 and back around each decode
# step's one-slot write, and converts it again (hoisted out of the layer loop) to read it. Through the
# bits, a write into a 30-layer, 32-row, 960-slot cache took 1.6 ms instead of 13 ms here, and the
# reads of a step 11 ms instead of 42. A loop that carries a bfloat16 cache should carry its bits
# (`KVCache.as_bits`), as the sampler does: XLA:CPU otherwise copies the whole cache's bits once per
# step to read them. Derivatives are those of the plain slice and update (the shared-prefix forward
# takes them).


# The CPU forms above (reads through bits behind barriers, CACHE_CHUNK) answer XLA:CPU's costs; they are
# traced only for a program that runs on CPUs, as the active mesh's devices say (a CPU process compiling
# for a TPU gets the plain forms). `cpu_forms(True)` forces them on any target, to compare both compiled.
_FORCE_CPU_FORMS = [False]


@contextlib.contextmanager
def cpu_forms(enabled: bool = True):
    """Within this context, trace the CPU-specific forms whatever the target (see above)."""
    previous, _FORCE_CPU_FORMS[0] = _FORCE_CPU_FORMS[0], enabled
    try:
        yield
    finally:
        _FORCE_CPU_FORMS[0] = previous


def _cpu_forms() -> bool:
    return _FORCE_CPU_FORMS[0] or cpu_kernels.targets_cpu(active_mesh())


def _is_narrow(x: jax.Array) -> bool:
    """Whether x is of a float type narrower than 32 bits (bfloat16, float16) in a CPU program: read
    through its bits."""
    return x.dtype.itemsize < 4 and jnp.issubdtype(x.dtype, jnp.floating) and _cpu_forms()


def _bits(x: jax.Array) -> jax.Array:
    if not _is_narrow(x):
        return x
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))


def _from_bits(x: jax.Array, dtype) -> jax.Array:
    return x if x.dtype == dtype else jax.lax.bitcast_convert_type(x, dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _read_slots(buffer: jax.Array, start, sizes) -> jax.Array:
    """`lax.dynamic_slice(buffer, start, sizes)` of a cache (see above)."""
    return _from_bits(jax.lax.dynamic_slice(_bits(buffer), start, sizes), buffer.dtype)


@_read_slots.defjvp
def _read_slots_jvp(sizes, primals, tangents):
    (buffer, start), (buffer_dot, _) = primals, tangents
    return _read_slots(buffer, start, sizes), jax.lax.dynamic_slice(buffer_dot, start, sizes)


@jax.custom_jvp
def _write_slots(buffer: jax.Array, update: jax.Array, start) -> jax.Array:
    """`lax.dynamic_update_slice(buffer, update, start)` into a cache, in place when donated (see above)."""
    return _from_bits(jax.lax.dynamic_update_slice(_bits(buffer), _bits(update), start), buffer.dtype)


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
    return _from_bits(bits, value.dtype)


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
            leaves[i] = _as_stored(leaves[i], jax.lax.dynamic_index_in_dim(_bits(stack), index, keepdims=False))
    return jax.tree.unflatten(treedef, leaves)


@jax.custom_jvp
def _take_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """`table[ids]` (the embedding lookup), gathered through the table's bits."""
    if not _is_narrow(table):
        return table[ids]
    frozen, ids = _read_inside(table, ids)
    return _from_bits(_bits(frozen)[ids], table.dtype)


@_take_rows.defjvp
def _take_rows_jvp(primals, tangents):
    (table, ids), (table_dot, _) = primals, tangents
    return _take_rows(table, ids), table_dot[ids]


def _product(spec: str, x: jax.Array, weight, dtype) -> jax.Array:
    """`einsum(spec, x, weight)` in `dtype`, accumulated and returned by the kernel in float32, then cast:
    XLA:CPU runs a bfloat16 x bfloat16 -> float32 product natively (AVX512-BF16), but converts both
    operands to float32 for a bfloat16 result. The same rounding as a bfloat16 product on accelerators.
    A `cpu_matmul.PackedWeight` (a decode's packed weights) multiplies through the CPU kernel, which
    contracts x's trailing axes as every `spec` here does."""
    if isinstance(weight, cpu_matmul.PackedWeight):
        return weight.product(x).astype(dtype)
    return jnp.einsum(spec, x, weight.astype(dtype), preferred_element_type=jnp.float32).astype(dtype)


def _prefix_block(q, prefix, layer, prefix_mask, scale, dtype):
    """Online-softmax state [B, kv, G, T(, D)] of the queries over their rows' shared prefix.

    q [B, T, kv, G, D]; prefix (k, v) [L, P_rows, kv, P, D], of which layer `layer` is read;
    prefix_mask [P_rows, T, P]. Row r reads prefix row r // share: the share rows of a prefix row
    stack their queries into one [share * G * T, D] x [D, P] product per (prefix row, kv head).
    """
    prefix_k, prefix_v = prefix
    _, prefix_rows, kv_heads, prefix_length, head_dim = prefix_k.shape
    batch, length, _, groups, _ = q.shape
    share = batch // prefix_rows
    queries = share * groups * length
    q_rows = jnp.transpose(q.reshape(prefix_rows, share, length, kv_heads, groups, head_dim), (0, 3, 1, 4, 2, 5))
    q_rows = q_rows.reshape(prefix_rows, kv_heads, queries, head_dim)

    def read(buffer):  # [P_rows, kv, P, D]
        return _read_slots(buffer, (layer, 0, 0, 0, 0), (1,) + buffer.shape[1:])[0].astype(dtype)

    scores = jnp.einsum("bkqd,bksd->bkqs", q_rows, read(prefix_k), preferred_element_type=jnp.float32) * scale
    scores = scores.reshape(prefix_rows, kv_heads, share, groups, length, prefix_length)
    scores = jnp.where(prefix_mask[:, None, None, None], scores, _MASKED_SCORE)
    values = read(prefix_v)

    def prefix_values(weights):  # [P_rows, kv, share, G, T, P] -> [P_rows, kv, share, G, T, D] float32
        flat = weights.astype(dtype).reshape(prefix_rows, kv_heads, queries, prefix_length)
        out = jnp.einsum("bkqs,bksd->bkqd", flat, values, preferred_element_type=jnp.float32)
        return out.reshape(prefix_rows, kv_heads, share, groups, length, head_dim)

    top, total, out = _softmax_block(scores, prefix_values)

    def to_rows(x):  # [P_rows, kv, share, G, T, ...] -> [B, kv, G, T, ...]
        x = jnp.swapaxes(x, 1, 2)
        return x.reshape(batch, kv_heads, groups, length, *x.shape[5:])

    return to_rows(top), to_rows(total), to_rows(out)


def _attend_with_cache(q, new_scores, v, cache, layer, cache_mask, cache_index, scale, dtype, prefix=None, prefix_mask=None,
                       mesh=None, cache_kernel=None, cache_blocks=None):
    """Attention output [B, T, kv, G, D] over the shared prefix, the live cache and the T new tokens.

    q [B, T, kv, G, D]; new_scores [B, kv, G, T, T] (scaled, masked); v [B, T, kv, D]; cache the
    whole (k, v) [L, B, kv, C, D], of which layer `layer` is read; cache_mask [B, T, C]; prefix
    (k, v) [L, P_rows, kv, P, D] with prefix_mask [P_rows, T, P], or None. The blocks of keys
    (prefix, cached slots, new tokens) combine exactly through their online-softmax states. Only
    slots below `cache_index` are read, straight from the whole cache (never a per-layer copy): a
    static index slices them (differentiable, as the shared-prefix forward needs); a traced one
    runs over CACHE_CHUNK-slot chunks, so a decode step's work grows with the live length and not
    with the capacity. Scores against the cache are one [G*T, D] x [D, S] product per (row, kv
    head), with no transposes of the cache. Where the attention implementation's `cache_kernel(cache
    dtype, head_dim, T, mesh)` says so (the `cpu` one: a one-token call of an unsharded CPU program, where
    the kernel is built), the live slots are read in place through `cpu_attention` instead. With a traced
    index and `cache_blocks` (`Decoder.decode_step`'s, from the implementation's `cache_state`: pallas_tpu's
    decode kernel), `cache_blocks(q, layer)` gives the cached slots' and the prefix's state together.
    """
    cache_k, cache_v = cache
    _, batch, kv_heads, capacity, head_dim = cache_k.shape
    length, groups = q.shape[1], q.shape[3]
    q_rows = jnp.transpose(q, (0, 2, 3, 1, 4)).reshape(batch, kv_heads, groups * length, head_dim)

    def read(buffer, start, size):  # layer `layer`'s slots [start, start + size): [B, kv, size, D]
        return _read_slots(buffer, (layer, 0, 0, start, 0), (1, batch, kv_heads, size, head_dim))[0].astype(dtype)

    def cached_scores(keys, mask):  # [B, kv, G, T, S] scaled, masked
        scores = jnp.einsum("bkqd,bksd->bkqs", q_rows, keys, preferred_element_type=jnp.float32) * scale
        scores = scores.reshape(batch, kv_heads, groups, length, keys.shape[2])
        return jnp.where(mask[:, None, None], scores, _MASKED_SCORE)

    def cached_values(probs, values):  # probs [B, kv, G, T, S] -> [B, kv, G, T, D] float32
        probs = probs.astype(dtype).reshape(batch, kv_heads, groups * length, values.shape[2])
        out = jnp.einsum("bkqs,bksd->bkqd", probs, values, preferred_element_type=jnp.float32)
        return out.reshape(batch, kv_heads, groups, length, head_dim)

    def new_values(probs):  # probs [B, kv, G, T, T] -> [B, kv, G, T, D] float32
        return jnp.einsum("bkgts,bskd->bkgtd", probs.astype(dtype), v, preferred_element_type=jnp.float32)

    def finish(state):  # online-softmax state -> [B, T, kv, G, D]
        _, total, out = state
        return jnp.transpose(out / total[..., None], (0, 3, 1, 2, 4)).astype(dtype)

    def with_prefix(state):  # merged with the shared prefix's block, if any
        if prefix is None:
            return state
        return _merge_blocks(state, _prefix_block(q, prefix, layer, prefix_mask, scale, dtype))

    if isinstance(cache_index, (int, np.integer)):
        live = int(cache_index)
        if live == 0:
            return finish(with_prefix(_softmax_block(new_scores, new_values)))
        # The live slots and the new tokens as one block.
        cached_v = read(cache_v, 0, live)
        scores = jnp.concatenate([cached_scores(read(cache_k, 0, live), cache_mask[..., :live]), new_scores], axis=-1)
        state = _softmax_block(scores, lambda w: cached_values(w[..., :live], cached_v) + new_values(w[..., live:]))
        return finish(with_prefix(state))

    state = _softmax_block(new_scores, new_values)
    if cache_blocks is not None:
        return finish(_merge_blocks(state, cache_blocks(q, layer)))
    if cache_kernel is not None and cache_kernel(cache_k.dtype, head_dim, length, mesh) and (
            prefix is None or prefix[0].dtype == cache_k.dtype):
        if prefix is not None:
            prefix_block = cpu_attention.cache_block(q, _bits(prefix[0]), _bits(prefix[1]), layer, prefix_mask,
                                                     prefix[0].shape[3], scale)
            state = _merge_blocks(state, prefix_block)
        cache_block = cpu_attention.cache_block(q, _bits(cache_k), _bits(cache_v), layer, cache_mask, cache_index, scale)
        return finish(_merge_blocks(state, cache_block))
    state = with_prefix(state)
    # A TPU reads the whole cache in one masked block: its vector units gain nothing from 32-slot steps.
    chunk = min(CACHE_CHUNK, capacity) if _cpu_forms() else capacity

    def one_chunk(i, state):
        start = i * chunk
        # The last chunk's start is clamped to fit the capacity; its slots below `start` were read already.
        first = jnp.minimum(start, capacity - chunk)
        mask = jax.lax.dynamic_slice_in_dim(cache_mask, start, chunk, axis=2)
        mask &= (first + jnp.arange(chunk) >= start)[None, None]
        scores = cached_scores(read(cache_k, start, chunk), mask)
        values = read(cache_v, start, chunk)
        return _merge_blocks(state, _softmax_block(scores, lambda w: cached_values(w, values)))

    num_chunks = (cache_index + chunk - 1) // chunk
    return finish(jax.lax.fori_loop(0, num_chunks, one_chunk, state))


class Attention(nnx.Module):
    """Grouped-query attention with RoPE; optional q/k/v bias (Qwen2) and per-head q/k RMSNorm (Qwen3, Gemma 3)."""

    def __init__(self, config: DecoderConfig, stack, *, dtype, param_dtype, rngs: nnx.Rngs):
        c = config
        lead = ("layers",) * len(stack)
        self.config = c
        self.dtype = dtype
        self.q = _param(rngs, (*stack, c.hidden_size, c.num_heads, c.head_dim), lead + ("embed", "heads", "head_dim"), param_dtype)
        self.k = _param(rngs, (*stack, c.hidden_size, c.num_kv_heads, c.head_dim), lead + ("embed", "kv_heads", "head_dim"), param_dtype)
        self.v = _param(rngs, (*stack, c.hidden_size, c.num_kv_heads, c.head_dim), lead + ("embed", "kv_heads", "head_dim"), param_dtype)
        self.o = _param(rngs, (*stack, c.num_heads, c.head_dim, c.hidden_size), lead + ("heads", "head_dim", "embed"), param_dtype)
        if c.qkv_bias:
            self.q_bias = _param(rngs, (*stack, c.num_heads, c.head_dim), lead + ("heads", "head_dim"), param_dtype)
            self.k_bias = _param(rngs, (*stack, c.num_kv_heads, c.head_dim), lead + ("kv_heads", "head_dim"), param_dtype)
            self.v_bias = _param(rngs, (*stack, c.num_kv_heads, c.head_dim), lead + ("kv_heads", "head_dim"), param_dtype)
        if c.qk_norm:
            self.q_norm = RMSNorm(stack, c.head_dim, "head_dim", c, param_dtype)
            self.k_norm = RMSNorm(stack, c.head_dim, "head_dim", c, param_dtype)

    def _project(self, x, name):
        y = _product("btd,dhk->bthk", x, getattr(self, name)[...], self.dtype)
        if self.config.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(self.dtype)
        return y

    def __call__(self, x, cos, sin, mask, cache=None, layer=None, cache_index=None, mesh=None, prefix=None,
                 cache_kernel=None):
        """x [B, T, E] -> (output [B, T, E], the new tokens' (k, v) [B, T, kv_heads, head_dim]).

        Without a cache, `mask` is the attention implementation's `attend(q, k, v)` for this layer (the
        layout bound: see `jaxgrpo.models.attention`). With `cache` (every layer's k, v [L, B, kv_heads,
        C, head_dim]) the queries also attend to layer `layer`'s cached slots below `cache_index`, and to
        the shared `prefix` (k, v) [L, P_rows, kv_heads, P, head_dim] if given; `mask` is then (cached
        [B, T, C], new [B, T, T], prefix [P_rows, T, P] or None, and the implementation's reader of the
        cached and prefix blocks or None: `_attend_with_cache`'s `cache_blocks`), and `cache_kernel` the
        implementation's predicate for the CPU cache kernel.
        `mesh` (or None) lays out the activations: rows over the batch axes, heads over `model`.
        """
        c = self.config
        heads = lambda y, name: constrain_activation(y, ("batch", None, name, None), mesh)  # noqa: E731
        # Named scopes label the parts in profiles (jaxgrpo.profiling).
        with jax.named_scope("attention"), jax.named_scope("qkv"):
            q, k, v = self._project(x, "q"), self._project(x, "k"), self._project(x, "v")
            if c.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            q, k, v = heads(q, "heads"), heads(k, "kv_heads"), heads(v, "kv_heads")
        new_kv = (k, v)
        batch, length = q.shape[:2]
        groups = c.num_heads // c.num_kv_heads
        with jax.named_scope("attention"), jax.named_scope("core"):
            q = q.reshape(batch, length, c.num_kv_heads, groups, c.head_dim)
            if cache is None:
                out = mask(q, k, v)
            else:
                scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * c.attention_scale
                scores = constrain_activation(scores, ("batch", "kv_heads", None, None, None), mesh)
                # The cache is read-only here (the caller writes the new slots after the layer scan), and
                # only its live prefix, slots [0, cache_index), is read: a decode step costs the same
                # whatever the capacity.
                cache_mask, new_mask, prefix_mask, cache_blocks = mask
                scores = jnp.where(new_mask[:, None, None], scores, _MASKED_SCORE)
                out = _attend_with_cache(q, scores, v, cache, layer, cache_mask, cache_index, c.attention_scale,
                                         self.dtype, prefix, prefix_mask, mesh, cache_kernel, cache_blocks)
        with jax.named_scope("attention"), jax.named_scope("out"):
            out = heads(out.reshape(batch, length, c.num_heads, c.head_dim), "heads")
            out = _product("bthk,hkd->btd", out, self.o[...], self.dtype)
            return constrain_activation(out, ("batch", None, None), mesh), new_kv


class MLP(nnx.Module):
    """Gated MLP: down(act(gate(x)) * up(x)), SiLU (Llama, Qwen) or tanh-GELU (Gemma)."""

    def __init__(self, config: DecoderConfig, stack, *, dtype, param_dtype, rngs: nnx.Rngs):
        lead = ("layers",) * len(stack)
        e, f = config.hidden_size, config.intermediate_size
        self.dtype = dtype
        self.gemma = config.is_gemma
        self.gate = _param(rngs, (*stack, e, f), lead + ("embed", "mlp"), param_dtype)
        self.up = _param(rngs, (*stack, e, f), lead + ("embed", "mlp"), param_dtype)
        self.down = _param(rngs, (*stack, f, e), lead + ("mlp", "embed"), param_dtype)

    @jax.named_scope("mlp")
    def __call__(self, x, mesh=None):
        hidden = lambda y: constrain_activation(y, ("batch", None, "mlp"), mesh)  # noqa: E731
        gate = hidden(_product("bte,ef->btf", x, self.gate[...], self.dtype))
        gate = jax.nn.gelu(gate, approximate=True) if self.gemma else jax.nn.silu(gate)
        out = _product("btf,fe->bte", gate * hidden(_product("bte,ef->btf", x, self.up[...], self.dtype)), self.down[...],
                       self.dtype)
        return constrain_activation(out, ("batch", None, None), mesh)


class Block(nnx.Module):
    """Pre-norm residual block; Gemma also normalizes the attention and MLP outputs."""

    def __init__(self, config: DecoderConfig, stack, *, dtype, param_dtype, rngs: nnx.Rngs):
        e = config.hidden_size
        self.attn_norm = RMSNorm(stack, e, "norm", config, param_dtype)
        self.attn = Attention(config, stack, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.mlp_norm = RMSNorm(stack, e, "norm", config, param_dtype)
        self.mlp = MLP(config, stack, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gemma = config.is_gemma
        if self.gemma:
            self.attn_out_norm = RMSNorm(stack, e, "norm", config, param_dtype)
            self.mlp_out_norm = RMSNorm(stack, e, "norm", config, param_dtype)

    def __call__(self, x, cos, sin, mask, cache=None, layer=None, cache_index=None, mesh=None, prefix=None,
                 cache_kernel=None):
        rows = lambda y: constrain_activation(y, ("batch", "sequence", None), mesh)  # noqa: E731
        x = rows(x)
        y, new_kv = self.attn(self.attn_norm(x), cos, sin, mask, cache, layer, cache_index, mesh, prefix, cache_kernel)
        x = rows(x + (self.attn_out_norm(y) if self.gemma else y))
        y = self.mlp(self.mlp_norm(x), mesh)
        return rows(x + (self.mlp_out_norm(y) if self.gemma else y)), new_kv


def _check_prefix(prefix: KVCache | None, prefix_mask: jax.Array | None, batch: int) -> None:
    if prefix is None:
        if prefix_mask is not None:
            raise ValueError("prefix_mask was given without a prefix")
        return
    if prefix_mask is None:
        raise ValueError("a prefix needs prefix_mask [prefix rows, prefix length] (True on real tokens)")
    prefix_rows, prefix_length = prefix.k.shape[1], prefix.k.shape[3]
    if prefix_mask.shape != (prefix_rows, prefix_length):
        raise ValueError(f"prefix_mask must be [prefix rows, prefix length] = {(prefix_rows, prefix_length)}, "
                         f"got {prefix_mask.shape}")
    if batch % prefix_rows:
        raise ValueError(f"the batch ({batch} rows) must be a multiple of the prefix's rows ({prefix_rows}): "
                         "consecutive rows share one prefix row")


class Decoder(nnx.Module):
    """The policy: token ids -> logits. See the module docstring for the call and cache contract.

    Args:
      config: the architecture.
      dtype: compute dtype (float32 or bfloat16); attention softmax, norms and logits run in float32.
      param_dtype: parameter dtype.
      remat: recompute each layer's activations in the backward pass instead of storing them.
      attention: the training/scoring attention implementation, "auto" (the platform's: splash attention
        on a TPU) or one of `jaxgrpo.models.attention.NAMES`; an unknown name is a ValueError here, one
        that does not run on the program's platform at the first call.
      rngs: initializer randomness (loaders overwrite the values).
    """

    def __init__(self, config: DecoderConfig, *, dtype=jnp.float32, param_dtype=jnp.float32, remat: bool = False,
                 attention: str = attention_implementations.AUTO, rngs: nnx.Rngs):
        attention_implementations.check_name(attention)
        c = config
        self.config = c
        self.dtype = dtype
        self.remat = remat
        self.attention = attention
        self.embed = _param(rngs, (c.vocab_size, c.hidden_size), ("vocab", "embed"), param_dtype)
        self.layers = Block(c, (c.num_layers,), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.final_norm = RMSNorm((), c.hidden_size, "norm", c, param_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = _param(rngs, (c.hidden_size, c.vocab_size), ("embed", "vocab"), param_dtype)

    def init_cache(self, batch_size: int, capacity: int, dtype=None) -> KVCache:
        """An all-zero `KVCache` of [layers, batch_size, kv_heads, capacity, head_dim] (compute dtype by default)."""
        c = self.config
        shape = (c.num_layers, batch_size, c.num_kv_heads, capacity, c.head_dim)
        dtype = dtype or self.dtype
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def unembedding(self) -> jax.Array:
        """The output projection [hidden, vocab] in the compute dtype (the embedding, transposed, when tied)."""
        weight = self.embed[...].T if self.config.tie_word_embeddings else self.lm_head[...]
        return weight.astype(self.dtype)

    def pack_weights(self) -> PackedWeights | None:
        """The weights packed for a decode loop's one-token calls through `cpu_matmul` (pass them as
        `packed_weights=`), or None where that kernel does not apply (see `cpu_matmul.use_for`).

        An XLA computation, run once before the loop (a copy of the weights, 270 MB for SmolLM2)."""
        if not cpu_matmul.use_for(self.dtype, active_mesh(self.embed[...])):
            return None
        layers = {name: cpu_matmul.pack(getattr(getattr(self.layers, name[0]), name[1])[...], in_dims)
                  for name, in_dims in _PRODUCT_WEIGHTS.items()}
        if self.config.tie_word_embeddings:
            unembedding = cpu_matmul.pack(self.embed[...][None], 1, out_first=True)
        else:
            unembedding = cpu_matmul.pack(self.lm_head[...][None], 1)
        return PackedWeights(layers, unembedding)

    @jax.named_scope("unembed")
    def logits_from_hidden(self, hidden: jax.Array, packed_weights: PackedWeights | None = None) -> jax.Array:
        """Float32 logits [..., V] from final hidden states [..., E], soft-capped where the config says."""
        if packed_weights is not None:
            logits = packed_weights.unembedding.product(hidden.astype(self.dtype))
        elif self.config.tie_word_embeddings:
            # Contract the embedding's hidden axis in place: XLA:CPU transposes a bfloat16 [V, E] table in
            # float32 (58 against 8 ms a call for SmolLM2's at batch 32), a float32 one for free; and read
            # the table inside the decode loop, or XLA hoists a transposed copy of it out of the loop.
            table = self.embed[...].astype(self.dtype)
            if _cpu_forms():
                table, hidden = _read_inside(table, hidden)
            logits = jnp.einsum("...e,ve->...v", hidden, table, preferred_element_type=jnp.float32)
        else:
            logits = jnp.matmul(hidden, self.unembedding(), preferred_element_type=jnp.float32)
        return soft_cap(logits, self.config.final_logit_softcapping)

    def _check_tokens(self, tokens: jax.Array) -> None:
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, length], got shape {tokens.shape}")
        if isinstance(tokens, jax.core.Tracer):
            return
        # numpy, not jnp: this also runs on concrete arrays captured while tracing.
        values = np.asarray(tokens)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}) for this vocabulary, got min {low} and max {high}"
            )

    def attention_implementation(self, mesh=None) -> attention_implementations.AttentionImplementation:
        """The attention implementation this model runs in a program laid out on `mesh` (None: the default
        devices): `self.attention`, or with "auto" the platform's default (`jaxgrpo.models.attention`)."""
        return attention_implementations.resolve(self.attention, attention_implementations.target_platform(mesh))

    def hidden_states(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        *,
        attention_mask: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        branch_ids: jax.Array | None = None,
        cache: KVCache | None = None,
        cache_index: jax.Array | int | None = None,
        kv_mask: jax.Array | None = None,
        prefix: KVCache | None = None,
        prefix_mask: jax.Array | None = None,
        packed_weights: PackedWeights | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final-normalized hidden states [B, T, E] and the updated cache (None without one).

        `branch_ids`: packed prompt groups, with `segment_ids` and `positions`; `prefix`/`prefix_mask`:
        a shared prefix for a cached call (see the module docstring); `packed_weights`: this model's
        `pack_weights()`, multiplied by instead of the parameters (no derivative). Without a cache this is
        `forward` with the layout the masks describe; with one, `decode_step`.
        """
        self._check_tokens(tokens)
        batch, length = tokens.shape
        _check_prefix(prefix, prefix_mask, batch)
        if branch_ids is not None:
            if cache is not None or segment_ids is None or positions is None:
                raise ValueError("branch_ids (packed prompt groups) need segment_ids and positions, and no cache")
            if branch_ids.shape != tokens.shape or segment_ids.shape != tokens.shape:
                raise ValueError(f"branch_ids and segment_ids must be [batch, length] = {tokens.shape}, "
                                 f"got {branch_ids.shape} and {segment_ids.shape}")
        if cache is not None:
            return self.decode_step(tokens, positions, cache=cache, cache_index=cache_index, kv_mask=kv_mask,
                                    prefix=prefix, prefix_mask=prefix_mask, packed_weights=packed_weights)
        if prefix is not None:
            raise ValueError("prefix is read by cached calls only: pass cache, cache_index and kv_mask with it")
        if segment_ids is not None and attention_mask is not None:
            raise ValueError("pass either attention_mask or segment_ids, not both (segment id 0 marks padding)")
        if positions is None:
            positions = positions_from_mask(attention_mask, segment_ids, length)
        if branch_ids is not None:
            layout = AttentionLayout.branches(segment_ids, branch_ids)
        elif segment_ids is not None:
            layout = AttentionLayout.segments(segment_ids)
        else:
            layout = AttentionLayout.padded(jnp.ones((batch, length), bool) if attention_mask is None else attention_mask)
        return self.forward(tokens, positions, layout, packed_weights=packed_weights), None

    def forward(self, tokens: jax.Array, positions: jax.Array, layout: AttentionLayout, *,
                packed_weights: PackedWeights | None = None) -> jax.Array:
        """Final-normalized hidden states [B, T, E] of a training or scoring forward (no cache).

        `positions` [B, T] (or [1, T]) feed RoPE; `layout` says which keys each query sees (padded rows,
        packed segments or packed prompt groups: `AttentionLayout`); the attention runs through this
        model's implementation (`attention_implementation`).
        """
        c = self.config
        self._check_tokens(tokens)
        batch, length = tokens.shape
        positions = jnp.broadcast_to(positions, (batch, length))
        mesh = active_mesh(self.embed[...])
        implementation = self.attention_implementation(mesh)
        rows = lambda y: constrain_activation(y, ("batch",) + (None,) * (y.ndim - 1), mesh)  # noqa: E731
        masks = jax.tree.map(rows, implementation.prepare(layout, positions, c.sliding_window))

        def attention(sliding):
            return functools.partial(implementation.attend, masks=masks, sliding=sliding, window=c.sliding_window,
                                     scale=c.attention_scale, mesh=mesh)

        hidden, _ = self._layers(tokens, positions, attention, mesh, packed_weights=packed_weights)
        return hidden

    def decode_step(self, tokens: jax.Array, positions: jax.Array | None = None, *, cache: KVCache,
                    cache_index: jax.Array | int, kv_mask: jax.Array, prefix: KVCache | None = None,
                    prefix_mask: jax.Array | None = None,
                    packed_weights: PackedWeights | None = None) -> tuple[jax.Array, KVCache]:
        """(final-normalized hidden states [B, T, E], updated cache) of a cached call: prefill or a decode
        step (the module docstring's contract). Positions default to the slots written."""
        self._check_tokens(tokens)
        batch, length = tokens.shape
        _check_prefix(prefix, prefix_mask, batch)
        if cache_index is None or kv_mask is None:
            raise ValueError("a cached call needs cache_index (first slot to write) and kv_mask [batch, capacity]")
        batch_and_capacity = (cache.k.shape[1], cache.k.shape[3])
        if kv_mask.shape != batch_and_capacity:
            raise ValueError(f"kv_mask must be [batch, capacity] = {batch_and_capacity}, got {kv_mask.shape}")
        if positions is None:
            positions = cache_index + jnp.arange(length)[None]
        positions = jnp.broadcast_to(positions, (batch, length))
        mesh = active_mesh(self.embed[...])
        rows = lambda y: constrain_activation(y, ("batch",) + (None,) * (y.ndim - 1), mesh)  # noqa: E731
        key_valid = kv_mask.astype(bool)
        query_slots = cache_index + jnp.arange(length)
        # (mask over the cached slots [B, T, C], mask among the T new tokens [B, T, T], mask over the
        # prefix [P_rows, T, P] or None); slots from cache_index on hold stale values until
        # written, so only earlier ones count as cached.
        old_valid = key_valid & (jnp.arange(key_valid.shape[1]) < cache_index)[None]
        new_valid = jax.lax.dynamic_slice_in_dim(key_valid, cache_index, length, axis=1)

        def prefix_attention_mask(window):
            if prefix is None:
                return None
            prefix_length = prefix.k.shape[3]
            allowed = jnp.ones((length, prefix_length), bool)
            if window is not None:  # the prefix's slots come before the cache's
                allowed = (prefix_length + query_slots)[:, None] - jnp.arange(prefix_length)[None] < window
            return allowed[None] & prefix_mask.astype(bool)[:, None, :]

        def cached_and_new(window):
            return (build_attention_mask(query_slots, old_valid, window),
                    build_attention_mask(jnp.arange(length), new_valid, window),
                    prefix_attention_mask(window))

        window = self.config.sliding_window
        full_mask = jax.tree.map(rows, cached_and_new(None))
        sliding_mask = jax.tree.map(rows, cached_and_new(window)) if window else full_mask

        implementation = self.attention_implementation(mesh)
        # A decode step (run-time cache index) of an implementation with its own cache reader (pallas_tpu's
        # kernel) reads the cached slots and the prefix through it; any other call, the XLA math below.
        kernel = None if isinstance(cache_index, (int, np.integer)) else implementation.cache_state

        def kernel_blocks(sliding):
            """(q, layer) -> the online-softmax state of the cached slots and the prefix, by `kernel`."""
            read = functools.partial(kernel, sliding=sliding, window=window, scale=self.config.attention_scale,
                                     mesh=mesh)

            def blocks(q, layer):
                state = read(q, cache.k, cache.v, layer, cache_index, kv_mask.astype(bool))
                if prefix is None:
                    return state
                prefix_length = prefix.k.shape[3]  # its slots precede the cache's: query slots shift by it
                return _merge_blocks(state, read(q, prefix.k, prefix.v, layer, prefix_length,
                                                 prefix_mask.astype(bool), query_slot=prefix_length + cache_index))
            return blocks

        def masks(sliding):
            layer_masks = jax.tree.map(lambda s, f: jnp.where(sliding, s, f), sliding_mask, full_mask)
            return (*layer_masks, None if kernel is None else kernel_blocks(sliding))

        return self._layers(tokens, positions, masks, mesh, cache=cache, cache_index=cache_index, prefix=prefix,
                            packed_weights=packed_weights)

    def _layers(self, tokens, positions, attention, mesh, *, cache=None, cache_index=None, prefix=None,
                packed_weights=None):
        """Embedding, the layer scan and the final norm: (hidden [B, T, E], the updated cache or None).

        `attention(sliding)` gives a layer's attention argument (`Attention.__call__`'s `mask`) from
        whether that layer slides (a traced bool)."""
        c = self.config
        rows = lambda y: constrain_activation(y, ("batch",) + (None,) * (y.ndim - 1), mesh)  # noqa: E731
        cos_full, sin_full = rope_tables(positions, rope_inverse_frequencies(c.rope, c.head_dim))
        cos_sliding, sin_sliding = rope_tables(positions, rope_inverse_frequencies(c.rope_sliding or c.rope, c.head_dim))
        cos_full, sin_full, cos_sliding, sin_sliding = jax.tree.map(rows, (cos_full, sin_full, cos_sliding, sin_sliding))
        cache_kernel = self.attention_implementation(mesh).cache_kernel if cache is not None else None

        with jax.named_scope("embed"):
            x = _take_rows(self.embed[...], tokens).astype(self.dtype)
            if c.is_gemma:
                x = x * jnp.asarray(c.embedding_scale, self.dtype)
        x = rows(x)

        graphdef, layer_params = nnx.split(self.layers)

        def layer(x, inputs):
            params, index, sliding = inputs
            block = nnx.merge(graphdef, _layer_weights(params, layer_params, index,
                                                       packed_weights.layers if packed_weights else None))
            cos = jnp.where(sliding, cos_sliding, cos_full)
            sin = jnp.where(sliding, sin_sliding, sin_full)
            x, new_kv = block(x, cos, sin, attention(sliding), cache, index, cache_index, mesh, prefix, cache_kernel)
            return x, (None if cache is None else new_kv)

        if self.remat:
            layer = jax.checkpoint(layer, prevent_cse=False)
        # Every layer reads the whole cache and prefix (closed over, read-only) at its own index, so no layer's
        # slice is copied; the layers' new keys and values [L, B, T, ...] come out of the scan and are
        # written with one dynamic_update_slice each (in place when donated).
        layer_ids = jnp.arange(c.num_layers, dtype=jnp.int32)
        stream = lambda y: constrain_activation(y, ("batch", "sequence", None), mesh)  # noqa: E731
        with jax.named_scope("layers"):
            x, new_kv = jax.lax.scan(layer, stream(x), (layer_params, layer_ids, jnp.asarray(c.sliding_layer_mask)))
        if cache is not None:
            start = (0, 0, 0, cache_index, 0)
            heads_major = lambda x, like: jnp.swapaxes(x, 2, 3).astype(like.dtype)  # noqa: E731 [L, B, kv, T, D]
            with jax.named_scope("kv_cache_write"):
                cache = KVCache(_write_slots(cache.k, heads_major(new_kv[0], cache.k), start),
                                _write_slots(cache.v, heads_major(new_kv[1], cache.v), start))
        return rows(self.final_norm(stream(x))), cache

    def __call__(self, tokens, positions=None, *, attention_mask=None, segment_ids=None, cache=None, cache_index=None,
                 kv_mask=None, prefix=None, prefix_mask=None, packed_weights=None):
        """Logits [B, T, V] float32; with `cache=`, `(logits, updated_cache)`."""
        hidden, new_cache = self.hidden_states(
            tokens, positions, attention_mask=attention_mask, segment_ids=segment_ids,
            cache=cache, cache_index=cache_index, kv_mask=kv_mask, prefix=prefix, prefix_mask=prefix_mask,
            packed_weights=packed_weights,
        )
        logits = self.logits_from_hidden(hidden, packed_weights)
        return logits if cache is None else (logits, new_cache)

    def token_logprobs(
        self,
        tokens: jax.Array,
        targets: jax.Array,
        positions: jax.Array | None = None,
        *,
        attention_mask: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        temperature: float = 1.0,
        sequence_chunk: int = 128,
        vocab_chunk: int = 8192,
    ) -> tuple[jax.Array, jax.Array]:
        """(log p(targets[b, t] | tokens[b, :t+1]), entropy) [B, T] each, chunked (see `logprobs`).

        `targets` is usually `tokens` shifted left by one; temperature divides the logits as in sampling.
        """
        hidden, _ = self.hidden_states(tokens, positions, attention_mask=attention_mask, segment_ids=segment_ids)
        return token_logprobs_and_entropy(
            hidden, self.unembedding(), targets, temperature=temperature,
            logit_softcap=self.config.final_logit_softcapping, sequence_chunk=sequence_chunk, vocab_chunk=vocab_chunk,
        )
