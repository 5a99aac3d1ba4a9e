"""Decode attention over a paged KV pool as a Pallas GPU kernel (the Triton backend): the rollout engine's decode
reading its blocks in place on a GPU.

The contract is `pallas_decode.paged_attention_state`'s (the TPU kernel's, and the XLA reference's): the online-
softmax state (running max, normalizer, unnormalized output) of a decode step's queries over each row's live
positions [starts[r], lengths[r]) in a pool [L, N, kv, S, D] of N blocks of S positions, row r's positions
[j S, (j + 1) S) in pool block `tables[r, j]`; a sliding window drops positions `window` or more before a query.
Shapes are checked, and the rows split over a mesh, by the same code (`pallas_decode.paged_on_row_shards`).

How it runs on a GPU:

* the grid is (cache rows, kv heads): one program per row and kv head, 1024 programs at batch 128 with 8 kv heads;
  a program stacks its row's queries (share x G x T: the rows sharing a prefix row, the query heads of the kv head,
  the new tokens) into one [Q, D] block, so each key is read once for all of them;
* a program walks only the key blocks that meet its row's live range (and window), `pages` pool blocks per step:
  their ids come from the row's table, and one gathered load brings their keys [pages x S, D] (the pool stays in
  HBM in its own layout: no copy of a layer, no dense view of a row);
* scores and the online softmax are float32 (exp2, with the scale folded into log2(e)); products take the pool's
  dtype and accumulate in float32; the weights are cast to the pool's dtype before multiplying the values, as the
  decoder does.

Triton multiplies power-of-two blocks of at least 16: the pool's head dimension and block size must be powers of
two (the head dimension at least 16; a block of fewer than 16 positions is read `16 / S` blocks per step). The
stacked queries are padded to a power of two; fewer than 16 (a decode step's 2 on Qwen3: 2 query heads a kv head,
one new token) are read once and repeated in registers to the product's 16 rows, and only the first copy's state
is written, so the kernel reads and writes no padding (it wrote [R, kv, 16, D] float32 for 2 real rows: 8 MB a
layer at batch 128, and XLA padded the queries in a launch of its own). `supports(pool)` says whether a pool fits;
`pallas_gpu.paged_state` reads any other through `pallas_decode.xla_paged_attention_state`.

A decode step's attention is several states merged: the new token's own key, the row's blocks, its shared prefix's
blocks. With one new token a row (`fuses`) the kernel takes in the merging too, which the decoder would otherwise do
in launches of its own every layer (`pallas_gpu.paged_attention`): the first call reads the new token (`new`: the
products of the queries and its key, from the fusion that applies RoPE; its value), the next continues that call's
state (`initial`), and the last writes the normalized output in the model's dtype (`paged_attention`), not a
float32 state. Compiled for an H100 (`benchmarks/gpu_programs.py`, Qwen3-0.6B at batch 128 with shared prefixes),
that took a decode step from 474 to 447 device operations and its traffic outside the products from 1.79 to 1.69 GB.
On a CPU the kernel runs in Pallas' interpreter (`interpret=True`), for tests.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton

from jaxgrpo.distributed import round_up
from jaxgrpo.models.attention import pallas_decode
from jaxgrpo.models.attention.pallas_decode import MASKED_SCORE

#: Key positions per step of a program's loop (pool blocks gathered per step x their size), unless one block is
#: larger: enough for a [Q, D] x [D, K] product to keep a GPU's tensor cores busy.
KEYS_PER_STEP = 64
#: The fewest rows a Triton product takes (`tl.dot`'s M, N and K).
MIN_ROWS = 16
#: Triton's warps per program and software-pipelining stages of the key loop.
NUM_WARPS = 4
NUM_STAGES = 2

_LOG2E = math.log2(math.e)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def supports(pool: jax.Array) -> bool:
    """Whether the kernel reads `pool` [L, N, kv, S, D]: D a power of two of at least 16, S a power of two."""
    block_size, head_dim = pool.shape[3], pool.shape[4]
    return is_power_of_two(block_size) and is_power_of_two(head_dim) and head_dim >= 16


def pages_per_step(block_size: int, keys_per_step: int = KEYS_PER_STEP) -> int:
    """Pool blocks a program gathers per step: `keys_per_step` positions, at least one block."""
    return max(1, keys_per_step // block_size)


def _kernel(layer_ref, lengths_ref, query_positions_ref, starts_ref, tables_ref, q_ref, pool_k_ref, pool_v_ref,
            *refs, scale, window, length, pages, block_size, continues, reads_new, finish):
    """Program (r, h): cache row r's stacked queries [Q, D] of kv head h over the row's live key blocks. After the
    pool's refs come the initial state's top, total and out (`continues`: the state starts from it), then the new
    token's products, value and visibility (`reads_new`: merged in before the blocks), then the outputs: the
    state's top, total and out, or (`finish`) the normalized output alone."""
    r, h = pl.program_id(0), pl.program_id(1)
    refs = list(refs)
    initial = [refs.pop(0) for _ in range(3)] if continues else None
    new = [refs.pop(0) for _ in range(3)] if reads_new else None
    keys = pages * block_size
    layer, high, query_position = layer_ref[0], lengths_ref[r], query_positions_ref[r]
    low = jnp.maximum(starts_ref[r], 0)
    if window is not None:  # new token 0 reaches back furthest
        low = jnp.maximum(low, query_position - window + 1)
    first = low // keys
    stop = jnp.where(low < high, (high + keys - 1) // keys, first)
    q = q_ref[...]
    head_dim = q.shape[-1]
    q = q.reshape(-1, head_dim)  # a block [share, G, D] read in place: its queries in the stacked order
    given = q.shape[0]
    copies = max(1, MIN_ROWS // given)  # Triton's products take at least 16 rows: repeat the queries to fill them
    if copies > 1:
        q = jnp.broadcast_to(q[None], (copies, given, head_dim)).reshape(copies * given, head_dim)
    rows = q.shape[0]
    row = lax.rem(jnp.arange(rows, dtype=jnp.int32), jnp.int32(given))  # the block's query a product row holds
    query = query_position + lax.rem(row, jnp.int32(length))  # t fastest

    def visit(j, carry):
        blocks = tables_ref[pl.ds(j * pages, pages)]
        k = pool_k_ref[layer, blocks, h, :, :].reshape(keys, q.shape[1])
        v = pool_v_ref[layer, blocks, h, :, :].reshape(keys, q.shape[1])
        positions = j * keys + jnp.arange(keys, dtype=jnp.int32)
        allowed = ((positions >= low) & (positions < high))[None, :]
        if window is not None:
            allowed = allowed & (query[:, None] - positions[None, :] < window)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * (scale * _LOG2E)
        return _fold(carry, s, allowed, lambda p: lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                                                  preferred_element_type=jnp.float32))

    def repeated(x):  # each query's [given, ...] for each product row [rows, ...]
        return jnp.broadcast_to(x[None], (copies, *x.shape)).reshape(rows, *x.shape[1:]) if copies > 1 else x

    if initial is None:
        start = (jnp.zeros(q.shape, jnp.float32), jnp.full((rows,), MASKED_SCORE, jnp.float32),
                 jnp.zeros((rows,), jnp.float32))
    else:  # the state of keys read elsewhere, its max in log2 units
        top_in, total_in, out_in = (ref[...] for ref in initial)
        start = (repeated(out_in.reshape(given, head_dim)), repeated(top_in.reshape(given)) * _LOG2E,
                 repeated(total_in.reshape(given)))
    if new is not None:  # the row's own new token, one key at the queries' own position (inside any window)
        product_ref, value_ref, visible_ref = new
        s = repeated(product_ref[...].reshape(given))[:, None] * (scale * _LOG2E)
        value = value_ref[...].astype(jnp.float32)[None, :]
        start = _fold(start, s, visible_ref[r] != 0, lambda p: p * value)
    out, top, total = lax.fori_loop(first, stop, visit, start)
    if copies > 1:  # every copy holds the same state: keep the first
        out = _first_copy(out.reshape(copies, given, head_dim))
        top, total = (_first_copy(x.reshape(copies, given)) for x in (top, total))
    if finish:  # a query that saw no key (a row not running) gets zeros, not 0 / 0
        (out_ref,) = refs
        out = out / jnp.where(total > 0, total, 1.0)[:, None]
        out_ref[...] = out.reshape(out_ref.shape).astype(out_ref.dtype)
        return
    top_ref, total_ref, out_ref = refs
    seen = total > 0
    top_ref[...] = jnp.where(seen, top / _LOG2E, MASKED_SCORE).reshape(top_ref.shape)  # natural-log units
    total_ref[...] = total.reshape(total_ref.shape)
    out_ref[...] = out.reshape(out_ref.shape)


def _fold(state, s, allowed, weigh):
    """The online-softmax state (out [rows, D], top and total [rows], top in log2 units) with a block of keys
    folded in: their scores s [rows, K] in log2 units, read where `allowed`; `weigh(p)` is the values [rows, D] the
    block's weights p [rows, K] give."""
    out, top, total = state
    s = jnp.where(allowed, s, MASKED_SCORE)
    new_top = jnp.maximum(top, jnp.max(s, axis=1))
    p = jnp.where(allowed, jnp.exp2(s - new_top[:, None]), 0.0)
    decay = jnp.exp2(top - new_top)
    return out * decay[:, None] + weigh(p), new_top, total * decay + jnp.sum(p, axis=1)


def _first_copy(x: jax.Array) -> jax.Array:
    """x[0] of x [copies, ...], a power of two of copies, written as Triton lowers it (an even split)."""
    return jnp.split(x, x.shape[0], axis=0)[0].reshape(x.shape[1:])


def _shard(q, pool_k, pool_v, block_tables, layer, lengths, query_positions, starts, *extras, scale, window,
           keys_per_step, num_warps, num_stages, interpret, continues=False, reads_new=False, finish=False):
    """The kernel on one shard's rows and blocks (`pallas_decode.paged_on_row_shards` hands them over; `extras`:
    the initial state's top, total and out where it `continues`, the new token's products, values and visibility
    where it `reads_new`, then the key mask)."""
    *extras, key_mask = extras
    if key_mask is not None:
        raise ValueError("pallas_gpu's paged kernel takes no key_mask; read such a pool with "
                         "pallas_decode.xla_paged_attention_state")
    if not supports(pool_k):
        raise ValueError(f"pallas_gpu's paged kernel needs a power-of-two block size and head dimension (at least 16), "
                         f"got {pool_k.shape[3]} and {pool_k.shape[4]}; use pallas_decode.xla_paged_attention_state")
    length, kv_heads, head_dim = q.shape[1], q.shape[2], q.shape[4]
    rows, max_blocks = block_tables.shape
    if (continues or reads_new or finish) and not fuses(q, rows, reads_new=reads_new):
        raise ValueError(f"pallas_gpu's paged kernel continues a state, reads a new token or finishes only for one "
                         f"new token a row, a power of two of query heads a kv head and of query rows a cache row, "
                         f"and one query row a cache row where it reads a new token; got q {q.shape} over {rows} "
                         f"cache rows: merge the states outside it (`paged_attention_state` without them)")
    block_size = pool_k.shape[3]
    pages = pages_per_step(block_size, keys_per_step)
    # Each program loads whole steps of its table: pad it to a multiple of `pages` (with the null block, never read).
    tables = jnp.pad(block_tables, ((0, 0), (0, round_up(max_blocks, pages) - max_blocks)))
    queries, query_spec, state_spec, unstack = _query_layout(q.astype(pool_k.dtype), rows)
    scalars = (jnp.reshape(layer, (1,)), lengths, query_positions, starts)
    kernel = functools.partial(_kernel, scale=float(scale), window=window, length=length, pages=pages,
                               block_size=block_size, continues=continues, reads_new=reads_new, finish=finish)

    def whole(x):
        return pl.BlockSpec(x.shape, lambda r, h: (0,) * x.ndim)

    operands, specs = [], []
    if continues:  # [B, kv, G, 1(, D)] as the state's blocks [R, share, kv, G(, D)]
        top, total, out = extras[:3]
        operands += [top.reshape(queries.shape[:-1]), total.reshape(queries.shape[:-1]), out.reshape(queries.shape)]
        specs += [state_spec, state_spec, query_spec]
    if reads_new:  # one cache row a query row: program (r, h) reads row r's products and value of head h
        products, values, visible = extras[-3:]
        operands += [products.reshape(queries.shape[:-1]).astype(jnp.float32), values.astype(pool_k.dtype),
                     visible.astype(jnp.int32)]
        specs += [state_spec, pl.BlockSpec((None, None, head_dim), lambda r, h: (r, h, 0)), whole(visible)]
    if finish:
        out_specs, out_shape = [query_spec], [jax.ShapeDtypeStruct(queries.shape, q.dtype)]
    else:
        state_shape = jax.ShapeDtypeStruct(queries.shape[:-1], jnp.float32)
        out_specs = [state_spec, state_spec, query_spec]
        out_shape = [state_shape, state_shape, jax.ShapeDtypeStruct(queries.shape, jnp.float32)]
    results = pl.pallas_call(
        kernel, grid=(rows, kv_heads),
        in_specs=[whole(x) for x in scalars] + [pl.BlockSpec((None, tables.shape[1]), lambda r, h: (r, 0)),
                                                query_spec, whole(pool_k), whole(pool_v)] + specs,
        out_specs=out_specs, out_shape=out_shape,
        compiler_params=pallas_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret, name="paged_attention_gpu" if finish else "paged_attention_state_gpu",
    )(*scalars, tables, queries, pool_k, pool_v, *operands)
    return tuple(unstack(x) for x in results)


def fuses(q, rows: int, *, reads_new: bool = False) -> bool:
    """Whether the kernel can continue a state, read the new token and finish for the queries q [B, T, kv, G, D]
    over `rows` cache rows: one new token a row read where it sits (T = 1, power-of-two G and B / rows), and to
    read the new token, one cache row a query row."""
    batch, length, _, groups, _ = q.shape
    share = batch // rows
    return length == 1 and is_power_of_two(share) and is_power_of_two(groups) and (share == 1 or not reads_new)


def _query_layout(q, rows):
    """How program (r, h) finds its stacked queries (share x G x T, t fastest) and where it writes their state:
    (queries, their block spec, the state's block spec, state -> [B, kv, G, T, ...]).

    One new token a row (T = 1) with power-of-two `share` and G: the queries read where they are, a block
    [share, G, D] of q [R, share, kv, G, D] (strided; no copy), the state written the same way, and [B, kv, G, 1]
    is a reshape of it (a decode step's shared prefix: XLA transposed its queries into the stacked order in a
    launch of its own, every layer). Otherwise `pallas_decode.stack_queries`' [R, kv, Q, D], Q padded to a power
    of two (a transpose where share > 1 or T > 1)."""
    batch, length, kv_heads, groups, head_dim = q.shape
    share = batch // rows
    if length == 1 and is_power_of_two(share) and is_power_of_two(groups):
        queries = q.reshape(rows, share, kv_heads, groups, head_dim)
        query_spec = pl.BlockSpec((None, share, None, groups, head_dim), lambda r, h: (r, 0, h, 0, 0))
        state_spec = pl.BlockSpec((None, share, None, groups), lambda r, h: (r, 0, h, 0))

        def unstack(x):  # [R, share, kv, G, ...] -> [B, kv, G, 1, ...]
            return x.reshape(batch, kv_heads, groups, 1, *x.shape[4:])

        return queries, query_spec, state_spec, unstack
    queries = pallas_decode.stack_queries(q, rows)  # [R, kv, Q, D]
    stacked = queries.shape[2]
    padded = pl.next_power_of_2(stacked)
    if padded > stacked:
        queries = jnp.pad(queries, ((0, 0), (0, 0), (0, padded - stacked), (0, 0)))
    query_spec = pl.BlockSpec((None, None, padded, head_dim), lambda r, h: (r, h, 0, 0))
    state_spec = pl.BlockSpec((None, None, padded), lambda r, h: (r, h, 0))

    def unstack(x):
        return pallas_decode.unstack_state(x[:, :, :stacked], batch=batch, length=length, groups=groups)

    return queries, query_spec, state_spec, unstack


def paged_attention_state(q, pool_k, pool_v, block_tables, layer, lengths, scale: float, *, starts=None,
                          window: int | None = None, query_positions=None, mesh=None, initial=None, new=None,
                          keys_per_step: int = KEYS_PER_STEP, num_warps: int = NUM_WARPS,
                          num_stages: int = NUM_STAGES, interpret: bool = False):
    """`pallas_decode.paged_attention_state` (arguments, result and meaning) through the GPU kernel: each row's
    live blocks read in place, `keys_per_step` positions per step of a program's loop. No `key_mask`.

    With one new token a row read where it sits (`fuses`), the kernel also takes in what the decoder would
    otherwise merge in launches of its own:
      initial: (top, total) float32 [B, kv, G, 1] and out float32 [B, kv, G, 1, D], the state of keys read
        elsewhere (another call's): the result is the state of both.
      new: (products, values, visible): each query row's own new token (one cache row a query row), a key at the
        queries' own position, as the products float32 [B, kv, G] of the queries and its key (unscaled), its
        value [B, kv, D], and whether its queries see it, bool [B] (a decode step's new token sees itself where
        its row runs); the result counts it.

    Returns:
      (top, total) float32 [B, kv, G, T] and out float32 [B, kv, G, T, D].
    """
    return _paged(q, pool_k, pool_v, block_tables, layer, lengths, scale, starts, window, query_positions, mesh,
                  initial, new, False, keys_per_step, num_warps, num_stages, interpret)


def paged_attention(q, pool_k, pool_v, block_tables, layer, lengths, scale: float, *, starts=None,
                    window: int | None = None, query_positions=None, mesh=None, initial=None, new=None,
                    keys_per_step: int = KEYS_PER_STEP, num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES,
                    interpret: bool = False):
    """`paged_attention_state`'s state normalized in the kernel: the attention output [B, kv, G, 1, D] in q's
    dtype (`out / total`, as the decoder finishes a state), for one new token a row read where it sits (`fuses`):
    the last call of a decode step's attention, written in the model's dtype with no float32 state for XLA to
    read back and divide. A query that saw no key (a row not running, with nothing cached) gets zeros."""
    (out,) = _paged(q, pool_k, pool_v, block_tables, layer, lengths, scale, starts, window, query_positions, mesh,
                    initial, new, True, keys_per_step, num_warps, num_stages, interpret)
    return out


def _paged(q, pool_k, pool_v, block_tables, layer, lengths, scale, starts, window, query_positions, mesh, initial,
           new, finish, keys_per_step, num_warps, num_stages, interpret):
    extras = ()
    if initial is not None:
        extras += tuple(initial)
    if new is not None:
        extras += tuple(new)
    kernel = functools.partial(_shard, scale=scale, window=window, keys_per_step=keys_per_step,
                               num_warps=num_warps, num_stages=num_stages, interpret=interpret,
                               continues=initial is not None, reads_new=new is not None, finish=finish)
    return pallas_decode.paged_on_row_shards(kernel, q, pool_k, pool_v, block_tables, layer, lengths, starts, None,
                                             window, query_positions, mesh, extras=extras,
                                             outputs=1 if finish else 3)
