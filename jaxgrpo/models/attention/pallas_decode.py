"""Decode attention over the live KV-cache slots as a Pallas TPU kernel.

A decode step's attention is memory-bound: each row reads its cached keys and values once and multiplies
them by a handful of queries (G query heads x T new tokens per kv head). The XLA form reads the whole
capacity under a mask (a TPU program reads the cache in one masked block, see the decoder's
`cached_attention.attend_cached`), so a step costs the capacity and not the live length. This kernel
copies only the blocks that hold live keys:

* the grid runs over cache rows (in two runs, one per TensorCore of a megacore chip); the layer, the
  live length, the query slot and each row's first valid slot are scalar-prefetched, so the kernel
  knows a row's live blocks before it copies anything;
* the caches stay in HBM in their [L, R, kv, C, D] layout (no per-layer copy): a row's live blocks are
  copied, all kv heads of a block at once, with double-buffered DMAs in a loop over exactly those
  blocks (left padding below the row's first valid slot, stale slots above `cache_index` and, with a
  sliding window, slots older than the window are never copied); the next row's first block is copied
  while the current row's last one is multiplied;
* the online-softmax state (running max, normalizer, unnormalized output) accumulates in the output
  blocks, in VMEM.

A loop inside one grid step, rather than a grid axis over blocks, because a grid step costs ~0.35 us
whether it copies anything or not: for Qwen3-1.7B's batch-128 decode on 8 chips a grid axis over a
4096-slot cache's 256-slot blocks is 16 x 16 x 28 = 7168 steps per chip, 2.5 ms of a ~9 ms step, live or
not (`benchmarks/decode_roofline.py` estimates the step). paged_attention
(`jax.experimental.pallas.ops.tpu`) runs its blocks the same way; it is not used here because it wants
a paged cache [kv, pages, page, D] of one layer and one length per row, and returns the normalized
output; the decoder's cache is contiguous with a layer axis, has left padding and windows, and its
blocks (cache, shared prefix, new tokens) merge through their online-softmax states.

The result is the online-softmax state ("Online normalizer calculation for softmax", Milakov &
Gimelshein 2018; as in "FlashAttention", Dao et al. 2022) that the decoder merges with the new
tokens' block and the shared prefix's block. The same kernel reads a shared prefix: with a cache
of R rows and queries of B = R x share rows, row b reads cache row b // share, and a cache row's
share x G x T queries are stacked into one product per block, so each prefix row is read once per
step for all its rows (the sampler's prompt cache, read by the G samples of its prompt).

`xla_cache_attention_state` is the same state in plain `jax.numpy` (the decoder's math over the
whole capacity, masked): the oracle the kernel is tested against, in interpret mode on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec

from jaxgrpo.distributed import batch_axes, batch_shards

# The score given to masked keys before the running max is taken: finite, so a row with no live key
# keeps a finite max and its state (max, 0, 0) leaves a merge unchanged. The decoder uses the same value.
MASKED_SCORE = -1e30

# Slots copied per DMA when the caller does not choose: 256 bfloat16 slots of 8 kv heads of 128 are
# 512 KiB of keys and as much of values, ~1.3 us at v5e's 819 GB/s, long enough to hide a loop
# iteration's overhead; double-buffered, 2 MiB of VMEM. Smaller blocks waste less past the live length.
DEFAULT_BLOCK_SIZE = 256


def _check_inputs(q, cache_k, cache_v, valid_start, key_mask, window, block_size):
    """One-line errors for shapes that do not fit together, before anything is traced into a kernel."""
    if q.ndim != 5:
        raise ValueError(f"q must be [batch, new tokens, kv heads, groups, head_dim], got shape {q.shape}")
    if cache_k.ndim != 5 or cache_k.shape != cache_v.shape:
        raise ValueError("cache_k and cache_v must both be [layers, rows, kv heads, capacity, head_dim], "
                         f"got {cache_k.shape} and {cache_v.shape}")
    if cache_k.dtype != cache_v.dtype:
        raise ValueError(f"cache_k and cache_v must share a dtype, got {cache_k.dtype} and {cache_v.dtype}")
    batch, _, kv_heads, _, head_dim = q.shape
    _, rows, cache_heads, capacity, cache_head_dim = cache_k.shape
    if (kv_heads, head_dim) != (cache_heads, cache_head_dim):
        raise ValueError(f"q has {kv_heads} kv heads of size {head_dim} but the cache has {cache_heads} of size "
                         f"{cache_head_dim}")
    if batch % rows:
        raise ValueError(f"the cache's {rows} rows must divide q's {batch} rows (consecutive rows share a cache row)")
    if valid_start is not None and np.shape(valid_start) != (rows,):
        raise ValueError(f"valid_start must be [cache rows] = ({rows},), got shape {np.shape(valid_start)}")
    if key_mask is not None and np.shape(key_mask) != (rows, capacity):
        raise ValueError(f"key_mask must be [cache rows, capacity] = {(rows, capacity)}, got shape {np.shape(key_mask)}")
    if window is not None and window < 1:
        raise ValueError(f"window must be a positive number of slots or None, got {window}")
    if block_size is not None and (block_size < 1 or capacity % block_size):
        raise ValueError(f"block_size {block_size} must divide the cache capacity {capacity}; "
                         f"pass a divisor (e.g. {default_block_size(capacity)}) or None")


def default_block_size(capacity: int, largest: int = DEFAULT_BLOCK_SIZE) -> int:
    """The slots copied per DMA: the whole capacity if it is at most `largest`, else the largest divisor of
    it up to `largest` that is a multiple of 128 (one lane tile of scores), else of 16 (one bfloat16
    sublane tile), else the capacity itself.

    A divisor, so no block reaches past the capacity.
    """
    if capacity <= largest:
        return capacity
    for multiple in (128, 16):
        for size in range(largest - largest % multiple, 0, -multiple):
            if capacity % size == 0:
                return size
    return capacity


def _live_range(start, cache_index, query_slot, window, capacity):
    """[low, high): the slots of a cache row any of its queries may read (traced int32 scalars)."""
    low = jnp.maximum(start, 0)
    if window is not None:  # query t reads slots > query_slot + t - window; t = 0 reaches back furthest
        low = jnp.maximum(low, query_slot - window + 1)
    return low, jnp.minimum(cache_index, capacity)


def live_blocks(low, high, block_size):
    """(first block, number of blocks): the blocks of `block_size` slots that meet the live slots
    [low, high), the only ones the kernel copies; none when the range is empty. Python ints or traced."""
    first = low // block_size
    return first, ((high + block_size - 1) // block_size - first) * (low < high)


def _fold_head(h, q_ref, keys, values, allowed, scale, top_ref, total_ref, out_ref):
    """Kv head h's online-softmax step over one block of keys and values [block, D]: its stacked queries' scores
    where `allowed` [Q, block], the running max (`top_ref`), sum of weights (`total_ref`) and weighted values
    (`out_ref`) rescaled to the new max."""
    # Stated, not inherited from jax_default_matmul_precision: Mosaic takes a bfloat16 product only
    # at the default precision, and a float32 cache is multiplied in full float32.
    precision = jax.lax.Precision.HIGHEST if keys.dtype == jnp.float32 else jax.lax.Precision.DEFAULT
    scores = jax.lax.dot_general(q_ref[h], keys, (((1,), (1,)), ((), ())), precision=precision,
                                 preferred_element_type=jnp.float32) * scale  # [Q, block]
    scores = jnp.where(allowed, scores, MASKED_SCORE)
    previous = top_ref[h]  # [Q, 1]
    top = jnp.maximum(previous, scores.max(axis=-1, keepdims=True))
    weights = jnp.where(allowed, jnp.exp(scores - top), 0.0)
    rescale = jnp.exp(previous - top)
    top_ref[h] = top
    total_ref[h] = rescale * total_ref[h] + weights.sum(axis=-1, keepdims=True)
    out_ref[h] = rescale * out_ref[h] + jnp.dot(weights.astype(values.dtype), values, precision=precision,
                                                preferred_element_type=jnp.float32)


def _kernel(layer_ref, cache_index_ref, query_slot_ref, start_ref, q_ref, *refs, scale, block_size, capacity, length,
            window, has_key_mask):
    """Grid step r: fold cache row r's live blocks into the state of its stacked queries [kv, Q, D],
    Q = share x G x T with the new-token index t fastest. Steps run in order (the next row's first block
    is copied during this one's last)."""
    if has_key_mask:
        mask_ref, cache_k, cache_v, top_ref, total_ref, out_ref, k_buffer, v_buffer, semaphores, copy_state = refs
    else:
        mask_ref = None
        cache_k, cache_v, top_ref, total_ref, out_ref, k_buffer, v_buffer, semaphores, copy_state = refs
    # Rows split into `pl.num_programs(0)` runs of consecutive rows, one per TensorCore on megacore chips
    # (v4, v5p), each run in order: its row i prefetches row i + 1's first block.
    step, per_run = pl.program_id(1), pl.num_programs(1)
    r = pl.program_id(0) * per_run + step
    layer, cache_index, query_slot = layer_ref[0], cache_index_ref[0], query_slot_ref[0]
    kv_heads = q_ref.shape[0]

    def row_blocks(row):
        low, high = _live_range(start_ref[row], cache_index, query_slot, window, capacity)
        return (low, high, *live_blocks(low, high, block_size))

    def copies(row, block, slot):  # every kv head's slots of one block, keys and values
        slots = pl.ds(pl.multiple_of(block * block_size, block_size), block_size)
        return (pltpu.make_async_copy(cache_k.at[layer, row, :, slots, :], k_buffer.at[slot], semaphores.at[0, slot]),
                pltpu.make_async_copy(cache_v.at[layer, row, :, slots, :], v_buffer.at[slot], semaphores.at[1, slot]))

    low, high, first, count = row_blocks(r)
    top_ref[...] = jnp.full(top_ref.shape, MASKED_SCORE, jnp.float32)
    total_ref[...] = jnp.zeros(total_ref.shape, jnp.float32)
    out_ref[...] = jnp.zeros(out_ref.shape, jnp.float32)

    @pl.when(step == 0)
    def _first_row():
        copy_state[0], copy_state[1] = 0, 0

    # copy_state: [the buffer this row's first block goes to, whether the row before already started its copy]
    slot0, started = copy_state[0], copy_state[1]
    copy_state[1] = 0

    @pl.when((count > 0) & (started == 0))
    def _copy_first_block():
        for copy in copies(r, first, slot0):
            copy.start()

    _, _, next_first, next_count = row_blocks(jnp.where(step + 1 < per_run, r + 1, r))
    next_count = jnp.where(step + 1 < per_run, next_count, 0)

    def fold_block(j, carry):
        slot = (slot0 + j) % 2
        block = first + j

        @pl.when(j + 1 < count)
        def _prefetch_this_rows_next_block():
            for copy in copies(r, block + 1, 1 - slot):
                copy.start()

        @pl.when((j + 1 == count) & (next_count > 0))
        def _prefetch_next_rows_first_block():
            for copy in copies(r + 1, next_first, 1 - slot):
                copy.start()
            copy_state[1] = 1

        for copy in copies(r, block, slot):
            copy.wait()
        slots = block * block_size + jax.lax.broadcasted_iota(jnp.int32, (q_ref.shape[1], block_size), 1)
        allowed = (slots >= low) & (slots < high)
        if window is not None:
            new_token = jax.lax.broadcasted_iota(jnp.int32, allowed.shape, 0) % length
            allowed &= query_slot + new_token - slots < window
        if has_key_mask:
            allowed &= mask_ref[pl.ds(block, 1), :] != 0  # [1, block]: a row of the blocked mask
        for h in range(kv_heads):  # unrolled: one [Q, D] x [D, block] product per kv head
            _fold_head(h, q_ref, k_buffer[slot, h], v_buffer[slot, h], allowed, scale, top_ref, total_ref, out_ref)
        return carry

    jax.lax.fori_loop(0, count, fold_block, 0)
    copy_state[0] = (slot0 + count) % 2


def _stack_queries(q, rows):
    """q [B, T, kv, G, D] -> [R, kv, share * G * T, D]: a cache row's queries, t fastest (the decoder's order)."""
    batch, length, kv_heads, groups, head_dim = q.shape
    share = batch // rows
    q = q.reshape(rows, share, length, kv_heads, groups, head_dim)
    return jnp.transpose(q, (0, 3, 1, 4, 2, 5)).reshape(rows, kv_heads, share * groups * length, head_dim)


def _unstack_state(x, batch, length, groups):
    """[R, kv, share * G * T, ...] -> [B, kv, G, T, ...], the inverse of `_stack_queries`' row order."""
    rows, kv_heads = x.shape[:2]
    share = batch // rows
    x = x.reshape(rows, kv_heads, share, groups, length, *x.shape[3:])
    return jnp.swapaxes(x, 1, 2).reshape(batch, kv_heads, groups, length, *x.shape[5:])


def full_cache_cost_estimate(rows: int, kv_heads: int, stacked: int, capacity: int, head_dim: int, itemsize: int,
                             key_mask: bool) -> pl.CostEstimate:
    """The kernel's cost on one shard as its `cost_estimate`, at a full cache: every row's C slots of one
    layer's keys and values read once, with its queries (R x kv x Q x D, Q = share x G x T stacked) and
    the float32 state it writes, and two products per slot ([Q, D] x [D, C], then [Q, C] x [C, D]).

    Full, not live, because the live length is known only at run time, and it is the worst case the
    compile report's HBM floor of a decode step takes (parameters and the whole cache a chip holds, read
    once per token): the estimate is comparable with that floor, and at most the capacity's bytes late in a
    completion, the steps that cost most."""
    cache = 2 * rows * kv_heads * capacity * head_dim * itemsize  # keys and values
    queries = rows * kv_heads * stacked * head_dim * itemsize
    state = rows * kv_heads * stacked * (head_dim + 2) * 4  # out, top and total, float32
    mask = rows * capacity * 4 if key_mask else 0  # the key mask as int32, one per slot
    return pl.CostEstimate(flops=4 * rows * kv_heads * stacked * capacity * head_dim,
                           transcendentals=rows * kv_heads * stacked * capacity,
                           bytes_accessed=cache + queries + state + mask)


def _pallas_state(q, cache_k, cache_v, layer, cache_index, query_slot, valid_start, key_mask, *, scale, window,
                  block_size, interpret):
    """The kernel on one shard: arguments as `cache_attention_state`'s, every array already this shard's."""
    batch, length, kv_heads, groups, head_dim = q.shape
    _, rows, _, capacity, _ = cache_k.shape
    queries = _stack_queries(q.astype(cache_k.dtype), rows)
    stacked = queries.shape[2]

    runs = 2 if rows % 2 == 0 else 1  # two TensorCores on megacore chips; elsewhere the runs follow each other
    per_run = rows // runs

    def row(run, step, *_):
        return run * per_run + step, 0, 0, 0

    squeezed = pl.Squeezed()
    in_specs = [pl.BlockSpec((squeezed, kv_heads, stacked, head_dim), row)]
    operands = [queries]
    if key_mask is not None:  # one int32 per slot and row: 1/(2 kv D) of a bfloat16 cache's bytes
        # A row of the mask per block: the kernel reads block j's as row j, an aligned load whatever the block
        # size (a lane slice at j * block_size is one only for multiples of 128; a prompt's P rarely is).
        blocks = capacity // block_size
        in_specs.append(pl.BlockSpec((squeezed, blocks, block_size), lambda run, step, *_: (run * per_run + step, 0, 0)))
        operands.append(key_mask.astype(jnp.int32).reshape(rows, blocks, block_size))
    in_specs += [pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)]
    operands += [cache_k, cache_v]
    state_spec = pl.BlockSpec((squeezed, kv_heads, stacked, 1), row)
    out_spec = pl.BlockSpec((squeezed, kv_heads, stacked, head_dim), row)
    state_shape = jax.ShapeDtypeStruct((rows, kv_heads, stacked, 1), jnp.float32)
    buffer = pltpu.VMEM((2, kv_heads, block_size, head_dim), cache_k.dtype)
    kernel = functools.partial(_kernel, scale=float(scale), block_size=block_size, capacity=capacity, length=length,
                               window=window, has_key_mask=key_mask is not None)
    scalar = lambda x: jnp.asarray(x, jnp.int32).reshape(1)  # noqa: E731
    start = jnp.zeros((rows,), jnp.int32) if valid_start is None else jnp.asarray(valid_start, jnp.int32)
    top, total, out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(runs, per_run), in_specs=in_specs, out_specs=[state_spec, state_spec, out_spec],
            scratch_shapes=[buffer, buffer, pltpu.SemaphoreType.DMA((2, 2)), pltpu.SMEM((2,), jnp.int32)]),
        out_shape=[state_shape, state_shape, jax.ShapeDtypeStruct((rows, kv_heads, stacked, head_dim), jnp.float32)],
        # Within a run, sequential: a row's step waits on the copy the step before it started.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
        cost_estimate=full_cache_cost_estimate(rows, kv_heads, stacked, capacity, head_dim, cache_k.dtype.itemsize,
                                               key_mask is not None),
        name="cache_attention_state",
    )(scalar(layer), scalar(cache_index), scalar(query_slot), start, *operands)
    return (_unstack_state(top[..., 0], batch, length, groups), _unstack_state(total[..., 0], batch, length, groups),
            _unstack_state(out, batch, length, groups))


def cache_attention_state(q, cache_k, cache_v, layer, cache_index, scale: float, *, valid_start=None, key_mask=None,
                          window: int | None = None, query_slot=None, block_size: int | None = None, mesh=None,
                          interpret=False):
    """Online-softmax state of the queries over layer `layer`'s live cache slots, read by a Pallas TPU kernel.

    Query t of row b reads slot s of cache row r = b // (B // R) iff
    `valid_start[r] <= s < cache_index`, `key_mask[r, s]`, and `query_slot + t - s < window`:

        top[b, h, g, t]   = max_s score,   score = scale * q[b, t, h, g] . k[layer, r, h, s]
        total[b, h, g, t] = sum_s exp(score - top)
        out[b, h, g, t]   = sum_s exp(score - top) * v[layer, r, h, s]

    the state the decoder merges with its other blocks (`cached_attention._merge_blocks`); a query with
    no readable slot gets (MASKED_SCORE, 0, 0), which leaves a merge unchanged. Products run in the
    cache's dtype with float32 accumulation; the weights are cast to it before multiplying the values (as
    the decoder does). No derivative: it serves decoding (the sampler); differentiate
    `xla_cache_attention_state` instead.

    Args:
      q: [B, T, kv, G, D] the new tokens' queries (RoPE applied).
      cache_k, cache_v: the whole caches [L, R, kv, C, D] as the decoder holds them, R dividing B: read in
        place, only layer `layer`'s live blocks.
      layer: int32 scalar, may be traced (the layer scan's index).
      cache_index: int32 scalar, may be traced: slots [0, cache_index) hold keys (the decoder's
        `cache_index`; a shared prefix passes its length P).
      scale: the score scale (1/sqrt(D) or the config's).
      valid_start: int32 [R] or None: each cache row's first valid slot (left padding below it).
      key_mask: bool [R, C] or None: further slots to drop (the decoder's `kv_mask`; one int32 per slot is
        read alongside the keys, 1/(2 kv D) of the cache's bytes for a bfloat16 cache).
      window: a sliding window in slots (Gemma 3's local layers), static, or None.
      query_slot: int32 scalar, the slot of new token 0 (cache_index by default; a shared prefix read before
        a row cache passes P + cache_index). Only the window reads it: every cached slot precedes the queries.
      block_size: slots per copy, a divisor of C (`default_block_size(C)` by default).
      mesh: a mesh to split rows over (axes "data" and "fsdp", those present) and kv heads over ("model",
        where it divides them), each shard running the kernel on its own rows; None runs it whole.
      interpret: run the kernel in Pallas' interpreter (True or `pltpu.InterpretParams()`), for CPU tests.

    Returns:
      (top, total) float32 [B, kv, G, T] and out float32 [B, kv, G, T, D].
    """
    _check_inputs(q, cache_k, cache_v, valid_start, key_mask, window, block_size)
    block_size = block_size or default_block_size(cache_k.shape[3])
    query_slot = cache_index if query_slot is None else query_slot
    kernel = functools.partial(_pallas_state, scale=scale, window=window, block_size=block_size, interpret=interpret)
    if mesh is None or mesh.size == 1:
        return kernel(q, cache_k, cache_v, layer, cache_index, query_slot, valid_start, key_mask)
    row_axes = batch_axes(mesh) or None
    shards = batch_shards(mesh)
    head_axis = "model" if "model" in mesh.axis_names and q.shape[2] % mesh.shape["model"] == 0 else None
    if cache_k.shape[1] % shards:
        raise ValueError(f"the cache's {cache_k.shape[1]} rows do not split over the mesh's {shards} row shards "
                         f"({row_axes}); pass a cache whose rows they divide, or mesh=None")
    valid_start = jnp.zeros((cache_k.shape[1],), jnp.int32) if valid_start is None else valid_start
    rows_spec, cache_spec = PartitionSpec(row_axes), PartitionSpec(None, row_axes, head_axis)
    q_spec = PartitionSpec(row_axes, None, head_axis)
    state_spec = PartitionSpec(row_axes, head_axis)
    scalar_spec = PartitionSpec()
    specs = (q_spec, cache_spec, cache_spec, scalar_spec, scalar_spec, scalar_spec, rows_spec)
    operands = [q, cache_k, cache_v, jnp.asarray(layer, jnp.int32), jnp.asarray(cache_index, jnp.int32),
                jnp.asarray(query_slot, jnp.int32), valid_start]
    if key_mask is not None:
        specs += (rows_spec,)
        operands.append(key_mask)

    def shard(*args):
        return kernel(*args) if key_mask is not None else kernel(*args, None)

    return jax.shard_map(shard, mesh=mesh, in_specs=specs, out_specs=(state_spec, state_spec, state_spec),
                         check_vma=False)(*operands)


def xla_cache_attention_state(q, cache_k, cache_v, layer, cache_index, scale: float, *, valid_start=None,
                              key_mask=None, window: int | None = None, query_slot=None):
    """`cache_attention_state` in plain `jax.numpy`: the reference and test oracle.

    The decoder's math for its cached block (`cached_attention.attend_cached`, a TPU program's one masked
    block over the whole capacity): one [share * G * T, D] x [D, C] product per (cache row, kv head), scores
    masked to MASKED_SCORE, then the weights exp(score - max) zeroed where masked, so a query with no
    readable slot gets (MASKED_SCORE, 0, 0) as the kernel gives (the decoder's own form counts such slots
    with weight 1 at a max of -1e30, which any other block's max then scales to 0: the merged result is the
    same).
    """
    _check_inputs(q, cache_k, cache_v, valid_start, key_mask, window, None)
    batch, length, kv_heads, groups, head_dim = q.shape
    _, rows, _, capacity, _ = cache_k.shape
    query_slot = cache_index if query_slot is None else query_slot
    keys = jax.lax.dynamic_index_in_dim(cache_k, layer, keepdims=False)  # [R, kv, C, D]
    values = jax.lax.dynamic_index_in_dim(cache_v, layer, keepdims=False)
    queries = _stack_queries(q.astype(cache_k.dtype), rows)  # [R, kv, Q, D]
    scores = jnp.einsum("rkqd,rksd->rkqs", queries, keys, preferred_element_type=jnp.float32) * scale
    slots = jnp.arange(capacity)
    start = jnp.zeros((rows,), jnp.int32) if valid_start is None else jnp.asarray(valid_start, jnp.int32)
    allowed = (slots[None] >= start[:, None]) & (slots[None] < cache_index)  # [R, C]
    if key_mask is not None:
        allowed &= key_mask.astype(bool)
    allowed = jnp.broadcast_to(allowed[:, None, None, :], scores.shape)
    if window is not None:
        new_token = jnp.arange(scores.shape[2]) % length
        allowed &= (query_slot + new_token[:, None] - slots[None] < window)[None, None]
    scores = jnp.where(allowed, scores, MASKED_SCORE)
    top = scores.max(axis=-1)
    weights = jnp.where(allowed, jnp.exp(scores - top[..., None]), 0.0)
    out = jnp.einsum("rkqs,rksd->rkqd", weights.astype(values.dtype), values, preferred_element_type=jnp.float32)
    return (_unstack_state(top, batch, length, groups), _unstack_state(weights.sum(axis=-1), batch, length, groups),
            _unstack_state(out, batch, length, groups))
