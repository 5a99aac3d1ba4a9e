"""The device side of the paged KV cache: a pool of blocks, read as each row's dense view and written by position.

A `PagedKVCache` (the pool, `jaxgrpo.models.paged_cache`'s: the one paged cache type) holds every layer's keys and
values in `num_blocks` blocks of `block_size` positions, [layers, num_blocks, kv_heads, block_size, head_dim]
(heads-major inside a block, like the decoder's `KVCache`). A row's block table (int32 [max_blocks]) says where
its positions live: position p in block `table[p // block_size]` at offset `p % block_size`.

The decoder reads a cache through its `decode_step` contract (`jaxgrpo.models.decoder`): a dense
[layers, rows, kv_heads, width, head_dim] cache, a `kv_mask` and the slot the new tokens go to. `dense_view`
gathers each row's cached positions into such a cache **right-aligned**: a row holding `length` positions
puts position p at column `width - length + p`, and the new tokens go at columns [width, width + T). Every
row's query then sits at the same column distance from each of its keys as their positions' distance, so
sliding windows (Gemma) mean the same as in an unpaged cache, while rows of any lengths share one write
column. This is the reference form of paged attention (XLA gathers, the math of the decoder's cached call);
kernels that read the blocks in place are its fast forms.

Both move the pool's entries through the program's memory forms (`backend.memory_for_program`): on XLA:CPU a
bfloat16 pool is gathered and scattered as its bits, since XLA:CPU gathers and scatters bfloat16 through float32
(a whole-pool conversion each way per call); elsewhere they are the plain operations. The engine keeps its pool
in that form between programs (`programs.init_pool`), so no program converts it whole on the way in or out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.models import backend as backends
from jaxgrpo.models.decoder import KVCache
from jaxgrpo.models.paged_cache import PagedKVCache, locate, write_rows


def init_paged_cache(config, num_blocks: int, block_size: int, dtype) -> PagedKVCache:
    """An all-zero pool for a decoder with `config` (a `DecoderConfig`)."""
    shape = (config.num_layers, num_blocks, config.num_kv_heads, block_size, config.head_dim)
    return PagedKVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def dense_view(cache: PagedKVCache, tables: jax.Array, lengths: jax.Array, width: int, new: int,
               starts: jax.Array | None = None) -> tuple[KVCache, jax.Array]:
    """Each row's cached positions as a dense, right-aligned `KVCache`, with `new` empty columns after them.

    Args:
      cache: the pool.
      tables: int32 [R, M], each row's block table.
      lengths: int32 [R], the positions each row holds.
      width: static, the columns for cached positions (at least `lengths - starts`).
      new: static, the columns for the tokens about to be written.
      starts: int32 [R], the first position each row's view holds (default 0: all of them); the positions
        before it are read elsewhere (a shared prefix).

    Returns:
      `(view, cached)`: the `KVCache` [L, R, kv, width + new, D], and bool [R, width], True where a column
      holds a cached position.
    """
    positions = jnp.arange(width)[None] - width + lengths[:, None]
    cached = positions >= (0 if starts is None else starts[:, None])
    blocks, offsets = locate(tables, positions, cached, cache.block_size)

    forms = backends.memory_for_program()

    def gather(pool):  # [L, N, kv, S, D] -> [L, R, kv, width + new, D]
        bits = forms.to_carry(pool)
        rows = jnp.transpose(bits[:, blocks, :, offsets, :], (2, 0, 3, 1, 4))
        return forms.from_carry(jnp.pad(rows, ((0, 0), (0, 0), (0, 0), (0, new), (0, 0))), pool.dtype)

    return KVCache(gather(cache.k), gather(cache.v)), cached


def write(cache: PagedKVCache, tables: jax.Array, start: jax.Array, keys: jax.Array, values: jax.Array,
          counts: jax.Array) -> PagedKVCache:
    """Write each row's first `counts[r]` new keys and values at positions `start[r] + t`.

    keys, values [L, R, kv, T, D]; start, counts int32 [R]. The rest (padding) goes to the null block.
    """
    steps = jnp.arange(keys.shape[3])[None]
    forms, dtype = backends.memory_for_program(), cache.k.dtype
    k, v, keys, values = forms.to_carry((cache.k, cache.v, keys.astype(dtype), values.astype(dtype)))
    k, v = write_rows(k, v, tables, start[:, None] + steps, steps < counts[:, None], keys, values)
    return PagedKVCache(*forms.from_carry((k, v), dtype))


def copy_blocks(cache: PagedKVCache, sources: jax.Array, destinations: jax.Array) -> PagedKVCache:
    """The pool with block `destinations[i]` a copy of block `sources[i]` (copy-on-write of a shared block)."""
    forms, dtype = backends.memory_for_program(), cache.k.dtype
    k, v = forms.to_carry((cache.k, cache.v))
    return PagedKVCache(*forms.from_carry((k.at[:, destinations].set(k[:, sources]),
                                           v.at[:, destinations].set(v[:, sources])), dtype))
