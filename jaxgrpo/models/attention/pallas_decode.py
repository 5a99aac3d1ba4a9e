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

The same kernel reads a **paged** pool in place (`paged_attention_state`): the rollout engine's pool
[L, N, kv, S, D] of N blocks of S positions, each row's positions [j S, (j + 1) S) in the block its table
names, the block tables scalar-prefetched (flat, [R x M]) so a copy's source is known before it starts.
Only the source of a block's copy changes (the pool block `tables[r, j]`, not slots [j S, (j + 1) S) of
row r), and each row has its own live end (`lengths`) and query position, as the engine's rows do; the
live range, windows, masks, shared-prefix rows and the pipeline of copies are the contiguous kernel's.

`xla_cache_attention_state` is the same state in plain `jax.numpy` (the decoder's math over the
whole capacity, masked): the oracle the kernel is tested against, in interpret mode on CPU;
`xla_paged_attention_state` gathers each row's blocks (`gather_rows`) and does the same.
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


def _named_refs(refs, has_tables, has_key_mask):
    """The kernel's refs after the scalar-prefetched ones as (tables or None, queries, key mask or None, *rest)."""
    tables_ref, *refs = refs if has_tables else (None, *refs)
    q_ref, *refs = refs
    mask_ref, *refs = refs if has_key_mask else (None, *refs)
    return (tables_ref, q_ref, mask_ref, *refs)


def _kernel(layer_ref, ends_ref, query_slots_ref, start_ref, *refs, scale, block_size, capacity, length, window,
            has_key_mask, max_blocks):
    """Grid step r: fold cache row r's live blocks (its slots end at `ends_ref[r]`, new token 0 at
    `query_slots_ref[r]`) into its stacked queries' state [kv, Q, D], Q = share x G x T, t fastest; in order
    (the next row's first block is copied during this one's last). With `max_blocks` (a paged pool) a flat block
    table [R * max_blocks] precedes the queries: row r's block j is pool block `tables[r * max_blocks + j]`."""
    tables_ref, q_ref, mask_ref, *refs = _named_refs(refs, max_blocks is not None, has_key_mask)
    cache_k, cache_v, top_ref, total_ref, out_ref, k_buffer, v_buffer, semaphores, copy_state = refs
    # Rows split into `pl.num_programs(0)` runs of consecutive rows, one per TensorCore on megacore chips
    # (v4, v5p), each run in order: its row i prefetches row i + 1's first block.
    step, per_run = pl.program_id(1), pl.num_programs(1)
    r = pl.program_id(0) * per_run + step
    layer, query_slot = layer_ref[0], query_slots_ref[r]
    kv_heads = q_ref.shape[0]

    def row_blocks(row):
        low, high = _live_range(start_ref[row], ends_ref[row], query_slots_ref[row], window, capacity)
        return (low, high, *live_blocks(low, high, block_size))

    def copies(row, block, slot):  # every kv head's slots of one block, keys and values
        if tables_ref is None:  # the row's own slots of a contiguous cache
            slots = pl.ds(pl.multiple_of(block * block_size, block_size), block_size)
            k_source, v_source = cache_k.at[layer, row, :, slots, :], cache_v.at[layer, row, :, slots, :]
        else:  # the pool block its table names
            index = tables_ref[row * max_blocks + block]
            k_source, v_source = cache_k.at[layer, index], cache_v.at[layer, index]
        return (pltpu.make_async_copy(k_source, k_buffer.at[slot], semaphores.at[0, slot]),
                pltpu.make_async_copy(v_source, v_buffer.at[slot], semaphores.at[1, slot]))

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


def stack_queries(q, rows):
    """q [B, T, kv, G, D] -> [R, kv, share * G * T, D]: a cache row's queries, t fastest (the decoder's order)."""
    batch, length, kv_heads, groups, head_dim = q.shape
    share = batch // rows
    q = q.reshape(rows, share, length, kv_heads, groups, head_dim)
    return jnp.transpose(q, (0, 3, 1, 4, 2, 5)).reshape(rows, kv_heads, share * groups * length, head_dim)


def unstack_state(x, batch, length, groups):
    """[R, kv, share * G * T, ...] -> [B, kv, G, T, ...], the inverse of `stack_queries`' row order."""
    rows, kv_heads = x.shape[:2]
    share = batch // rows
    x = x.reshape(rows, kv_heads, share, groups, length, *x.shape[3:])
    return jnp.swapaxes(x, 1, 2).reshape(batch, kv_heads, groups, length, *x.shape[5:])


def full_cache_cost_estimate(rows: int, kv_heads: int, stacked: int, capacity: int, head_dim: int, itemsize: int,
                             key_mask: bool, positions: int | None = None) -> pl.CostEstimate:
    """The kernel's cost on one shard as its `cost_estimate`, at a full cache: every row's C slots of one
    layer's keys and values read once, with its queries (R x kv x Q x D, Q = share x G x T stacked) and
    the float32 state it writes, and two products per slot ([Q, D] x [D, C], then [Q, C] x [C, D]).

    Full, not live, because the live length is known only at run time, and it is the worst case the
    compile report's HBM floor of a decode step takes (parameters and the whole cache a chip holds, read
    once per token): the estimate is comparable with that floor, and at most the capacity's bytes late in a
    completion, the steps that cost most.

    `positions`: the positions read in all, where fewer than R x C can be live (a paged pool: at most its blocks'
    positions, `paged_cost_estimate`)."""
    positions = rows * capacity if positions is None else min(positions, rows * capacity)
    cache = 2 * kv_heads * positions * head_dim * itemsize  # keys and values
    queries = rows * kv_heads * stacked * head_dim * itemsize
    state = rows * kv_heads * stacked * (head_dim + 2) * 4  # out, top and total, float32
    mask = positions * 4 if key_mask else 0  # the key mask as int32, one per slot
    return pl.CostEstimate(flops=4 * kv_heads * stacked * positions * head_dim,
                           transcendentals=kv_heads * stacked * positions,
                           bytes_accessed=cache + queries + state + mask)


def paged_cost_estimate(rows: int, kv_heads: int, stacked: int, max_blocks: int, pool_blocks: int, block_size: int,
                        head_dim: int, itemsize: int, key_mask: bool) -> pl.CostEstimate:
    """The paged kernel's cost on one shard: `full_cache_cost_estimate` over every row's whole table (R x M x S
    positions), but at most the pool's N x S positions, all its blocks live. A pool smaller than its rows' tables
    (the rollout engine's, sized for the tokens that live) bounds what one call can read; the bound is exact where
    no two rows read one block (a shared prompt's blocks read through prefix rows, as the engine's decode reads
    them), and low by the repeats where rows read a shared block themselves."""
    return full_cache_cost_estimate(rows, kv_heads, stacked, max_blocks * block_size, head_dim, itemsize, key_mask,
                                    positions=pool_blocks * block_size)


def _pallas_state(q, cache_k, cache_v, layer, cache_index, query_slot, valid_start, key_mask, block_tables=None, *,
                  scale, window, block_size, interpret):
    """The kernel on one shard: arguments as `cache_attention_state`'s (`cache_index` and `query_slot` scalars or
    one per cache row), or with `block_tables` [R, M] as `paged_attention_state`'s over a pool [L, N, kv, S, D]
    (block_size S, capacity M x S); every array already this shard's."""
    batch, length, kv_heads, groups, head_dim = q.shape
    if block_tables is None:
        _, rows, _, capacity, _ = cache_k.shape
        max_blocks = None
    else:
        rows, max_blocks = block_tables.shape
        capacity = max_blocks * block_size
    queries = stack_queries(q.astype(cache_k.dtype), rows)
    stacked = queries.shape[2]

    runs = 2 if rows % 2 == 0 else 1  # two TensorCores on megacore chips; elsewhere the runs follow each other
    per_run = rows // runs

    def row(run, step, *_):  # the scalar-prefetched refs follow the grid indices
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
                               window=window, has_key_mask=key_mask is not None, max_blocks=max_blocks)
    per_row = lambda x: jnp.broadcast_to(jnp.asarray(x, jnp.int32), (rows,))  # noqa: E731
    start = jnp.zeros((rows,), jnp.int32) if valid_start is None else jnp.asarray(valid_start, jnp.int32)
    prefetched = [jnp.asarray(layer, jnp.int32).reshape(1), per_row(cache_index), per_row(query_slot), start]
    if block_tables is not None:  # flat: a 2-D array in SMEM pads its rows
        prefetched.append(jnp.asarray(block_tables, jnp.int32).reshape(-1))
    top, total, out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetched), grid=(runs, per_run), in_specs=in_specs, out_specs=[state_spec, state_spec, out_spec],
            scratch_shapes=[buffer, buffer, pltpu.SemaphoreType.DMA((2, 2)), pltpu.SMEM((2,), jnp.int32)]),
        out_shape=[state_shape, state_shape, jax.ShapeDtypeStruct((rows, kv_heads, stacked, head_dim), jnp.float32)],
        # Within a run, sequential: a row's step waits on the copy the step before it started.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
        cost_estimate=(full_cache_cost_estimate(rows, kv_heads, stacked, capacity, head_dim, cache_k.dtype.itemsize,
                                                key_mask is not None) if block_tables is None else
                       paged_cost_estimate(rows, kv_heads, stacked, max_blocks, cache_k.shape[1], block_size, head_dim,
                                           cache_k.dtype.itemsize, key_mask is not None)),
        name="cache_attention_state" if block_tables is None else "paged_attention_state",
    )(*prefetched, *operands)
    return (unstack_state(top[..., 0], batch, length, groups), unstack_state(total[..., 0], batch, length, groups),
            unstack_state(out, batch, length, groups))


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
    rows = cache_k.shape[1]
    valid_start = jnp.zeros((rows,), jnp.int32) if valid_start is None else valid_start
    operands = [q, cache_k, cache_v, jnp.asarray(layer, jnp.int32), jnp.asarray(cache_index, jnp.int32),
                jnp.asarray(query_slot, jnp.int32), valid_start]
    return _on_row_shards(kernel, mesh, operands, ("q", "cache", "cache", "scalar", "scalar", "scalar", "rows"),
                          key_mask, rows, "the cache's", "a cache whose rows they divide")


def _on_row_shards(kernel, mesh, operands, kinds, key_mask, rows, whose, fix, *, outputs: int = 3):
    """`kernel(*operands, key_mask)` whole (no mesh), or on each of the mesh's row shards: rows over its data and
    fsdp axes, kv heads over "model" where it divides them. `kinds` gives each operand's layout: "q" [B, T, kv,
    ...], "cache" [L, rows or blocks, kv, ...], "rows" [R, ...], "state" [B, kv, ...] or "scalar"; the key mask is
    [R, ...]; the kernel's `outputs` results are [B, kv, ...]."""
    if mesh is None or mesh.size == 1:
        return kernel(*operands, key_mask)
    row_axes = batch_axes(mesh) or None
    shards = batch_shards(mesh)
    if rows % shards:
        raise ValueError(f"{whose} {rows} rows do not split over the mesh's {shards} row shards ({row_axes}); pass "
                         f"{fix}, or mesh=None")
    head_axis = "model" if "model" in mesh.axis_names and operands[0].shape[2] % mesh.shape["model"] == 0 else None
    state_spec = PartitionSpec(row_axes, head_axis)
    spec = {"q": PartitionSpec(row_axes, None, head_axis), "cache": PartitionSpec(None, row_axes, head_axis),
            "rows": PartitionSpec(row_axes), "state": state_spec, "scalar": PartitionSpec()}
    specs = tuple(spec[kind] for kind in kinds) + (() if key_mask is None else (spec["rows"],))

    def shard(*args):
        return kernel(*args) if key_mask is not None else kernel(*args, None)

    return jax.shard_map(shard, mesh=mesh, in_specs=specs, out_specs=(state_spec,) * outputs,
                         check_vma=False)(*operands, *(() if key_mask is None else (key_mask,)))


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
    keys = jax.lax.dynamic_index_in_dim(cache_k, layer, keepdims=False)  # [R, kv, C, D]
    values = jax.lax.dynamic_index_in_dim(cache_v, layer, keepdims=False)
    query_slot = cache_index if query_slot is None else query_slot
    return _xla_state(q, keys, values, cache_index, query_slot, valid_start, key_mask, scale, window)


def _xla_state(q, keys, values, ends, query_slots, starts, key_mask, scale, window):
    """The reference state over one layer's rows `keys`, `values` [R, kv, C, D]: row r's slots [starts[r],
    ends[r]) where `key_mask`, its new token t at slot `query_slots[r] + t` for the window (`ends`,
    `query_slots`: scalars or [R]; `starts` [R] or None)."""
    batch, length, _, groups, _ = q.shape
    rows, _, capacity, _ = keys.shape
    per_row = lambda x: jnp.broadcast_to(jnp.asarray(x, jnp.int32), (rows,))  # noqa: E731
    queries = stack_queries(q.astype(keys.dtype), rows)  # [R, kv, Q, D]
    scores = jnp.einsum("rkqd,rksd->rkqs", queries, keys, preferred_element_type=jnp.float32) * scale
    slots = jnp.arange(capacity)
    start = per_row(0 if starts is None else starts)
    allowed = (slots[None] >= start[:, None]) & (slots[None] < per_row(ends)[:, None])  # [R, C]
    if key_mask is not None:
        allowed &= key_mask.astype(bool)
    allowed = jnp.broadcast_to(allowed[:, None, None, :], scores.shape)
    if window is not None:
        new_token = jnp.arange(scores.shape[2]) % length
        query = per_row(query_slots)[:, None, None] + new_token[None, :, None]  # [R, Q, 1]
        allowed &= (query - slots[None, None] < window)[:, None]
    scores = jnp.where(allowed, scores, MASKED_SCORE)
    top = scores.max(axis=-1)
    weights = jnp.where(allowed, jnp.exp(scores - top[..., None]), 0.0)
    out = jnp.einsum("rkqs,rksd->rkqd", weights.astype(values.dtype), values, preferred_element_type=jnp.float32)
    return (unstack_state(top, batch, length, groups), unstack_state(weights.sum(axis=-1), batch, length, groups),
            unstack_state(out, batch, length, groups))


def _check_paged_inputs(q, pool_k, pool_v, block_tables, lengths, starts, query_positions, key_mask, window):
    """One-line errors for a paged call's shapes, before anything is traced into a kernel."""
    if q.ndim != 5:
        raise ValueError(f"q must be [batch, new tokens, kv heads, groups, head_dim], got shape {q.shape}")
    if pool_k.ndim != 5 or pool_k.shape != pool_v.shape or pool_k.dtype != pool_v.dtype:
        raise ValueError("pool_k and pool_v must both be [layers, blocks, kv heads, block_size, head_dim] of one "
                         f"dtype, got {pool_k.shape} {pool_k.dtype} and {pool_v.shape} {pool_v.dtype}")
    if np.ndim(block_tables) != 2 or not jnp.issubdtype(jnp.result_type(block_tables), jnp.integer):
        raise ValueError(f"block_tables must be int [cache rows, blocks per row], got shape {np.shape(block_tables)}")
    batch, _, kv_heads, _, head_dim = q.shape
    _, _, pool_heads, block_size, pool_head_dim = pool_k.shape
    rows, max_blocks = np.shape(block_tables)
    if (kv_heads, head_dim) != (pool_heads, pool_head_dim):
        raise ValueError(f"q has {kv_heads} kv heads of size {head_dim} but the pool has {pool_heads} of size "
                         f"{pool_head_dim}")
    if batch % rows:
        raise ValueError(f"the block tables' {rows} rows must divide q's {batch} rows (consecutive rows share one)")
    for name, value in (("lengths", lengths), ("starts", starts), ("query_positions", query_positions)):
        if value is not None and np.shape(value) != (rows,):
            raise ValueError(f"{name} must be [cache rows] = ({rows},), got shape {np.shape(value)}")
    if key_mask is not None and np.shape(key_mask) != (rows, max_blocks * block_size):
        raise ValueError(f"key_mask must be [cache rows, blocks per row x block_size] = {(rows, max_blocks * block_size)}, "
                         f"got shape {np.shape(key_mask)}")
    if window is not None and window < 1:
        raise ValueError(f"window must be a positive number of positions or None, got {window}")


def paged_attention_state(q, pool_k, pool_v, block_tables, layer, lengths, scale: float, *, starts=None,
                          key_mask=None, window: int | None = None, query_positions=None, mesh=None,
                          interpret=False):
    """Online-softmax state of the queries over each row's live positions in a paged KV pool, read in place by the
    decode kernel (`cache_attention_state`'s, copying each live block from the pool block its table names).

    The pool holds every layer's keys and values in blocks of S positions, [L, N, kv, S, D] (the rollout engine's
    `PagedKVCache`); cache row r's positions [j S, (j + 1) S) live in pool block `block_tables[r, j]`. Query t of
    row b reads position p of cache row r = b // (B // R) iff `starts[r] <= p < lengths[r]`, `key_mask[r, p]`,
    and `query_positions[r] + t - p < window`: the same state as `cache_attention_state` over a contiguous cache
    holding each row's positions at their slots, with one live end per row. Only the blocks meeting a row's live
    positions are copied (and read from its table); the entries after them may name any block.

    Args:
      q: [B, T, kv, G, D] the new tokens' queries (RoPE applied).
      pool_k, pool_v: the pool [L, N, kv, S, D], read in place: only layer `layer`'s blocks that rows name.
      block_tables: int32 [R, M], R dividing B: each cache row's blocks (on a mesh, ids local to the row's shard).
      layer: int32 scalar, may be traced.
      lengths: int32 [R]: row r holds positions [0, lengths[r]) (its live end).
      scale: the score scale.
      starts: int32 [R] or None: each row's first position to read (a shared prefix's length: read elsewhere).
      key_mask: bool [R, M x S] or None: further positions to drop.
      window: a sliding window in positions, static, or None.
      query_positions: int32 [R], the position of each row's new token 0 (default `lengths`); rows sharing a
        cache row share it.
      mesh: a mesh to split rows and their pool blocks over (axes "data" and "fsdp", those present; a row's blocks
        on its own shard) and kv heads over ("model", where it divides them); None runs it whole.
      interpret: run the kernel in Pallas' interpreter, for CPU tests.

    Returns:
      (top, total) float32 [B, kv, G, T] and out float32 [B, kv, G, T, D].
    """
    kernel = functools.partial(_paged_shard, scale=scale, window=window, block_size=pool_k.shape[3],
                               interpret=interpret)
    return paged_on_row_shards(kernel, q, pool_k, pool_v, block_tables, layer, lengths, starts, key_mask, window,
                               query_positions, mesh)


def paged_on_row_shards(kernel, q, pool_k, pool_v, block_tables, layer, lengths, starts, key_mask, window,
                        query_positions, mesh, *, extras=(), outputs: int = 3):
    """`kernel` (`_paged_shard`, `_xla_paged_shard`, or another backend's paged kernel on one shard) on the whole
    pool, or on each of the mesh's row shards (its rows, their tables of local ids and its blocks), kv heads over
    "model" where it divides them. `extras`: further operands, each [B, kv, ...] (split as the state is) or [B],
    passed after `starts`; the kernel returns `outputs` arrays [B, kv, ...]."""
    _check_paged_inputs(q, pool_k, pool_v, block_tables, lengths, starts, query_positions, key_mask, window)
    rows = np.shape(block_tables)[0]
    lengths = jnp.asarray(lengths, jnp.int32)
    query_positions = lengths if query_positions is None else jnp.asarray(query_positions, jnp.int32)
    starts = jnp.zeros((rows,), jnp.int32) if starts is None else jnp.asarray(starts, jnp.int32)
    operands = [q, pool_k, pool_v, jnp.asarray(block_tables, jnp.int32), jnp.asarray(layer, jnp.int32), lengths,
                query_positions, starts, *extras]
    kinds = ("q", "cache", "cache", "rows", "scalar", "rows", "rows", "rows") + tuple(
        "rows" if np.ndim(x) == 1 else "state" for x in extras)
    return _on_row_shards(kernel, mesh, operands, kinds, key_mask, rows, "the block tables'", "rows they divide",
                          outputs=outputs)


def _paged_shard(q, pool_k, pool_v, block_tables, layer, lengths, query_positions, starts, key_mask, *, scale, window,
                 block_size, interpret):
    return _pallas_state(q, pool_k, pool_v, layer, lengths, query_positions, starts, key_mask, block_tables,
                         scale=scale, window=window, block_size=block_size, interpret=interpret)


def gather_rows(pool, block_tables, layer):
    """Layer `layer` of each row's blocks as a contiguous cache [R, kv, M x S, D]: row r's position p at slot p."""
    blocks = jax.lax.dynamic_index_in_dim(pool, layer, keepdims=False)[block_tables]  # [R, M, kv, S, D]
    rows, max_blocks, kv_heads, block_size, head_dim = blocks.shape
    return jnp.swapaxes(blocks, 1, 2).reshape(rows, kv_heads, max_blocks * block_size, head_dim)


def xla_paged_attention_state(q, pool_k, pool_v, block_tables, layer, lengths, scale: float, *, starts=None,
                              key_mask=None, window: int | None = None, query_positions=None, mesh=None):
    """`paged_attention_state` in plain `jax.numpy`: each row's blocks gathered into a contiguous row
    (`gather_rows`: the whole of every row's table, every call), then `xla_cache_attention_state`'s math with one
    live end per row. The oracle, and the paged read of a backend without a kernel for it."""
    kernel = functools.partial(_xla_paged_shard, scale=scale, window=window)
    return paged_on_row_shards(kernel, q, pool_k, pool_v, block_tables, layer, lengths, starts, key_mask, window,
                               query_positions, mesh)


def _xla_paged_shard(q, pool_k, pool_v, block_tables, layer, lengths, query_positions, starts, key_mask, *, scale,
                     window):
    keys, values = gather_rows(pool_k, block_tables, layer), gather_rows(pool_v, block_tables, layer)
    return _xla_state(q, keys, values, lengths, query_positions, starts, key_mask, scale, window)
