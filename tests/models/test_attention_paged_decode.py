"""The paged decode kernel (`pallas_decode.paged_attention_state`), run in interpret mode on CPU: each row's
blocks read in place from a pool through its block table give the state of the contiguous kernel over the same
positions, and equal the jnp reference (`xla_paged_attention_state`) at several fill levels, block sizes,
grouped-query ratios, windows and new-token counts, with rows of different lengths, a shared prefix read by its
rows, bfloat16 pools, masked positions and rows and blocks sharded over devices; the kernel compiles for a TPU
topology (libtpu, no TPU) at the rollout engine's block size."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrpo.models.attention.pallas_decode import (MASKED_SCORE, cache_attention_state, full_cache_cost_estimate,
                                                    gather_rows, paged_attention_state, paged_cost_estimate,
                                                    xla_cache_attention_state, xla_paged_attention_state)
from jaxgrpo.tools import compile as aot

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16


def _pool(seed, *, rows, max_blocks, block_size, batch=None, length=1, groups=2, dtype=jnp.float32, spare=3):
    """Queries, a pool with `spare` blocks more than the rows need, each row's blocks a random distinct set of
    them (in random order: a table is not a range), and a random key mask."""
    batch = rows if batch is None else batch
    keys = jax.random.split(jax.random.key(seed), 4)
    num_blocks = rows * max_blocks + spare
    q = jax.random.normal(keys[0], (batch, length, KV_HEADS, groups, HEAD_DIM), jnp.float32).astype(dtype)
    shape = (LAYERS, num_blocks, KV_HEADS, block_size, HEAD_DIM)
    pool_k = jax.random.normal(keys[1], shape, jnp.float32).astype(dtype)
    pool_v = jax.random.normal(keys[2], shape, jnp.float32).astype(dtype)
    tables = np.random.default_rng(seed).permutation(num_blocks)[:rows * max_blocks].reshape(rows, max_blocks)
    key_mask = jax.random.bernoulli(keys[3], 0.85, (rows, max_blocks * block_size))
    return q, pool_k, pool_v, tables.astype(np.int32), key_mask


def _assert_states_close(got, want, tolerance):
    for name, a, b in zip(("max", "normalizer", "output"), got, want):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tolerance,
                                   atol=tolerance, err_msg=name)


@functools.partial(jax.jit, static_argnames=("window", "interpret"))
def _kernel(q, pool_k, pool_v, tables, layer, lengths, starts, key_mask, window=None, interpret=True):
    return paged_attention_state(q, pool_k, pool_v, tables, layer, lengths, HEAD_DIM ** -0.5, starts=starts,
                                 key_mask=key_mask, window=window, interpret=interpret)


@functools.partial(jax.jit, static_argnames=("window",))
def _reference(q, pool_k, pool_v, tables, layer, lengths, starts, key_mask, window=None):
    return xla_paged_attention_state(q, pool_k, pool_v, tables, layer, lengths, HEAD_DIM ** -0.5, starts=starts,
                                     key_mask=key_mask, window=window)


@pytest.mark.parametrize("block_size, groups, length, window", [
    (16, 2, 1, None), (8, 1, 1, None), (8, 4, 4, None), (16, 2, 1, 20), (8, 2, 4, 11),
])
def test_kernel_equals_reference_at_every_fill_level(block_size, groups, length, window):
    """Layer and lengths traced (one compile for every fill); a key mask."""
    assert_every_fill_level(functools.partial(_kernel, window=window), functools.partial(_reference, window=window),
                            block_size=block_size, groups=groups, length=length, key_mask=True)


def assert_every_fill_level(kernel, reference, *, block_size, groups, length, key_mask):
    """`kernel(*args)` equals `reference(*args)` for args (q, pool_k, pool_v, tables, layer, lengths, starts[,
    key_mask]) of six rows of different lengths: empty, one position, mid-block, a block boundary, one past it,
    full; two of them starting after a shared prefix; at three shifts of the lengths."""
    max_blocks = 64 // block_size
    q, pool_k, pool_v, tables, mask = _pool(block_size + groups + length, rows=6, max_blocks=max_blocks,
                                            block_size=block_size, length=length, groups=groups)
    starts = np.array([0, 0, 3, 0, 17, 0], np.int32)
    for shift in (0, 7, 21):
        lengths = np.minimum(np.array([0, 1, 8 + shift, 16 + shift, 33, 64], np.int32), 64)
        args = (q, pool_k, pool_v, tables, 1, lengths, starts) + ((mask,) if key_mask else ())
        got = kernel(*args)
        _assert_states_close(got, reference(*args), 2e-5)
        # A query that can read nothing leaves a merge unchanged: (MASKED_SCORE, 0, 0); row 0 holds nothing.
        empty = np.asarray(got[1]) == 0
        assert empty[0].all() and (np.asarray(got[0])[empty] == MASKED_SCORE).all()
        assert (np.asarray(got[2])[empty] == 0).all() and empty.sum() < empty.size


def test_paged_state_is_the_contiguous_kernels_over_the_same_positions():
    """Gathering each row's blocks into a contiguous cache and reading it with `cache_attention_state`, one row
    at a time at its own live end, gives the paged kernel's state: the pool and tables change where the keys
    live, not what is read."""
    block_size, max_blocks, window = 16, 4, 24
    q, pool_k, pool_v, tables, key_mask = _pool(3, rows=4, max_blocks=max_blocks, block_size=block_size, length=2)
    lengths, starts = np.array([5, 64, 16, 40], np.int32), np.array([0, 10, 0, 2], np.int32)
    got = _kernel(q, pool_k, pool_v, tables, 0, lengths, starts, key_mask, window=window)
    cache_k = jnp.stack([gather_rows(pool_k, tables, layer) for layer in range(LAYERS)])
    cache_v = jnp.stack([gather_rows(pool_v, tables, layer) for layer in range(LAYERS)])
    for r in range(4):
        one = lambda x: x[r:r + 1]  # noqa: E731
        want = cache_attention_state(one(q), cache_k[:, r:r + 1], cache_v[:, r:r + 1], 0, int(lengths[r]),
                                     HEAD_DIM ** -0.5, valid_start=one(starts), key_mask=one(key_mask), window=window,
                                     block_size=block_size, interpret=True)
        _assert_states_close([x[r:r + 1] for x in got], want, 2e-5)
        dense = xla_cache_attention_state(one(q), cache_k[:, r:r + 1], cache_v[:, r:r + 1], 0, int(lengths[r]),
                                          HEAD_DIM ** -0.5, valid_start=one(starts), key_mask=one(key_mask),
                                          window=window)
        _assert_states_close(want, dense, 2e-5)


def test_a_shared_prefix_is_read_once_for_its_rows():
    """Two prefix rows read by 6 query rows (3 each), their new tokens after the prefix plus 9 positions of their
    own (query_positions), under a window: the state of the prefix rows repeated per query row."""
    share, block_size, window = 3, 8, 30
    q, pool_k, pool_v, tables, key_mask = _pool(5, rows=2, batch=2 * share, max_blocks=4, block_size=block_size,
                                                length=2)
    lengths = np.array([27, 32], np.int32)
    query_positions = lengths + 9
    state = functools.partial(paged_attention_state, scale=HEAD_DIM ** -0.5, key_mask=None, window=window)
    got = state(q, pool_k, pool_v, tables, 1, lengths, query_positions=query_positions, interpret=True)
    repeat = lambda x: np.repeat(x, share, axis=0)  # noqa: E731
    want = xla_paged_attention_state(q, pool_k, pool_v, repeat(tables), 1, repeat(lengths), HEAD_DIM ** -0.5,
                                     window=window, query_positions=repeat(query_positions))
    _assert_states_close(got, want, 2e-5)


def test_bfloat16_pool_and_the_tpu_interpreter():
    """A bfloat16 pool at bfloat16 tolerance, and the TPU interpreter (`pltpu.InterpretParams`: the scalar
    prefetch of the tables, the copies and the grid order simulated) on a float32 one."""
    q, pool_k, pool_v, tables, key_mask = _pool(9, rows=4, max_blocks=4, block_size=16, groups=4, dtype=jnp.bfloat16)
    lengths, starts = np.array([64, 9, 0, 31], np.int32), np.zeros(4, np.int32)
    args = (q, pool_k, pool_v, tables, 1, lengths, starts, key_mask)
    got = _kernel(*args)
    assert all(x.dtype == jnp.float32 for x in got)
    _assert_states_close(got, _reference(*args), 2e-2)
    q, pool_k, pool_v, tables, key_mask = _pool(11, rows=4, max_blocks=4, block_size=16)
    args = (q, pool_k, pool_v, tables, 1, lengths, starts, key_mask)
    _assert_states_close(_kernel(*args, window=20, interpret=pltpu.InterpretParams()), _reference(*args, window=20),
                         2e-5)


def test_rows_and_their_blocks_sharded_over_devices_give_the_unsharded_state():
    """8 rows over a 4 x 2 data x fsdp mesh, kv heads over nothing: each shard holds its rows' blocks and tables of
    ids local to it (as the rollout engine lays them out)."""
    mesh = jax.make_mesh((4, 2), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=jax.devices()[:8])
    shards, rows_per_shard, max_blocks, block_size = 8, 2, 2, 8
    local = [_pool(20 + i, rows=rows_per_shard, max_blocks=max_blocks, block_size=block_size, spare=1)
             for i in range(shards)]
    q, pool_k, pool_v, tables, key_mask = (np.concatenate([np.asarray(part[i]) for part in local], axis=1 if i in (1, 2)
                                                          else 0) for i in range(5))
    lengths = np.array([0, 3, 8, 9, 16, 2, 11, 5, 16, 1, 7, 12, 4, 15, 10, 6], np.int32)
    state = functools.partial(paged_attention_state, scale=HEAD_DIM ** -0.5, key_mask=key_mask, interpret=True)
    pools = jax.device_put((pool_k, pool_v), NamedSharding(mesh, PartitionSpec(None, ("data", "fsdp"))))
    got = jax.jit(lambda k, v: state(q, k, v, tables, 1, lengths, mesh=mesh))(*pools)
    blocks = rows_per_shard * max_blocks + 1  # each shard's pool: its rows' blocks and a spare
    global_tables = tables + (np.arange(16) // rows_per_shard * blocks)[:, None]
    want = state(q, pool_k, pool_v, global_tables, 1, lengths)
    _assert_states_close(got, want, 1e-6)


@pytest.mark.parametrize("change, message", [
    (dict(block_tables=np.zeros((4,), np.int32)), r"block_tables must be int \[cache rows, blocks per row\]"),
    (dict(lengths=np.zeros(3, np.int32)), r"lengths must be \[cache rows\]"),
    (dict(starts=np.zeros(5, np.int32)), r"starts must be \[cache rows\]"),
    (dict(key_mask=np.ones((4, 32), bool)), r"key_mask must be \[cache rows, blocks per row x block_size\]"),
    (dict(window=0), "window must be a positive number"),
    (dict(q=jnp.zeros((6, 1, KV_HEADS, 2, HEAD_DIM))), "the block tables' 4 rows must divide q's 6 rows"),
    (dict(q=jnp.zeros((4, 1, 3, 2, HEAD_DIM))), "q has 3 kv heads of size 16 but the pool has 2 of size 16"),
    (dict(pool_v=jnp.zeros((LAYERS, 19, KV_HEADS, 16, HEAD_DIM), jnp.bfloat16)), "pool_k and pool_v must both be"),
])
def test_bad_input_gets_a_one_line_error(change, message):
    q, pool_k, pool_v, tables, _ = _pool(0, rows=4, max_blocks=4, block_size=16)
    kwargs = dict(q=q, pool_k=pool_k, pool_v=pool_v, block_tables=tables, layer=0, lengths=np.full(4, 5, np.int32),
                  scale=1.0) | change
    with pytest.raises(ValueError, match=message):
        paged_attention_state(**kwargs, interpret=True)


def test_compiles_for_tpu_at_the_engines_block_size():
    """Mosaic compiles the kernel (not interpreted) for a v5e:2x4 (8 chips), rows and their blocks split over
    them, at Qwen3-0.6B's shapes (28 layers, 8 kv heads of 128, 2 query heads each, bfloat16) and the engine's
    16-position blocks: 128 rows of up to 1536 positions. The pool is read in place: the program's temporaries
    and outputs are nothing beside one layer of it."""
    _, devices = aot.topology_devices("v5e:2x4")
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    rows, block_size, max_blocks, kv, groups, head_dim, layers = 128, aot.ENGINE_BLOCK_SIZE, 96, 8, 2, 128, 28
    num_blocks = rows * max_blocks + len(devices)  # every row's blocks, and a null block per shard
    spec = lambda dtype, shape, *axes: jax.ShapeDtypeStruct(  # noqa: E731
        shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*axes)))
    pool = spec(jnp.bfloat16, (layers, num_blocks, kv, block_size, head_dim), None, "data")
    args = (spec(jnp.bfloat16, (rows, 1, kv, groups, head_dim), "data"), pool, pool,
            spec(jnp.int32, (rows, max_blocks), "data"), spec(jnp.int32, ()), spec(jnp.int32, (rows,), "data"),
            spec(jnp.int32, (rows,), "data"))

    def step(q, pool_k, pool_v, tables, layer, lengths, starts):
        return paged_attention_state(q, pool_k, pool_v, tables, layer, lengths, head_dim ** -0.5, starts=starts,
                                     mesh=mesh)

    compiled = jax.jit(step).lower(*args).compile()
    assert compiled.as_text().count("tpu_custom_call") >= 1
    memory = compiled.memory_analysis()
    pool_per_chip = 2 * layers * num_blocks * kv * block_size * head_dim * 2 // len(devices)
    assert pool_per_chip <= memory.argument_size_in_bytes < pool_per_chip * 1.01
    assert memory.temp_size_in_bytes + memory.output_size_in_bytes < pool_per_chip / layers / 100


def test_the_paged_cost_counts_at_most_the_pools_positions():
    """`paged_cost_estimate`: every row's whole table where the pool is as large (the full cache's estimate), at most
    the pool's positions where it is smaller (a pool sized for the tokens that live)."""
    rows, kv, stacked, max_blocks, block_size, head_dim = 8, 2, 4, 6, 16, 128
    full = full_cache_cost_estimate(rows, kv, stacked, max_blocks * block_size, head_dim, 2, False)
    assert paged_cost_estimate(rows, kv, stacked, max_blocks, rows * max_blocks + 1, block_size, head_dim, 2,
                               False) == full
    half = paged_cost_estimate(rows, kv, stacked, max_blocks, rows * max_blocks // 2, block_size, head_dim, 2, False)
    assert half.flops * 2 == full.flops and half.transcendentals * 2 == full.transcendentals
    keys_and_values = 2 * kv * rows * max_blocks * block_size * head_dim * 2
    assert full.bytes_accessed - half.bytes_accessed == keys_and_values // 2
