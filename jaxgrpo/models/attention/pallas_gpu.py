"""Training and scoring attention through a Pallas flash-attention kernel for GPUs (the Triton backend).

Flash attention (Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness", 2022; Dao, "FlashAttention-2", 2023) never holds a [T, T] score matrix: each program
keeps a block of queries and streams blocks of keys past it, folding each into an online softmax in
float32 (a running max, a running sum of exponentials, an unnormalised output), so memory grows linearly
in T. It returns the log-sum-exp of each query's scores with its output; the backward recomputes the
probabilities from it, block by block: dq per block of queries, dk and dv per block of keys.

Grouped-query attention natively: a program's query block is `BLOCK_Q` rows of one key/value head's
queries, slot-major (row t G + g is slot t's g-th query head), so the G heads that share the key/value
head read each key and value block once, and dk, dv sum over them inside the kernel.

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

Rows are padded to a multiple of the blocks with segment ids no real slot has, and the head dimension to
a power of two of at least 16 (what Triton's matrix products take). Scores are soft-capped
(c tanh(s / c), Gemma 2) when `logit_soft_cap` is given, with the cap's derivative in the backward.
Inputs are float32 or bfloat16; products accumulate in float32 (a float32 product is IEEE float32 in
Triton, not TF32). On a mesh the kernels run per shard (`flash_common.per_shard`); on a CPU they run
interpreted (`interpret=True`): for tests, slowly. The block sizes, warps and stages are static
(`Tiling`, defaults `BLOCK_Q`, `BLOCK_K`, `NUM_WARPS`, `NUM_STAGES`), to be tuned on a GPU.

The rollout engine's paged decode reads its blocks in place through `pallas_gpu_decode`'s kernel (`paged_state`);
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

#: Query rows (slots x query heads of one key/value head) per block.
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
    """The kernels' static choices: rows per query block and slots per key block (powers of two, at least
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


# The kernels. Refs hold one (row, key/value head)'s arrays; a block of rows is `block_q` query rows
# (slot = row // groups), a block of keys `block_k` slots.


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


def _query_slots(block, settings):
    """Slots i32[block_q] of query block `block`'s rows."""
    block_q = settings.tiling.block_q
    return lax.div(block * block_q + jnp.arange(block_q, dtype=jnp.int32), jnp.int32(settings.groups))


def _key_slots(block, settings):
    block_k = settings.tiling.block_k
    return block * block_k + jnp.arange(block_k, dtype=jnp.int32)


def _forward_kernel(*refs, settings: CallSettings):
    """One query block's output and log-sum-exp over the key blocks in [first, stop) (online softmax)."""
    q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, first_ref, stop_ref, *position_refs, out_ref, lse_ref = refs
    block_k, window = settings.tiling.block_k, settings.window
    i = pl.program_id(2)
    q, q_ids, q_slots = q_ref[...], q_ids_ref[...], _query_slots(i, settings)
    q_positions = position_refs[0][...] if window else None

    def visit(j, carry):
        out, row_max, row_sum = carry
        keys = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        k_positions = position_refs[1][keys] if window else None
        mask = _visible(q_ids, q_slots, q_positions, k_ids_ref[keys], _key_slots(j, settings), k_positions, window)
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
    block_k, window = settings.tiling.block_k, settings.window
    i = pl.program_id(2)
    q, d_out, lse, delta = q_ref[...], d_out_ref[...], lse_ref[...], delta_ref[...]
    q_ids, q_slots = q_ids_ref[...], _query_slots(i, settings)
    q_positions = position_refs[0][...] if window else None

    def visit(j, dq):
        keys = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        k_positions = position_refs[1][keys] if window else None
        mask = _visible(q_ids, q_slots, q_positions, k_ids_ref[keys], _key_slots(j, settings), k_positions, window)
        k = k_ref[keys, :]
        _, ds = _score_gradients(q, k, v_ref[keys, :], d_out, lse, delta, mask, scale=settings.scale,
                                 logit_soft_cap=settings.logit_soft_cap)
        return dq + lax.dot_general(ds.astype(k.dtype), k, (((1,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32)

    dq = lax.fori_loop(first_ref[i], stop_ref[i], visit, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * settings.scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs, settings: CallSettings):
    """One key block's dk and dv over the query blocks in [first, stop) (all G heads of its kv head)."""
    (q_ref, k_ref, v_ref, d_out_ref, lse_ref, delta_ref, q_ids_ref, k_ids_ref, first_ref, stop_ref,
     *position_refs, dk_ref, dv_ref) = refs
    block_q, window = settings.tiling.block_q, settings.window
    j = pl.program_id(2)
    k, v, k_ids, k_slots = k_ref[...], v_ref[...], k_ids_ref[...], _key_slots(j, settings)
    k_positions = position_refs[1][...] if window else None

    def visit(i, carry):
        dk, dv = carry
        rows = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
        q_positions = position_refs[0][rows] if window else None
        mask = _visible(q_ids_ref[rows], _query_slots(i, settings), q_positions, k_ids, k_slots, k_positions, window)
        q, d_out = q_ref[rows, :], d_out_ref[rows, :]
        p, ds = _score_gradients(q, k, v, d_out, lse_ref[rows], delta_ref[rows], mask, scale=settings.scale,
                                 logit_soft_cap=settings.logit_soft_cap)
        transposed = (((0,), (0,)), ((), ()))  # P^T dO and dS^T q
        dv = dv + lax.dot_general(p.astype(d_out.dtype), d_out, transposed, preferred_element_type=jnp.float32)
        dk = dk + lax.dot_general(ds.astype(q.dtype), q, transposed, preferred_element_type=jnp.float32)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(first_ref[j], stop_ref[j], visit, (zeros, zeros))
    dk_ref[...] = (dk * settings.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# The calls: arrays [B, kv, rows or slots, D] padded to whole blocks; XLA computes which blocks each visits.


def _block_extremes(x, real, block):
    """(min, max, any real) over the real entries of each block of `block` entries of x i32[B, n]."""
    x = x.reshape(x.shape[0], -1, block)
    real = real.reshape(-1, block)
    return (jnp.min(jnp.where(real, x, _INT_MAX), axis=2), jnp.max(jnp.where(real, x, _INT_MIN), axis=2),
            real.any(axis=1))


def visited_blocks(ids, settings: CallSettings, rows: int, slots: int) -> jax.Array:
    """bool[B, query blocks, key blocks]: the pairs of blocks that may hold a visible (query, key) pair
    (module docstring): ids' intervals overlap, a key block starts at or before the query block's last
    slot, and with a window the query block's first position minus the key block's last is below it."""
    block_q, block_k = settings.tiling.block_q, settings.tiling.block_k
    real_rows = np.arange(rows) < settings.length * settings.groups
    real_keys = np.arange(slots) < settings.length
    q_min, q_max, q_any = _block_extremes(ids["query"], real_rows, block_q)
    k_min, k_max, k_any = _block_extremes(ids["key"], real_keys, block_k)
    last_query_slot = np.minimum((np.arange(1, rows // block_q + 1) * block_q - 1) // settings.groups,
                                 settings.length - 1)
    causal = np.arange(slots // block_k)[None, :] * block_k <= last_query_slot[:, None]
    visited = (q_min[:, :, None] <= k_max[:, None, :]) & (k_min[:, None, :] <= q_max[:, :, None]) & causal
    visited &= q_any[:, None] & k_any[None, :]
    if settings.window is not None:
        q_first, _, _ = _block_extremes(ids["query_position"], real_rows, block_q)
        _, k_last, _ = _block_extremes(ids["key_position"], real_keys, block_k)
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


def _spec(block_shape, heads: bool, blocked: bool):
    """BlockSpec of an array [B, (kv,) n, (D)] whose axis n is split into `block_shape[0]`-blocks along the
    grid's third axis when `blocked`, else read whole."""
    def index(b, h, n):
        return (b,) + ((h,) if heads else ()) + ((n if blocked else 0),) + (0,) * (len(block_shape) - 1)
    return pl.BlockSpec((None,) + ((None,) if heads else ()) + tuple(block_shape), index)


def _operand_specs(by_query: bool, *, rows: int, slots: int, block: int, head_dim: int, num_blocks: int,
                   gradients: bool, positions: int) -> list:
    """BlockSpecs of a call's operands: q, k, v, [d_out, lse, delta,] q_ids, k_ids, first, stop, [q and k
    positions]. The grid walks `block`-blocks of the queries (`by_query`: the forward and dq) or of the keys
    (dk/dv); each step reads its block of that side and the whole of the other."""
    def query_side(*tail, heads=True):
        return _spec(((block if by_query else rows),) + tail, heads, by_query)

    def key_side(*tail, heads=True):
        return _spec(((slots if by_query else block),) + tail, heads, not by_query)

    specs = [query_side(head_dim), key_side(head_dim), key_side(head_dim)]
    if gradients:
        specs += [query_side(head_dim), query_side(), query_side()]
    specs += [query_side(heads=False), key_side(heads=False)] + [_spec((num_blocks,), False, False)] * 2
    return specs + [query_side(heads=False), key_side(heads=False)][:positions]


def _forward(q, k, v, ids, *, settings: CallSettings):
    """One call's (out [B, kv, R, Dp] in q's dtype, log-sum-exp f32[B, kv, R]) over the keys `ids` allow."""
    batch, heads, rows, head_dim = q.shape
    slots = k.shape[2]
    block_q = settings.tiling.block_q
    first, stop = _spans(visited_blocks(ids, settings, rows, slots), axis=2)
    (q_ids, k_ids), positions = _id_inputs(ids, settings)
    blocks = rows // block_q
    in_specs = _operand_specs(True, rows=rows, slots=slots, block=block_q, head_dim=head_dim, num_blocks=blocks,
                              gradients=False, positions=len(positions))
    out_specs = [_spec((block_q, head_dim), True, True), _spec((block_q,), True, True)]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:3], jnp.float32)]
    out, lse = _pallas_call(_forward_kernel, (batch, heads, blocks), in_specs, out_specs, out_shape, settings,
                            "flash_attention_forward")(q, k, v, q_ids, k_ids, first, stop, *positions)
    return out, lse


def _backward(q, k, v, ids, out, lse, d_out, grad_dtype, *, settings: CallSettings):
    """One call's (dq, dk, dv) in `grad_dtype` run with the (union's) `out` and `lse` (`flash_common.lse_union`);
    the kernels accumulate in float32 and round once, as they write."""
    batch, heads, rows, head_dim = q.shape
    slots = k.shape[2]
    block_q, block_k = settings.tiling.block_q, settings.tiling.block_k
    delta = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1)
    visited = visited_blocks(ids, settings, rows, slots)
    (q_ids, k_ids), positions = _id_inputs(ids, settings)
    inputs = (q, k, v, d_out, lse, delta, q_ids, k_ids)
    query_blocks = rows // block_q
    first, stop = _spans(visited, axis=2)
    in_specs = _operand_specs(True, rows=rows, slots=slots, block=block_q, head_dim=head_dim,
                              num_blocks=query_blocks, gradients=True, positions=len(positions))
    dq = _pallas_call(_dq_kernel, (batch, heads, query_blocks), in_specs, _spec((block_q, head_dim), True, True),
                      jax.ShapeDtypeStruct(q.shape, grad_dtype), settings, "flash_attention_dq")(
        *inputs, first, stop, *positions)

    key_blocks = slots // block_k
    first, stop = _spans(visited, axis=1)
    in_specs = _operand_specs(False, rows=rows, slots=slots, block=block_k, head_dim=head_dim,
                              num_blocks=key_blocks, gradients=True, positions=len(positions))
    kv_spec = _spec((block_k, head_dim), True, True)
    kv_shapes = [jax.ShapeDtypeStruct(k.shape, grad_dtype), jax.ShapeDtypeStruct(v.shape, grad_dtype)]
    dk, dv = _pallas_call(_dkv_kernel, (batch, heads, key_blocks), in_specs, [kv_spec, kv_spec], kv_shapes, settings,
                          "flash_attention_dkv")(*inputs, first, stop, *positions)
    return dq, dk, dv


def _flash_rows(q, k, v, masks, settings: CallSettings):
    """Flash attention of q [B, kv, T, G, D] over k, v [B, kv, T, D] with `prepare`'s masks; [B, kv, T, G, D].

    Queries become rows [B, kv, T G, D] (slot-major); rows, slots and D are padded to the kernels' shapes
    (`PAD_QUERY`, `PAD_KEY` ids), and each call's ids are laid out per row and per slot."""
    batch, heads, length, groups, head_dim = q.shape
    tiling = settings.tiling
    rows, slots = round_up(length * groups, tiling.block_q), round_up(length, tiling.block_k)
    padded_dim = max(16, pl.next_power_of_2(head_dim))
    q = flash_common.pad(flash_common.pad(q.reshape(batch, heads, length * groups, head_dim), 2, rows), 3, padded_dim)
    k, v = (flash_common.pad(flash_common.pad(x, 2, slots), 3, padded_dim) for x in (k, v))

    def per_row(x, fill):
        return flash_common.pad(jnp.repeat(x, groups, axis=1), 1, rows, fill)

    def per_slot(x, fill):
        return flash_common.pad(x, 1, slots, fill)

    calls = []
    for prefix in ("", "trunk_"):
        if prefix + "query" in masks:
            call = {"query": per_row(masks[prefix + "query"], PAD_QUERY), "key": per_slot(masks[prefix + "key"], PAD_KEY)}
            if settings.window is not None:
                call["query_position"] = per_row(masks["window_positions"], 0)
                call["key_position"] = per_slot(masks["window_positions"], 0)
            calls.append(call)
    attention = flash_common.lse_union(functools.partial(_forward, settings=settings),
                                       functools.partial(_backward, settings=settings))
    out = attention(q, k, v, calls)
    return out[:, :, :length * groups, :head_dim].reshape(batch, heads, length, groups, head_dim)


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
    q = jnp.transpose(q, (0, 2, 1, 3, 4))  # [B, kv, T, G, D]
    k, v = (jnp.swapaxes(x, 1, 2) for x in (k, v))  # [B, kv, T, D]

    def run(window):
        settings = CallSettings(scale=float(scale), logit_soft_cap=None if logit_soft_cap is None else float(logit_soft_cap),
                             window=window, length=length, groups=groups, tiling=tiling, interpret=interpret)
        used = {name: x for name, x in masks.items() if window or name != "window_positions"}
        out = flash_common.per_shard(functools.partial(_flash_rows, settings=settings), q, k, v, used, mesh)
        return jnp.transpose(out, (0, 2, 1, 3, 4))

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


IMPLEMENTATION = AttentionImplementation(
    name="pallas_gpu", platforms=("gpu", "cpu"), prepare=prepare, attend=attend, paged_state=paged_state)
