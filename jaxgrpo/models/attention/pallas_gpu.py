"""Training and scoring attention through a Pallas flash-attention kernel for GPUs (the Triton backend).

Flash attention (Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness", 2022; Dao, "FlashAttention-2", 2023) never holds a [T, T] score matrix: each program
keeps a block of queries and streams blocks of keys past it, folding each into an online softmax in
float32 (a running max, a running sum of exponentials, an unnormalised output), so memory grows linearly
in T. It returns the log-sum-exp of each query's scores with its output; the backward recomputes the
probabilities from it, block by block: dq per block of queries, dk and dv per block of keys.

The kernels read and write the model's layout where it keeps it: q, the output and dq [B, T, heads, D], k, v,
dk and dv [B, T, kv heads, D], the log-sum-exp [B, T, heads]; no transposed copy of any of them is made around
the calls. A forward or dq program takes `BLOCK_Q` slots of one query head and streams its key/value head's
blocks (the G query heads sharing one read the same blocks, which the GPU's L2 serves); a dk/dv program takes
`BLOCK_K` slots of one key/value head and sums over the query blocks of its G query heads. Compiled for an H100
(`benchmarks/gpu_programs.py --update`, Qwen3-0.6B), reading the model's layout instead of a [B, kv, T G, D]
copy took the update's traffic outside its GEMMs from 1.10 to 1.01 TB.

A query sees a key when their segment ids are equal, the key is not after it (causal in slot order),
and, in a sliding layer, fewer than `window` apart (q - w < s <= q; in packed prompt groups the window
counts positions, not slots: a branch's slots are shifted from its positions by the earlier branches'
lengths, so the kernel takes the positions a window counts as an input). The layouts map onto segment
ids and calls as `flash_common` describes: one call for padded rows and packed segments, two for packed
prompt groups (own branch, segment trunk), merged exactly by log-sum-exp (`flash_common.lse_union`).
No layout and no flag falls back to the XLA form.

Blocks that cannot hold a visible (query, key) pair are not visited: from the per-block minimum and
maximum of the query ids and the key ids (a pair of blocks whose intervals do not overlap shares no id:
correct for any ids, and in packed rows, where ids are contiguous runs, it keeps a query block to its own
segment's keys), the causal diagonal, and the window (the smallest query position of a block minus the
largest key position of the other), XLA computes for each query block the range of key blocks it visits
(for dq and the forward) and for each key block the range of query blocks (for dk and dv), the kernels'
loop bounds. Pairs inside a range that hold no visible pair (none in the layouts here, whose visited
blocks are contiguous) are computed and fully masked, not skipped: a `lax.cond` in the loop body would
keep Triton from pipelining its loads.

Where T is not a multiple of the blocks, the slots are padded with segment ids no real slot has, and where the
head dimension is not a power of two of at least 16 (what Triton's matrix products take), it is padded: copies
only then. Scores are soft-capped
(c tanh(s / c), Gemma 2) when `logit_soft_cap` is given, with the cap's derivative in the backward.
Inputs are float32 or bfloat16; products accumulate in float32 (a float32 product is IEEE float32 in
Triton, not TF32). On a mesh the kernels run per shard (`flash_common.per_shard`); on a CPU they run
interpreted (`interpret=True`): for tests, slowly. The block sizes, warps and stages are static
(`Tiling`, defaults `BLOCK_Q`, `BLOCK_K`, `NUM_WARPS`, `NUM_STAGES`), to be tuned on a GPU.

The rollout engine's paged decode reads its blocks in place through `pallas_gpu_decode`'s kernel (`paged_state`;
`paged_attention` where the kernel also takes in the new token and the merges, one new token a row);
decode steps over dense cache views (`Engine(in_place=False)`) keep the decoder's XLA math on a GPU (no
`cache_state`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton

from jaxgrpo.distributed import round_up
from jaxgrpo.models.attention import (AttentionImplementation, AttentionLayout, flash_common, pallas_decode,
                                      paged_at_windows, pallas_gpu_decode, target_platform, with_window)
from jaxgrpo.models.attention.flash_common import PAD_KEY, PAD_QUERY

#: Query slots (of one query head) per block.
BLOCK_Q = 64
#: Key slots per block.
BLOCK_K = 64
#: Warps per program and software-pipelining stages of the key (or query) loop (Triton's compiler options).
NUM_WARPS = 4
NUM_STAGES = 2

# Triton's compiler options (`CompilerParams`; older JAX called it `TritonCompilerParams`).
_COMPILER_PARAMS = getattr(pallas_triton, "CompilerParams", None) or getattr(pallas_triton, "TritonCompilerParams")
# Scores are exponentiated in base 2 (exp2 is one instruction): s log2(e).
_LOG2E = math.log2(math.e)
# The running max of a row that has seen no key yet, and the log-sum-exp of a row that sees none: finite,
# so that merging and differentiating such rows (padding) stays free of NaNs.
_NO_KEY = -1e30
_INT_MAX, _INT_MIN = np.iinfo(np.int32).max, np.iinfo(np.int32).min


class Tiling(NamedTuple):
    """The kernels' static choices: query slots per block and slots per key block (powers of two, at least
    16), and Triton's warps per program and pipelining stages."""

    block_q: int = BLOCK_Q
    block_k: int = BLOCK_K
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES


class CallSettings(NamedTuple):
    """What the kernels of one attention call are specialised on (static): the scores' scale and soft cap,
    the window (None: full), the real slots T and query heads per key/value head G, the tiling, and
    whether they run interpreted."""

    scale: float
    logit_soft_cap: float | None
    window: int | None
    length: int  # real slots T
    groups: int  # query heads per key/value head G
    tiling: Tiling
    interpret: bool


def prepare(layout: AttentionLayout, positions: jax.Array, window: int | None) -> dict[str, jax.Array]:
    """Segment ids [B, T] of the kernel's calls (`flash_common.segment_ids`), and with a window the
    positions i32[B, T] it counts ("window_positions"): the slots, or for packed prompt groups the tokens'
    positions (module docstring)."""
    masks = flash_common.segment_ids(layout)
    if window:
        slots = jnp.broadcast_to(jnp.arange(positions.shape[1], dtype=jnp.int32), positions.shape)
        masks["window_positions"] = positions.astype(jnp.int32) if layout.kind == "branches" else slots
    return masks


# The kernels. The forward and dq kernels' refs hold one (row, query head)'s arrays, the dk/dv kernel's one (row,
# key/value head)'s with its G query heads; a query block is `block_q` slots, a key block `block_k` slots.


def _scores(q, k, *, scale, logit_soft_cap):
    """Scores [M, N] in float32 of queries q [M, D] and keys k [N, D]: cap(scale q.k), with the tanh the
    cap's derivative needs (None without a cap)."""
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
    if logit_soft_cap is None:
        return s, None
    t = jnp.tanh(s / logit_soft_cap)
    return logit_soft_cap * t, t


def _visible(q_ids, q_slots, q_positions, k_ids, k_slots, k_positions, window):
    """bool[M, N]: query i sees key j (equal ids, causal in slots, within the window of positions)."""
    mask = (q_ids[:, None] == k_ids[None, :]) & (q_slots[:, None] >= k_slots[None, :])
    if window is not None:
        mask &= q_positions[:, None] - k_positions[None, :] < window
    return mask


def _score_gradients(q, k, v, d_out, lse, delta, mask, *, scale, logit_soft_cap):
    """(probabilities P, dS = dL/d(scale q.k)) [M, N] of one block pair, from the rows' log-sum-exp
    (natural) and delta = rowsum(dO * O): dS = P (dO.v - delta), times the cap's 1 - tanh^2."""
    s, t = _scores(q, k, scale=scale, logit_soft_cap=logit_soft_cap)
    p = jnp.where(mask, jnp.exp2(s * _LOG2E - (lse * _LOG2E)[:, None]), 0.0)
    dp = lax.dot_general(d_out, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    ds = p * (dp - delta[:, None])
    if logit_soft_cap is not None:
        ds = ds * (1.0 - t * t)
    return p, ds


def _slots(block, size):
    """Slots i32[size] of the `size`-slot block `block`."""
    return block * size + jnp.arange(size, dtype=jnp.int32)


def _forward_kernel(*refs, settings: CallSettings):
    """One query block's output and log-sum-exp over the key blocks in [first, stop) (online softmax)."""
    q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, first_ref, stop_ref, *position_refs, out_ref, lse_ref = refs
    block_q, block_k, window = settings.tiling.block_q, settings.tiling.block_k, settings.window
    i = pl.program_id(2)
    q, q_ids, q_slots = q_ref[...], q_ids_ref[...], _slots(i, block_q)
    q_positions = position_refs[0][...] if window else None

    def visit(j, carry):
        out, row_max, row_sum = carry
        keys = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        k_positions = position_refs[1][keys] if window else None
        mask = _visible(q_ids, q_slots, q_positions, k_ids_ref[keys], _slots(j, block_k), k_positions, window)
        s, _ = _scores(q, k_ref[keys, :], scale=settings.scale, logit_soft_cap=settings.logit_soft_cap)
        s = jnp.where(mask, s * _LOG2E, _NO_KEY)
        new_max = jnp.maximum(row_max, jnp.max(s, axis=1))
        p = jnp.where(mask, jnp.exp2(s - new_max[:, None]), 0.0)  # 0, not 1, where a row has no key yet
        decay = jnp.exp2(row_max - new_max)
        v = v_ref[keys, :]
        out = out * decay[:, None] + lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                                     preferred_element_type=jnp.float32)
        return out, new_max, row_sum * decay + jnp.sum(p, axis=1)

    rows, head_dim = q.shape
    start = (jnp.zeros((rows, head_dim), jnp.float32), jnp.full((rows,), _NO_KEY, jnp.float32),
             jnp.zeros((rows,), jnp.float32))
    out, row_max, row_sum = lax.fori_loop(first_ref[i], stop_ref[i], visit, start)
    seen = row_sum > 0
    row_sum = jnp.where(seen, row_sum, 1.0)
    out_ref[...] = (out / row_sum[:, None]).astype(out_ref.dtype)
    lse_ref[...] = jnp.where(seen, row_max / _LOG2E + jnp.log(row_sum), _NO_KEY)


def _dq_kernel(*refs, settings: CallSettings):
    """One query block's dq over the key blocks in [first, stop)."""
    (q_ref, k_ref, v_ref, d_out_ref, lse_ref, delta_ref, q_ids_ref, k_ids_ref, first_ref, stop_ref,
     *position_refs, dq_ref) = refs
    block_q, block_k, window = settings.tiling.block_q, settings.tiling.block_k, settings.window
    i = pl.program_id(2)
    q, d_out, lse, delta = q_ref[...], d_out_ref[...], lse_ref[...], delta_ref[...]
    q_ids, q_slots = q_ids_ref[...], _slots(i, block_q)
    q_positions = position_refs[0][...] if window else None

    def visit(j, dq):
        keys = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        k_positions = position_refs[1][keys] if window else None
        mask = _visible(q_ids, q_slots, q_positions, k_ids_ref[keys], _slots(j, block_k), k_positions, window)
        k = k_ref[keys, :]
        _, ds = _score_gradients(q, k, v_ref[keys, :], d_out, lse, delta, mask, scale=settings.scale,
                                 logit_soft_cap=settings.logit_soft_cap)
        return dq + lax.dot_general(ds.astype(k.dtype), k, (((1,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32)

    dq = lax.fori_loop(first_ref[i], stop_ref[i], visit, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * settings.scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs, settings: CallSettings):
    """One key block's dk and dv over the query blocks in [first, stop) of each of its kv head's G query heads."""
    (q_ref, k_ref, v_ref, d_out_ref, lse_ref, delta_ref, q_ids_ref, k_ids_ref, first_ref, stop_ref,
     *position_refs, dk_ref, dv_ref) = refs
    block_q, block_k, window = settings.tiling.block_q, settings.tiling.block_k, settings.window
    j = pl.program_id(2)
    k, v, k_ids, k_slots = k_ref[...], v_ref[...], k_ids_ref[...], _slots(j, block_k)
    k_positions = position_refs[1][...] if window else None

    def visit(i, carry):
        dk, dv = carry
        rows = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
        q_positions = position_refs[0][rows] if window else None
        mask = _visible(q_ids_ref[rows], _slots(i, block_q), q_positions, k_ids, k_slots, k_positions, window)
        transposed = (((0,), (0,)), ((), ()))  # P^T dO and dS^T q
        for g in range(settings.groups):  # the query heads sharing this key/value head
            q, d_out = q_ref[rows, g, :], d_out_ref[rows, g, :]
            p, ds = _score_gradients(q, k, v, d_out, lse_ref[rows, g], delta_ref[rows, g], mask,
                                     scale=settings.scale, logit_soft_cap=settings.logit_soft_cap)
            dv = dv + lax.dot_general(p.astype(d_out.dtype), d_out, transposed, preferred_element_type=jnp.float32)
            dk = dk + lax.dot_general(ds.astype(q.dtype), q, transposed, preferred_element_type=jnp.float32)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(first_ref[j], stop_ref[j], visit, (zeros, zeros))
    dk_ref[...] = (dk * settings.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# The calls: q [B, T, H, D], k and v [B, T, kv, D] (the model's layout; T a whole number of blocks); XLA computes
# which blocks each visits.


def _block_extremes(x, real, block):
    """(min, max, any real) over the real entries of each block of `block` entries of x i32[B, n]."""
    x = x.reshape(x.shape[0], -1, block)
    real = real.reshape(-1, block)
    return (jnp.min(jnp.where(real, x, _INT_MAX), axis=2), jnp.max(jnp.where(real, x, _INT_MIN), axis=2),
            real.any(axis=1))


def visited_blocks(ids, settings: CallSettings, slots: int) -> jax.Array:
    """bool[B, query blocks, key blocks] over `slots` slots: the pairs of blocks that may hold a visible (query,
    key) pair (module docstring): ids' intervals overlap, a key block starts at or before the query block's last
    slot, and with a window the query block's first position minus the key block's last is below it."""
    block_q, block_k = settings.tiling.block_q, settings.tiling.block_k
    real = np.arange(slots) < settings.length
    q_min, q_max, q_any = _block_extremes(ids["query"], real, block_q)
    k_min, k_max, k_any = _block_extremes(ids["key"], real, block_k)
    last_query_slot = np.minimum(np.arange(1, slots // block_q + 1) * block_q - 1, settings.length - 1)
    causal = np.arange(slots // block_k)[None, :] * block_k <= last_query_slot[:, None]
    visited = (q_min[:, :, None] <= k_max[:, None, :]) & (k_min[:, None, :] <= q_max[:, :, None]) & causal
    visited &= q_any[:, None] & k_any[None, :]
    if settings.window is not None:
        q_first, _, _ = _block_extremes(ids["query_position"], real, block_q)
        _, k_last, _ = _block_extremes(ids["key_position"], real, block_k)
        visited &= q_first[:, :, None] - k_last[:, None, :] < settings.window
    return visited


def _spans(visited: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """(first, stop) i32: the range of blocks along `axis` of `visited` that each block of the other
    axis visits, first visited to last visited + 1 (0, 0 for none)."""
    count = visited.shape[axis]
    any_visited = visited.any(axis=axis)
    first = jnp.argmax(visited, axis=axis)
    stop = count - jnp.argmax(jnp.flip(visited, axis=axis), axis=axis)
    return (jnp.where(any_visited, first, 0).astype(jnp.int32), jnp.where(any_visited, stop, 0).astype(jnp.int32))


def _id_inputs(ids, settings: CallSettings):
    """The id arrays a kernel reads after its first three: query ids, key ids, (with a window) positions."""
    positions = (ids["query_position"], ids["key_position"]) if settings.window is not None else ()
    return (ids["query"], ids["key"]), positions


def _pallas_call(kernel, grid, in_specs, out_specs, out_shape, settings: CallSettings, name: str):
    """`pl.pallas_call` of `kernel` specialised on `settings`, with the tiling's Triton options."""
    tiling = settings.tiling
    return pl.pallas_call(
        functools.partial(kernel, settings=settings), grid=grid, in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, interpret=settings.interpret, name=name,
        compiler_params=_COMPILER_PARAMS(num_warps=tiling.num_warps, num_stages=tiling.num_stages))


def _id_specs(by_query: bool, block: int, slots: int, num_blocks: int, positions: int) -> list:
    """BlockSpecs of a call's id operands on the grid (row, head, block): q ids, k ids, first, stop, [q and k
    positions], each i32[B, slots] (first and stop [B, blocks]); the side the grid walks (`by_query`: the
    queries) read per block, the other whole."""
    def side(blocked):
        return pl.BlockSpec((None, block if blocked else slots), lambda b, h, n: (b, n if blocked else 0))

    whole = pl.BlockSpec((None, num_blocks), lambda b, h, n: (b, 0))
    ids = [side(by_query), side(not by_query), whole, whole]
    return ids + [side(by_query), side(not by_query)][:positions]


def _forward(q, k, v, ids, *, settings: CallSettings):
    """One call's (out [B, T, H, D] in q's dtype, log-sum-exp f32[B, T, H]) over the keys `ids` allow: a program
    per (row, query head, query block), reading its kv head's keys and values."""
    batch, slots, heads, head_dim = q.shape
    block_q, groups = settings.tiling.block_q, settings.groups
    first, stop = _spans(visited_blocks(ids, settings, slots), axis=2)
    (q_ids, k_ids), positions = _id_inputs(ids, settings)
    blocks = slots // block_q
    query = pl.BlockSpec((None, block_q, None, head_dim), lambda b, h, n: (b, n, h, 0))
    keys = pl.BlockSpec((None, slots, None, head_dim), lambda b, h, n: (b, 0, h // groups, 0))
    in_specs = [query, keys, keys] + _id_specs(True, block_q, slots, blocks, len(positions))
    out_specs = [query, pl.BlockSpec((None, block_q, None), lambda b, h, n: (b, n, h))]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:3], jnp.float32)]
    return _pallas_call(_forward_kernel, (batch, heads, blocks), in_specs, out_specs, out_shape, settings,
                        "flash_attention_forward")(q, k, v, q_ids, k_ids, first, stop, *positions)


def _backward(q, k, v, ids, out, lse, d_out, grad_dtype, *, settings: CallSettings):
    """One call's (dq, dk, dv) in `grad_dtype` run with the (union's) `out` and `lse` (`flash_common.lse_union`);
    the kernels accumulate in float32 and round once, as they write. dq: a program per (row, query head, query
    block); dk and dv: per (row, kv head, key block), summing its G query heads."""
    batch, slots, heads, head_dim = q.shape
    kv_heads, groups = k.shape[2], settings.groups
    block_q, block_k = settings.tiling.block_q, settings.tiling.block_k
    delta = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1)  # [B, T, H]
    visited = visited_blocks(ids, settings, slots)
    (q_ids, k_ids), positions = _id_inputs(ids, settings)
    inputs = (q, k, v, d_out, lse, delta, q_ids, k_ids)

    query_blocks = slots // block_q
    first, stop = _spans(visited, axis=2)
    query = pl.BlockSpec((None, block_q, None, head_dim), lambda b, h, n: (b, n, h, 0))
    keys = pl.BlockSpec((None, slots, None, head_dim), lambda b, h, n: (b, 0, h // groups, 0))
    statistics = pl.BlockSpec((None, block_q, None), lambda b, h, n: (b, n, h))
    in_specs = [query, keys, keys, query, statistics, statistics] + _id_specs(True, block_q, slots, query_blocks,
                                                                              len(positions))
    dq = _pallas_call(_dq_kernel, (batch, heads, query_blocks), in_specs, query,
                      jax.ShapeDtypeStruct(q.shape, grad_dtype), settings, "flash_attention_dq")(
        *inputs, first, stop, *positions)

    # The dk/dv kernel reads its kv head's G query heads: q, d_out [B, T, kv, G, D], lse and delta [B, T, kv, G].
    key_blocks = slots // block_k
    first, stop = _spans(visited, axis=1)
    grouped = lambda x: x.reshape(batch, slots, kv_heads, groups, *x.shape[3:])  # noqa: E731
    queries = pl.BlockSpec((None, slots, None, groups, head_dim), lambda b, h, n: (b, 0, h, 0, 0))
    statistics = pl.BlockSpec((None, slots, None, groups), lambda b, h, n: (b, 0, h, 0))
    key = pl.BlockSpec((None, block_k, None, head_dim), lambda b, h, n: (b, n, h, 0))
    in_specs = [queries, key, key, queries, statistics, statistics] + _id_specs(False, block_k, slots, key_blocks,
                                                                               len(positions))
    kv_shapes = [jax.ShapeDtypeStruct(k.shape, grad_dtype), jax.ShapeDtypeStruct(v.shape, grad_dtype)]
    dk, dv = _pallas_call(_dkv_kernel, (batch, kv_heads, key_blocks), in_specs, [key, key], kv_shapes, settings,
                          "flash_attention_dkv")(grouped(q), k, v, grouped(d_out), grouped(lse), grouped(delta),
                                                 q_ids, k_ids, first, stop, *positions)
    return dq, dk, dv


def _flash_rows(q, k, v, masks, settings: CallSettings):
    """Flash attention of q [B, T, kv, G, D] over k, v [B, T, kv, D] with `prepare`'s masks; [B, T, kv, G, D].

    The kernels read q as [B, T, H, D] (a view); T is padded to a whole number of blocks and D to the kernels'
    width only where they are not (`PAD_QUERY`, `PAD_KEY` ids on added slots), and each call's ids are laid out
    per slot."""
    batch, length, kv_heads, groups, head_dim = q.shape
    tiling = settings.tiling
    slots = round_up(length, max(tiling.block_q, tiling.block_k))
    padded_dim = max(16, pl.next_power_of_2(head_dim))
    q = q.reshape(batch, length, kv_heads * groups, head_dim)
    if (slots, padded_dim) != (length, head_dim):
        q, k, v = (flash_common.pad(flash_common.pad(x, 1, slots), 3, padded_dim) for x in (q, k, v))

    def per_slot(x, fill):
        return flash_common.pad(x, 1, slots, fill)

    calls = []
    for prefix in ("", "trunk_"):
        if prefix + "query" in masks:
            call = {"query": per_slot(masks[prefix + "query"], PAD_QUERY),
                    "key": per_slot(masks[prefix + "key"], PAD_KEY)}
            if settings.window is not None:
                call["query_position"] = call["key_position"] = per_slot(masks["window_positions"], 0)
            calls.append(call)
    attention = flash_common.lse_union(functools.partial(_forward, settings=settings),
                                       functools.partial(_backward, settings=settings))
    out = attention(q, k, v, calls)
    return out[:, :length, :, :head_dim].reshape(batch, length, kv_heads, groups, head_dim)


def _check_tiling(tiling: Tiling) -> None:
    for name in ("block_q", "block_k"):
        size = getattr(tiling, name)
        if size < 16 or not pallas_gpu_decode.is_power_of_two(size):
            raise ValueError(f"pallas_gpu's {name} is {size}; Triton needs a power of two of at least 16")


def attend(q, k, v, masks, sliding, *, window=None, scale: float, logit_soft_cap: float | None = None, mesh=None,
           tiling: Tiling = Tiling(), interpret: bool | None = None):
    """Flash attention of q [B, T, kv, G, D] over k, v [B, T, kv, D] with `prepare`'s masks; [B, T, kv, G, D].

    A layer that slides (`sliding`, a bool or the layer scan's traced flag) sees keys fewer than `window`
    positions back; with a traced flag both kernels are traced and one runs (`lax.cond`). The kernels run
    interpreted when `interpret`, by default when the program's platform (`target_platform(mesh)`) is a CPU."""
    _check_tiling(tiling)
    if interpret is None:
        interpret = target_platform(mesh) == "cpu"
    length, groups = q.shape[1], q.shape[3]

    def run(window):
        settings = CallSettings(scale=float(scale), logit_soft_cap=None if logit_soft_cap is None else float(logit_soft_cap),
                             window=window, length=length, groups=groups, tiling=tiling, interpret=interpret)
        used = {name: x for name, x in masks.items() if window or name != "window_positions"}
        return flash_common.per_shard(functools.partial(_flash_rows, settings=settings), q, k, v, used, mesh,
                                      heads_axis=2)

    return with_window(run, sliding, window)


def paged_state(q, pool_k, pool_v, tables, layer, lengths, starts, sliding, *, window=None, scale: float,
                query_positions=None, mesh=None):
    """Online-softmax state of a paged decode step's queries q [B, T, kv, G, D] over layer `layer`'s positions
    [starts, lengths) of each row of a paged pool [L, N, kv, S, D], read in place through the rows' block tables
    by `pallas_gpu_decode.paged_attention_state` (interpreted on a CPU); a pool whose block size or head dimension
    Triton cannot tile (`pallas_gpu_decode.supports`) through `pallas_decode.xla_paged_attention_state`. A layer
    that slides reads only the last `window` positions before each query."""
    if pallas_gpu_decode.supports(pool_k):
        state = functools.partial(pallas_gpu_decode.paged_attention_state, mesh=mesh,
                                  interpret=target_platform(mesh) == "cpu")
    else:
        state = functools.partial(pallas_decode.xla_paged_attention_state, mesh=mesh)
    return paged_at_windows(state, q, pool_k, pool_v, tables, layer, lengths, starts, sliding, window=window,
                            scale=scale, query_positions=query_positions)


def paged_attention(q, k, v, new_mask, pools, layer, sliding, *, window=None, scale: float, mesh=None):
    """A paged decode step's attention output [B, 1, kv, G, D] in q's dtype, all of it in `pallas_gpu_decode`'s
    kernel, one call a pool: the queries q [B, 1, kv, G, D] over their own new key and value k, v [B, 1, kv, D]
    (seen where `new_mask` bool [B, 1, 1]) and each pool's rows, `pools` a sequence of (pool_k, pool_v, tables,
    lengths, starts) as `paged_state` reads them, the rows' own blocks first (one cache row a query row). The first
    call takes in the new token, each next one the state of the one before, and the last writes the normalized
    output. None where the kernel does not take them in (more than one new token a row, a pool it cannot tile, a
    share or G not a power of two): the decoder then merges `paged_state`'s states itself."""
    first = pools[0]
    if q.shape[1] != 1 or not all(pallas_gpu_decode.supports(pool[0]) for pool in pools) or not all(
            pallas_gpu_decode.fuses(q, pool[2].shape[0], reads_new=pool is first) for pool in pools):
        return None
    interpret = target_platform(mesh) == "cpu"
    new = (jnp.einsum("bkgd,bkd->bkg", q[:, 0], k[:, 0], preferred_element_type=jnp.float32), v[:, 0],
           new_mask[:, 0, 0])

    def run(window):
        state = None
        for pool_k, pool_v, tables, lengths, starts in pools[:-1]:
            state = pallas_gpu_decode.paged_attention_state(
                q, pool_k, pool_v, tables, layer, lengths, scale, starts=starts, window=window, mesh=mesh,
                initial=state, new=new if state is None else None, interpret=interpret)
        pool_k, pool_v, tables, lengths, starts = pools[-1]
        return pallas_gpu_decode.paged_attention(q, pool_k, pool_v, tables, layer, lengths, scale, starts=starts,
                                                 window=window, mesh=mesh, initial=state,
                                                 new=new if state is None else None, interpret=interpret)

    return jnp.transpose(with_window(run, sliding, window), (0, 3, 1, 2, 4))  # [B, kv, G, 1, D] -> [B, 1, kv, G, D]


IMPLEMENTATION = AttentionImplementation(
    name="pallas_gpu", platforms=("gpu", "cpu"), prepare=prepare, attend=attend, paged_state=paged_state,
    paged_attention=paged_attention)
