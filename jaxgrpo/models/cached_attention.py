"""The attention of a cached call (`Decoder.decode_step`: prefill or a decode step) in XLA math.

A layer's queries attend to up to three blocks of keys: a shared prefix (`_prefix_block`), the live slots of the
row cache and the new tokens. Each block is an online-softmax state (`_softmax_block`), and the states combine
exactly (`_merge_blocks`). `attend_cached` is the `attend(q, k, v)` that `Decoder.decode_step` binds for each
layer (`jaxgrpo.models.layers.Attention` calls it); `CachedCall` holds what every layer of the call reads. Where
the backend has a kernel that reads a cache (`Backend.cache_state`), that cache's block is the kernel's.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.models.attention.xla import MASKED_SCORE as _MASKED_SCORE
from jaxgrpo.models.backend import Backend
from jaxgrpo.models.paged_cache import PagedRows
from jaxgrpo.models.partitioning import constrain_activation


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


def _prefix_block(q, prefix, layer, prefix_mask, scale, dtype, forms):
    """Online-softmax state [B, kv, G, T(, D)] of the queries over their rows' shared prefix.

    q [B, T, kv, G, D]; prefix (k, v) [L, P_rows, kv, P, D], of which layer `layer` is read (through
    `forms.read_slots`); prefix_mask [P_rows, T, P]. Row r reads prefix row r // share: the share rows of a
    prefix row stack their queries into one [share * G * T, D] x [D, P] product per (prefix row, kv head).
    """
    prefix_k, prefix_v = prefix
    _, prefix_rows, kv_heads, prefix_length, head_dim = prefix_k.shape
    batch, length, _, groups, _ = q.shape
    share = batch // prefix_rows
    queries = share * groups * length
    q_rows = jnp.transpose(q.reshape(prefix_rows, share, length, kv_heads, groups, head_dim), (0, 3, 1, 4, 2, 5))
    q_rows = q_rows.reshape(prefix_rows, kv_heads, queries, head_dim)

    def read(buffer):  # [P_rows, kv, P, D]
        return forms.read_slots(buffer, (layer, 0, 0, 0, 0), (1,) + buffer.shape[1:])[0].astype(dtype)

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


class CachedCall(NamedTuple):
    """What every layer of a cached call reads besides its own queries, keys and values (`Decoder.decode_step`).

    cache: every layer's (k, v) [L, B, kv, C, D], read-only in the layers; cache_index: the first slot the new
    tokens are written to (an int, or traced); key_valid: bool [B, C], the slots holding keys; masks: (full,
    sliding), each (cached [B, T, C], new [B, T, T], prefix [P_rows, T, P] or None); prefix: a shared prefix's
    (k, v) [L, P_rows, kv, P, D] or None, with prefix_valid bool [P_rows, P]; backend: the program's
    (`jaxgrpo.models.backend`); window: the sliding layers' window or None; scale: the attention scale; mesh: the
    program's mesh (activations laid out on it) or None.
    """

    cache: tuple[jax.Array, jax.Array]  # a KVCache (jaxgrpo.models.decoder): k, v
    cache_index: jax.Array | int
    key_valid: jax.Array
    masks: tuple
    prefix: tuple[jax.Array, jax.Array] | None  # a KVCache or None
    prefix_valid: jax.Array | None
    backend: Backend
    window: int | None
    scale: float
    mesh: jax.sharding.Mesh | None


def attend_cached(q, k, v, call: CachedCall, layer, sliding):
    """Attention output [B, T, kv, G, D] of a cached call's layer `layer` (`sliding`: whether it uses the window)
    over the shared prefix, the live cache and the T new tokens.

    q [B, T, kv, G, D]; k, v [B, T, kv, D] (the new tokens'). The blocks of keys (prefix, cached slots, new
    tokens) combine exactly through their online-softmax states. Only slots below `cache_index` are read,
    straight from the whole cache (never a per-layer copy, `memory.read_slots`): a static index slices them
    (differentiable, as the shared-prefix forward needs); with a traced one, each cache (prefix, row cache) is
    read by the backend's kernel where it has one for this call (`Backend.cache_state`), else by the XLA math
    over chunks of `memory.cache_chunk(capacity)` slots (on a CPU, a decode step's work then grows with the live
    length and not with the capacity). Scores against a cache are one [G*T, D] x [D, S] product per (row, kv
    head), with no transposes of the cache.
    """
    dtype = q.dtype
    cache_mask, new_mask, prefix_mask = jax.tree.map(lambda s, f: jnp.where(sliding, s, f), call.masks[1],
                                                     call.masks[0])
    new_scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * call.scale
    new_scores = constrain_activation(new_scores, ("batch", "kv_heads", None, None, None), call.mesh)
    new_scores = jnp.where(new_mask[:, None, None], new_scores, _MASKED_SCORE)
    _, batch, kv_heads, _, head_dim = call.cache.k.shape
    length, groups = q.shape[1], q.shape[3]
    q_rows = jnp.transpose(q, (0, 2, 3, 1, 4)).reshape(batch, kv_heads, groups * length, head_dim)
    new_values = functools.partial(_new_values, v=v, dtype=dtype)
    if _static_index(call):
        state = _static_cache_block(q_rows, groups, new_scores, new_values, cache_mask, call, layer, dtype)
        return _finish(_with_prefix(state, q, call, layer, sliding, prefix_mask), dtype)
    state = _with_prefix(_softmax_block(new_scores, new_values), q, call, layer, sliding, prefix_mask)
    return _finish(_run_time_cache_blocks(state, q, q_rows, cache_mask, call, layer, sliding), dtype)


def _read_layer(buffer, layer, start, size, dtype, forms):
    """Layer `layer`'s slots [start, start + size) of a cache `buffer` [L, B, kv, C, D], read through
    `forms.read_slots`: [B, kv, size, D] in `dtype`."""
    _, batch, kv_heads, _, head_dim = buffer.shape
    return forms.read_slots(buffer, (layer, 0, 0, start, 0), (1, batch, kv_heads, size, head_dim))[0].astype(dtype)


def _cached_scores(q_rows, keys, mask, scale, groups):
    """Scores [B, kv, G, T, S], scaled and masked, of the queries q_rows [B, kv, G * T, D] against the cached keys
    [B, kv, S, D] (one [G*T, D] x [D, S] product per (row, kv head)); mask [B, T, S]."""
    batch, kv_heads, queries, _ = q_rows.shape
    scores = jnp.einsum("bkqd,bksd->bkqs", q_rows, keys, preferred_element_type=jnp.float32) * scale
    scores = scores.reshape(batch, kv_heads, groups, queries // groups, keys.shape[2])
    return jnp.where(mask[:, None, None], scores, _MASKED_SCORE)


def _cached_values(probs, values, dtype):
    """The unnormalized output [B, kv, G, T, D] float32 of the weights probs [B, kv, G, T, S] over the cached
    values [B, kv, S, D], multiplied in `dtype`."""
    batch, kv_heads, groups, length = probs.shape[:4]
    probs = probs.astype(dtype).reshape(batch, kv_heads, groups * length, values.shape[2])
    out = jnp.einsum("bkqs,bksd->bkqd", probs, values, preferred_element_type=jnp.float32)
    return out.reshape(batch, kv_heads, groups, length, values.shape[3])


def _new_values(probs, v, dtype):
    """The unnormalized output [B, kv, G, T, D] float32 of the weights probs [B, kv, G, T, T] over the new tokens'
    values v [B, T, kv, D], multiplied in `dtype`."""
    return jnp.einsum("bkgts,bskd->bkgtd", probs.astype(dtype), v, preferred_element_type=jnp.float32)


def _finish(state, dtype):
    """The attention output [B, T, kv, G, D] in `dtype` of an online-softmax state."""
    _, total, out = state
    return jnp.transpose(out / total[..., None], (0, 3, 1, 2, 4)).astype(dtype)


def _static_index(call: CachedCall) -> bool:
    """Whether the call's cache index is known when tracing (a Python or numpy int), not a run-time value."""
    return isinstance(call.cache_index, (int, np.integer))


def _kernel_block(q, call: CachedCall, layer, sliding, cache, live, key_mask, query_slot):
    """The backend's read of one cache (`Backend.cache_state`) with a run-time cache index: its online-softmax
    state, or None (a static index, or no kernel for this call: the XLA math then reads that cache)."""
    if _static_index(call):
        return None
    return call.backend.cache_state(q, cache.k, cache.v, layer, live, key_mask, sliding, window=call.window,
                                    scale=call.scale, query_slot=query_slot, mesh=call.mesh)


def _with_prefix(state, q, call: CachedCall, layer, sliding, prefix_mask):
    """`state` merged with the shared prefix's block, if the call has a prefix: read by the backend's kernel where it
    has one, else by `_prefix_block`."""
    if call.prefix is None:
        return state
    prefix_length = call.prefix.k.shape[3]  # its slots precede the cache's: query slots shift by it
    block = _kernel_block(q, call, layer, sliding, call.prefix, prefix_length, call.prefix_valid,
                          prefix_length + call.cache_index)
    if block is None:
        block = _prefix_block(q, call.prefix, layer, prefix_mask, call.scale, q.dtype, call.backend.memory)
    return _merge_blocks(state, block)


def _static_cache_block(q_rows, groups, new_scores, new_values, cache_mask, call: CachedCall, layer, dtype):
    """The online-softmax state over the live cache slots and the new tokens with a static cache index: the slots
    below it (sliced, so differentiable) and the new tokens as one block."""
    live = int(call.cache_index)
    if live == 0:
        return _softmax_block(new_scores, new_values)
    # The live slots and the new tokens as one block.
    cache_k, cache_v = call.cache
    forms = call.backend.memory
    cached_v = _read_layer(cache_v, layer, 0, live, dtype, forms)
    cached_k = _read_layer(cache_k, layer, 0, live, dtype, forms)
    scores = jnp.concatenate([_cached_scores(q_rows, cached_k, cache_mask[..., :live], call.scale, groups),
                              new_scores], axis=-1)
    return _softmax_block(scores, lambda w: _cached_values(w[..., :live], cached_v, dtype) + new_values(w[..., live:]))


def _one_chunk(i, state, *, chunk, q_rows, groups, cache_mask, call: CachedCall, layer, dtype):
    """`state` merged with the block of chunk `i` of the row cache's slots (`chunk` slots from i * chunk)."""
    cache_k, cache_v = call.cache
    capacity = cache_k.shape[3]
    forms = call.backend.memory
    start = i * chunk
    # The last chunk's start is clamped to fit the capacity; its slots below `start` were read already.
    first = jnp.minimum(start, capacity - chunk)
    mask = jax.lax.dynamic_slice_in_dim(cache_mask, start, chunk, axis=2)
    mask &= (first + jnp.arange(chunk) >= start)[None, None]
    scores = _cached_scores(q_rows, _read_layer(cache_k, layer, start, chunk, dtype, forms), mask, call.scale, groups)
    values = _read_layer(cache_v, layer, start, chunk, dtype, forms)
    return _merge_blocks(state, _softmax_block(scores, lambda w: _cached_values(w, values, dtype)))


def _run_time_cache_blocks(state, q, q_rows, cache_mask, call: CachedCall, layer, sliding):
    """`state` merged with the row cache's live slots below a run-time cache index: read by the backend's kernel
    where it has one for this call, else by the XLA math over chunks of `memory.cache_chunk(capacity)` slots."""
    block = _kernel_block(q, call, layer, sliding, call.cache, call.cache_index, call.key_valid, None)
    if block is not None:
        return _merge_blocks(state, block)
    capacity = call.cache.k.shape[3]
    chunk = call.backend.memory.cache_chunk(capacity)
    one_chunk = functools.partial(_one_chunk, chunk=chunk, q_rows=q_rows, groups=q.shape[3], cache_mask=cache_mask,
                                  call=call, layer=layer, dtype=q.dtype)
    if chunk >= capacity:
        # One chunk holds every slot: read it whatever the live length (its dead slots are masked) rather than
        # loop over a run-time trip count of 0 or 1. On a GPU such a loop costs a host round trip per layer and
        # step for its condition (56 a step on Qwen3-0.6B, most of the decode's idle time, measured).
        return one_chunk(0, state)
    num_chunks = (call.cache_index + chunk - 1) // chunk
    return jax.lax.fori_loop(0, num_chunks, one_chunk, state)


class PagedCall(NamedTuple):
    """What every layer of a paged decode step reads besides its own queries, keys and values
    (`Decoder.paged_decode_step`).

    rows: the rows' `PagedRows` (the pool, read-only in the layers; tables; positions [starts, lengths) read);
    prefix: a shared prefix's `PagedRows` (R / share rows: row b reads prefix row b // share) or None; new_masks:
    (full, sliding) bool [B, T, T], which new tokens each new token sees; backend, window, scale, mesh: as
    `CachedCall`'s; pool_mesh: the mesh the pool's blocks and the rows split over (block ids local to each of its
    row shards), or None.
    """

    rows: PagedRows
    prefix: PagedRows | None
    new_masks: tuple[jax.Array, jax.Array]
    backend: Backend
    window: int | None
    scale: float
    mesh: jax.sharding.Mesh | None
    pool_mesh: jax.sharding.Mesh | None


def attend_paged(q, k, v, call: PagedCall, layer, sliding):
    """Attention output [B, T, kv, G, D] of a paged decode step's layer `layer` over the rows' cached positions
    (and their shared prefix) in the pool and the T new tokens, as `attend_cached` over a dense cache: each block
    of keys an online-softmax state, the pool's read by the backend's paged reader (`Backend.paged_state`: in
    place where the attention implementation has a kernel for it), or the whole of it in the backend's kernels
    where it has them for this call (`Backend.paged_attention`). New token t of row r sits at position
    `lengths[r] + t`."""
    dtype = q.dtype
    new_mask = jnp.where(sliding, call.new_masks[1], call.new_masks[0])
    # the rows' own blocks, then their shared prefix's (whose queries sit after it: only a window reads positions)
    pools = [(*rows.pool, rows.tables, rows.lengths, rows.starts) for rows in (call.rows, call.prefix)
             if rows is not None]
    fused = call.backend.paged_attention(q, k, v, new_mask, pools, layer, sliding, window=call.window,
                                         scale=call.scale, mesh=call.pool_mesh)
    if fused is not None:
        return fused
    new_scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * call.scale
    new_scores = constrain_activation(new_scores, ("batch", "kv_heads", None, None, None), call.mesh)
    new_scores = jnp.where(new_mask[:, None, None], new_scores, _MASKED_SCORE)
    state = _softmax_block(new_scores, functools.partial(_new_values, v=v, dtype=dtype))
    for pool_k, pool_v, tables, lengths, starts in pools:
        block = call.backend.paged_state(q, pool_k, pool_v, tables, layer, lengths, starts, sliding,
                                         window=call.window, scale=call.scale, query_positions=None,
                                         mesh=call.pool_mesh)
        state = _merge_blocks(state, block)
    return _finish(state, dtype)
