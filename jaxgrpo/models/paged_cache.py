"""A paged KV cache as the decoder reads and writes it: a pool of blocks, each row's block table and live range.

The pool holds every layer's keys and values in blocks of `block_size` positions, [layers, num_blocks, kv_heads,
block_size, head_dim] (heads-major inside a block, like the decoder's dense `KVCache`). A row's block table
(int32 [max_blocks]) says where its positions live: position p in block `table[p // block_size]` at offset
`p % block_size`. Block `NULL_BLOCK` of each row shard is never a row's: writes that must go nowhere (padding,
rows that are not running) go there, and nothing reads it.

`PagedKVCache` is the pool, the one paged cache type: the rollout engine's, and what the decoder's paged step reads
and writes. `PagedRows` is what `Decoder.paged_decode_step` takes: the pool, the rows' tables and the positions each
row reads. The rollout engine (`jaxgrpo.engine`) owns the pool and the tables; the decoder reads the rows' blocks in
place through the backend's paged reader (`Backend.paged_state`: a Pallas kernel on TPU and GPU) and writes the new
tokens' keys and values to their blocks (`write_new_tokens`, in the form the backend's reader keeps the pool's
layout with, `Backend.write_pages`: one scatter, or one position at a time on a TPU). On a mesh each row shard holds
its own blocks and rows (`per_shard`). The engine's chunked prefill writes many positions at once (`write_rows`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxgrpo.distributed import batch_axes, batch_shards

#: The block every row shard keeps empty for writes that go nowhere.
NULL_BLOCK = 0


class PagedKVCache(NamedTuple):
    """Keys and values of every layer in blocks: `k`, `v` of [layers, num_blocks, kv_heads, block_size, head_dim]."""

    k: jax.Array
    v: jax.Array

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def block_size(self) -> int:
        return self.k.shape[3]


class PagedRows(NamedTuple):
    """Rows of a paged pool (see the module docstring): `pool` the `PagedKVCache`; `tables` int32 [R, M] (on a
    mesh, block ids local to the row's shard); row r reads positions [`starts[r]`, `lengths[r]`) (int32 [R];
    positions below `starts` are read elsewhere: a shared prefix)."""

    pool: PagedKVCache
    tables: jax.Array
    starts: jax.Array
    lengths: jax.Array


def per_shard(fn, mesh: jax.sharding.Mesh | None, in_specs: tuple[str, ...], out_specs):
    """`fn` run by each of the mesh's row shards on its own rows and blocks (a row's block table holds ids local
    to its shard), or `fn` itself without a mesh. Specs: "pool" ([layers, rows or blocks, ...]) or "rows"
    ([rows, ...]); `out_specs` a spec or a tree of them."""
    if mesh is None or batch_shards(mesh) == 1:
        return fn
    axes = batch_axes(mesh)
    spec = {"pool": P(None, axes), "rows": P(axes)}
    return jax.shard_map(fn, mesh=mesh, in_specs=tuple(spec[s] for s in in_specs),
                         out_specs=jax.tree.map(spec.get, out_specs), axis_names=set(axes), check_vma=False)


def locate(tables: jax.Array, positions: jax.Array, valid: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
    """(block id, offset) [R, N] of `positions` [R, N] in rows with block `tables` [R, M]; the null block where not
    `valid`."""
    index = jnp.clip(positions // block_size, 0, tables.shape[1] - 1)
    blocks = jnp.where(valid, jnp.take_along_axis(tables, index, axis=1), NULL_BLOCK)
    return blocks, jnp.where(valid, positions % block_size, 0)


def write_rows(pool_k: jax.Array, pool_v: jax.Array, tables: jax.Array, positions: jax.Array, valid: jax.Array,
               keys: jax.Array, values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The pool with each row's new keys and values written at `positions` [R, T] where `valid` [R, T] (the rest
    to the null block). keys, values [L, R, kv, T, D]."""
    blocks, offsets = locate(tables, positions, valid, pool_k.shape[3])

    def scatter(pool, new):  # new [L, R, kv, T, D] -> the pool's [R, T, L, kv, D] slots
        return pool.at[:, blocks, :, offsets, :].set(jnp.transpose(new, (1, 3, 0, 2, 4)).astype(pool.dtype))

    return scatter(pool_k, keys), scatter(pool_v, values)


def write_each(pool_k: jax.Array, pool_v: jax.Array, tables: jax.Array, positions: jax.Array, valid: jax.Array,
               keys: jax.Array, values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`write_rows` as one `dynamic_update_slice` per (row, new token), in a loop: for a decode step's few
    positions. A scatter lets XLA give the pool another layout (on a TPU: block offsets major to the kv heads),
    which a kernel reading the pool in its own layout then gets by a copy of the whole pool every step; an
    update of one position keeps the pool's layout and writes in place."""
    blocks, offsets = locate(tables, positions, valid, pool_k.shape[3])
    rows, length = positions.shape

    def one(i, pools):
        r, t = i // length, i % length
        start = (0, blocks[r, t], 0, offsets[r, t], 0)
        return tuple(jax.lax.dynamic_update_slice(
            pool, jax.lax.dynamic_slice(new, (0, r, 0, t, 0), (new.shape[0], 1, new.shape[2], 1, new.shape[4]))
            .astype(pool.dtype), start) for pool, new in zip(pools, (keys, values)))

    return jax.lax.fori_loop(0, rows * length, one, (pool_k, pool_v))


def write_new_tokens(rows: PagedRows, keys: jax.Array, values: jax.Array, valid: jax.Array,
                     mesh: jax.sharding.Mesh | None, *, each: bool = False) -> PagedKVCache:
    """The pool with each row's T new keys and values [L, R, kv, T, D] written at its positions `lengths[r] + t`
    where `valid` [R, T], on each of the mesh's row shards (their blocks and tables of local ids): one position at
    a time (`write_each`) or, without `each`, one scatter (`write_rows`)."""
    positions = rows.lengths[:, None] + jnp.arange(keys.shape[3])[None]
    write = per_shard(write_each if each else write_rows, mesh,
                      ("pool", "pool", "rows", "rows", "rows", "pool", "pool"), ("pool", "pool"))
    return PagedKVCache(*write(*rows.pool, rows.tables, positions, valid, keys, values))
