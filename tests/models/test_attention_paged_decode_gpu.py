"""The Pallas GPU (Triton) paged decode kernel (`pallas_gpu_decode.paged_attention_state`), interpreted on this CPU,
against the XLA reference `xla_paged_attention_state`; its lowering for an H100 through Triton; its place behind
`pallas_gpu.paged_state`; how a paged step writes its new positions on a GPU (one scatter) and on a TPU."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrpo.models import Decoder
from jaxgrpo.models.attention import pallas_gpu, pallas_gpu_decode
from jaxgrpo.models.attention.pallas_decode import MASKED_SCORE, xla_paged_attention_state
from jaxgrpo.models.paged_cache import NULL_BLOCK, PagedKVCache, PagedRows, write_new_tokens
from tests.models.test_attention_paged_decode import (HEAD_DIM, KV_HEADS, LAYERS, _assert_states_close, _pool,
                                                       assert_every_fill_level)
from tests.support.tiny_models import llama_and_gemma3

SCALE = HEAD_DIM ** -0.5


@functools.partial(jax.jit, static_argnames=("window", "keys_per_step"))
def _kernel(q, pool_k, pool_v, tables, layer, lengths, starts, query_positions=None, window=None,
            keys_per_step=pallas_gpu_decode.KEYS_PER_STEP):
    return pallas_gpu_decode.paged_attention_state(q, pool_k, pool_v, tables, layer, lengths, SCALE, starts=starts,
                                                   window=window, query_positions=query_positions,
                                                   keys_per_step=keys_per_step, interpret=True)


@functools.partial(jax.jit, static_argnames=("window",))
def _reference(q, pool_k, pool_v, tables, layer, lengths, starts, query_positions=None, window=None):
    return xla_paged_attention_state(q, pool_k, pool_v, tables, layer, lengths, SCALE, starts=starts, window=window,
                                     query_positions=query_positions)


@pytest.mark.parametrize("block_size, groups, length, window, keys_per_step", [
    (16, 2, 1, None, 64),  # four blocks gathered per step
    (4, 1, 1, None, 64),  # blocks smaller than Triton's 16: sixteen per step
    (8, 4, 4, None, 8),  # one block per step, 16 stacked queries
    (16, 2, 1, 20, 32),  # a window
    (32, 2, 3, 11, 16),  # a block larger than a step: one per step; a window inside a block
])
def test_kernel_equals_reference_at_every_fill_level(block_size, groups, length, window, keys_per_step):
    """The lengths traced (one compile for every fill); no key mask (the engine's decode passes none)."""
    assert_every_fill_level(functools.partial(_kernel, window=window, keys_per_step=keys_per_step),
                            functools.partial(_reference, window=window), block_size=block_size, groups=groups,
                            length=length, key_mask=False)


@pytest.mark.parametrize("share, length", [(3, 2), (4, 1)])
def test_a_shared_prefix_is_read_once_for_its_rows_and_bfloat16(share, length):
    """Two prefix rows read by 2 x `share` query rows (their `length` new tokens 9 positions after the prefix) under
    a window: the state of the prefix rows repeated per query row; a bfloat16 pool at bfloat16 tolerance, float32
    state. 3 rows of 2 new tokens are stacked (transposed, padded); 4 of one read where they are."""
    window = 30
    for dtype, tolerance in ((jnp.float32, 2e-5), (jnp.bfloat16, 2e-2)):
        q, pool_k, pool_v, tables, _ = _pool(5, rows=2, batch=2 * share, max_blocks=4, block_size=8, length=length,
                                             dtype=dtype)
        lengths = np.array([27, 32], np.int32)
        got = _kernel(q, pool_k, pool_v, tables, 1, lengths, np.zeros(2, np.int32), lengths + 9, window=window)
        assert all(x.dtype == jnp.float32 for x in got)
        repeat = lambda x: np.repeat(x, share, axis=0)  # noqa: E731
        want = _reference(q, pool_k, pool_v, repeat(tables), 1, repeat(lengths), np.zeros(2 * share, np.int32),
                          repeat(lengths + 9), window=window)
        _assert_states_close(got, want, tolerance)


def _new_token_state(q, keys, values, visible):
    """The decoder's online-softmax state of one new token a row [B, 1, kv, G, D] over its own key and value [B,
    kv, D] (`cached_attention._softmax_block`, where a row that does not see it holds (MASKED_SCORE, 0, 0) as the
    kernel's empty state does), and the products the kernel takes for it."""
    products = jnp.einsum("bkgd,bkd->bkg", q[:, 0], keys, preferred_element_type=jnp.float32)
    seen = visible[:, None, None, None]
    top = jnp.where(seen, products[..., None] * SCALE, MASKED_SCORE)
    total = jnp.where(seen, 1.0, 0.0) * jnp.ones_like(top)
    out = total[..., None] * values.astype(jnp.float32)[:, :, None, None, :]
    return (top, total, out), products


@pytest.mark.parametrize("groups, share, window, dtype", [
    (2, 2, None, jnp.float32),  # Qwen3's 2 query heads a kv head, 2 rows a prefix row: 4 queries, 4 copies
    (1, 4, 12, jnp.float32),  # a window
    (4, 1, None, jnp.bfloat16),  # no sharing; bfloat16 pool, queries and output
])
def test_the_kernel_takes_in_the_new_token_the_state_before_and_finishes(groups, share, window, dtype):
    """A decode step's attention in two calls, as `pallas_gpu.paged_attention` runs it: the rows' own blocks with
    their new token (`new`: its products with the queries, its value, whether the row sees it), then the shared
    prefix continuing that state (`initial`) and writing the normalized output (`paged_attention`). Each equals the
    decoder's merge of the reference states (`cached_attention._merge_blocks`, `_finish`), at every fill level
    (empty rows, rows not running, partial and full blocks): the state at 2e-5 (float32), the output at the
    model's dtype. A query that sees nothing gets zeros, not 0 / 0 (the engine's empty slots)."""
    from jaxgrpo.models.cached_attention import _finish, _merge_blocks

    rows, prefix_rows, tolerance = 4 * share, 4, 2e-5 if dtype == jnp.float32 else 2e-2
    q, pool_k, pool_v, tables, _ = _pool(11, rows=rows, max_blocks=4, block_size=16, groups=groups, dtype=dtype)
    prefix_tables = np.random.default_rng(1).permutation(pool_k.shape[1])[:prefix_rows * 2].reshape(prefix_rows, 2)
    prefix_lengths = np.array([32, 17, 0, 5], np.int32)
    keys, values = (jax.random.normal(jax.random.key(i), (rows, KV_HEADS, HEAD_DIM)).astype(dtype) for i in (5, 6))
    visible = np.arange(rows) % 3 != 1
    own_lengths = np.minimum(np.arange(rows, dtype=np.int32) * 7 + np.repeat(prefix_lengths, share), 64)
    own_lengths[0], own_starts = 0, np.minimum(np.repeat(prefix_lengths, share), own_lengths)
    empty = 2 * share  # a row of the empty prefix row, with nothing to read and its token unseen: an empty slot
    own_lengths[empty], visible[empty] = own_starts[empty], False
    new_state, products = _new_token_state(q, keys, values, visible)
    own = functools.partial(pallas_gpu_decode.paged_attention_state, q, pool_k, pool_v, tables, 1, own_lengths,
                            SCALE, starts=own_starts, window=window, interpret=True)
    prefix = (q, pool_k, pool_v, prefix_tables, 1, prefix_lengths, SCALE)
    state = jax.jit(lambda: own(new=(products, values, visible)))()
    want = _merge_blocks(new_state, _reference(q, pool_k, pool_v, tables, 1, own_lengths, own_starts, window=window))
    _assert_states_close(state, want, 2e-5)
    out = pallas_gpu_decode.paged_attention(*prefix, starts=np.zeros(prefix_rows, np.int32), window=window,
                                            initial=state, interpret=True)
    assert out.shape == (rows, KV_HEADS, groups, 1, HEAD_DIM) and out.dtype == dtype
    repeat = lambda x: np.repeat(x, share, axis=0)  # noqa: E731
    prefix_state = _reference(q, pool_k, pool_v, repeat(prefix_tables), 1, repeat(prefix_lengths),
                              np.zeros(rows, np.int32), window=window)
    seen = np.asarray(_merge_blocks(want, prefix_state)[1]) > 0
    assert not seen[empty].any() and np.delete(seen, empty, axis=0).all()
    expected = np.where(seen[..., None], np.asarray(_finish(_merge_blocks(want, prefix_state), jnp.float32)
                                                    ).transpose(0, 2, 3, 1, 4), 0.0)
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, rtol=tolerance, atol=tolerance)


def test_the_kernel_refuses_to_take_in_what_it_cannot_in_one_line():
    """Continuing a state, reading a new token or finishing needs one new token a row read where it sits (and, for
    the new token, one cache row a query row): otherwise a one-line error, and `pallas_gpu.paged_attention` leaves
    the merging to the decoder (None)."""
    q, pool_k, pool_v, tables, _ = _pool(2, rows=2, batch=4, max_blocks=2, block_size=16)
    keys = jnp.zeros((4, KV_HEADS, HEAD_DIM))
    _, products = _new_token_state(q, keys, keys, np.ones(4, bool))
    lengths = np.array([3, 9], np.int32)
    assert not pallas_gpu_decode.fuses(q, 2, reads_new=True) and pallas_gpu_decode.fuses(q, 2)
    with pytest.raises(ValueError, match="reads a new token or finishes only for one new token a row.*one query row "
                                         "a cache row where it reads a new token; got q \\(4, 1, 2, 2, 16\\) over 2 "
                                         "cache rows"):
        pallas_gpu_decode.paged_attention(q, pool_k, pool_v, tables, 1, lengths, SCALE,
                                          new=(products, keys, np.ones(4, bool)), interpret=True)
    two = jnp.concatenate([q, q], axis=1)  # two new tokens a row
    assert not pallas_gpu_decode.fuses(two, 2)
    pools = [(pool_k, pool_v, tables, lengths, np.zeros(2, np.int32))]
    mask = jnp.ones((4, 2, 2), bool)
    assert pallas_gpu.paged_attention(two, keys[:, None].repeat(2, 1), keys[:, None].repeat(2, 1), mask, pools, 1,
                                      False, scale=SCALE) is None


def test_rows_and_their_blocks_sharded_over_devices_give_the_unsharded_state():
    """16 rows over a 4 x 2 data x fsdp mesh: each shard holds its rows' blocks and tables of ids local to it (as
    the rollout engine lays them out)."""
    mesh = jax.make_mesh((4, 2), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=jax.devices()[:8])
    shards, rows_per_shard, max_blocks, block_size = 8, 2, 2, 8
    local = [_pool(20 + i, rows=rows_per_shard, max_blocks=max_blocks, block_size=block_size, spare=1)
             for i in range(shards)]
    q, pool_k, pool_v, tables = (np.concatenate([np.asarray(part[i]) for part in local], axis=1 if i in (1, 2) else 0)
                                 for i in range(4))
    lengths = np.array([0, 3, 8, 9, 16, 2, 11, 5, 16, 1, 7, 12, 4, 15, 10, 6], np.int32)
    state = functools.partial(pallas_gpu_decode.paged_attention_state, scale=SCALE, interpret=True)
    pools = jax.device_put((pool_k, pool_v), NamedSharding(mesh, PartitionSpec(None, ("data", "fsdp"))))
    got = jax.jit(lambda k, v: state(q, k, v, tables, 1, lengths, mesh=mesh))(*pools)
    blocks = rows_per_shard * max_blocks + 1  # each shard's pool: its rows' blocks and a spare
    global_tables = tables + (np.arange(16) // rows_per_shard * blocks)[:, None]
    _assert_states_close(got, _reference(q, pool_k, pool_v, global_tables, 1, lengths, np.zeros(16, np.int32)), 1e-6)
    # A new token a row taken in, a state continued and the output finished: split over the rows as the state is.
    values = jax.random.normal(jax.random.key(3), (16, KV_HEADS, HEAD_DIM))
    _, products = _new_token_state(q, values, values, lengths % 2 == 0)
    new = (products, values, lengths % 2 == 0)
    finished = functools.partial(pallas_gpu_decode.paged_attention, scale=SCALE, new=new, initial=got,
                                 interpret=True)
    sharded = jax.jit(lambda k, v: finished(q, k, v, tables, 1, lengths, mesh=mesh))(*pools)
    whole = finished(q, pool_k, pool_v, global_tables, 1, lengths)
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(whole), rtol=1e-6, atol=1e-6)


def test_the_pallas_gpu_attention_reads_pools_triton_cannot_tile_through_xla():
    """`pallas_gpu.paged_state` runs the kernel where `supports` (power-of-two blocks and head dimension of at least
    16), the XLA reference elsewhere, with the same state; the kernel itself refuses such a pool, and a key mask,
    in one line."""
    assert pallas_gpu.IMPLEMENTATION.paged_state is pallas_gpu.paged_state
    q, pool_k, pool_v, tables, _ = _pool(7, rows=4, max_blocks=4, block_size=16)
    lengths, starts = np.array([64, 9, 0, 31], np.int32), np.zeros(4, np.int32)
    state = functools.partial(pallas_gpu.paged_state, scale=SCALE, window=20)
    for sliding in (False, True):
        _assert_states_close(state(q, pool_k, pool_v, tables, 1, lengths, starts, sliding),
                             _reference(q, pool_k, pool_v, tables, 1, lengths, starts, window=20 if sliding else None),
                             2e-5)
    odd = [x[..., :12] for x in (q, pool_k, pool_v)]  # head dimension 12
    assert pallas_gpu_decode.supports(pool_k) and not pallas_gpu_decode.supports(odd[1])
    _assert_states_close(state(*odd, tables, 1, lengths, starts, True),
                         _reference(*odd, tables, 1, lengths, starts, window=20), 1e-6)
    with pytest.raises(ValueError, match="needs a power-of-two block size and head dimension .* got 16 and 12"):
        pallas_gpu_decode.paged_attention_state(*odd, tables, 1, lengths, SCALE, interpret=True)


def test_lowers_for_an_h100_through_triton():
    """Lowered for a CUDA target on this CPU (`lowering_platforms=("cuda",)`, an abstract H100 mesh,
    `interpret=False`) at Qwen3-0.6B's decode shapes (28 layers, 8 kv heads of 128, 2 query heads each, bfloat16,
    the engine's 16-position blocks, 128 rows of up to 1536 positions: an 11 GiB pool; and its shared prefixes, 16
    rows read by 8 query rows each), at a toy's (float32, 4-position blocks, a window) and with 2 new tokens a row:
    one Triton call each. With one new token a row the kernel reads the queries where they are and writes the state
    of the real queries only ([R, share, kv, G]: not the 16 rows its products multiply, and no transpose into the
    stacked order); with 2 it reads them stacked (transposed), padded to a power of two. Triton's own compilation
    to PTX happens in XLA on a GPU, so it is not checked here."""
    h100 = jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=h100)
    f32 = "xf32>"
    for dtype, layers, rows, share, length, max_blocks, kv, groups, block_size, head_dim, window, state in (
            (jnp.bfloat16, 28, 128, 1, 1, 96, 8, 2, 16, 128, None, "128x1x8x2"),
            (jnp.bfloat16, 28, 16, 8, 1, 16, 8, 2, 16, 128, None, "16x8x8x2"),
            (jnp.float32, 2, 8, 1, 1, 12, 2, 4, 4, 16, 8, "8x1x2x4"),
            (jnp.float32, 2, 8, 1, 2, 12, 2, 4, 4, 16, 8, "8x2x8")):
        pool = jax.ShapeDtypeStruct((layers, rows * max_blocks + 1, kv, block_size, head_dim), dtype)
        specs = (jax.ShapeDtypeStruct((rows * share, length, kv, groups, head_dim), dtype), pool, pool,
                 jax.ShapeDtypeStruct((rows, max_blocks), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32),
                 jax.ShapeDtypeStruct((rows,), jnp.int32), jax.ShapeDtypeStruct((rows,), jnp.int32))

        def step(q, pool_k, pool_v, tables, layer, lengths, starts):
            return pallas_gpu_decode.paged_attention_state(q, pool_k, pool_v, tables, layer, lengths, 0.1,
                                                           starts=starts, window=window)

        with jax.sharding.use_abstract_mesh(mesh):
            text = jax.jit(step).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
        assert set(re.findall(r"stablehlo.custom_call @([\w$.]+)", text)) == {"__gpu$xla.gpu.triton"}
        assert re.findall(r'name = "(paged\w+)"', text) == ["paged_attention_state_gpu"]
        results = re.search(r"stablehlo.custom_call @.*-> \((.*)\)$", text, re.M).group(1)
        assert results == ", ".join([f"tensor<{state}{f32}"] * 2 + [f"tensor<{state}x{head_dim}{f32}"]), results
        before = text[:text.index("stablehlo.custom_call @")]
        assert ("stablehlo.transpose" in before) == (length > 1), before


def test_a_decode_steps_attention_lowers_for_an_h100_as_two_triton_calls():
    """`pallas_gpu.paged_attention` at Qwen3-0.6B's decode shapes (128 rows of one new token, 8 kv heads of 2
    query heads, D = 128, bfloat16, 16-position blocks; 16 shared prefix rows read by 8 rows each), lowered for a
    CUDA target on this CPU: two Triton calls, the rows' own blocks with the new token (a float32 state out) and
    the prefix's continuing it, which writes the output in bfloat16 [16 prefix rows, 8 rows, kv, G, D]."""
    h100 = jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=h100)
    bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)  # noqa: E731
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    pool = bf16(28, 128 * 48 + 1, 8, 16, 128)

    def attention(q, k, v, pool_k, pool_v, tables, lengths, starts, prefix_tables, prefix_lengths):
        pools = [(pool_k, pool_v, tables, lengths, starts),
                 (pool_k, pool_v, prefix_tables, prefix_lengths, jnp.zeros_like(prefix_lengths))]
        mask = jnp.ones((128, 1, 1), bool)
        return pallas_gpu.paged_attention(q, k, v, mask, pools, jnp.int32(3), False, scale=0.1, mesh=mesh)

    with jax.sharding.use_abstract_mesh(mesh):
        traced = jax.jit(attention).trace(bf16(128, 1, 8, 2, 128), bf16(128, 1, 8, 128), bf16(128, 1, 8, 128),
                                          pool, pool, ints(128, 48), ints(128), ints(128), ints(16, 16), ints(16))
        text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert traced.out_info.shape == (128, 1, 8, 2, 128) and traced.out_info.dtype == jnp.bfloat16
    assert set(re.findall(r"stablehlo.custom_call @([\w$.]+)", text)) == {"__gpu$xla.gpu.triton"}
    assert re.findall(r'name = "(paged\w+)"', text) == ["paged_attention_state_gpu", "paged_attention_gpu"]
    results = re.findall(r"stablehlo.custom_call @.*-> (.*)$", text, re.M)
    assert results[-1] == "tensor<16x8x8x2x128xbf16>", results


def test_the_pools_new_positions_are_written_the_same_by_a_scatter_and_one_at_a_time():
    """`write_new_tokens` as one scatter (every backend but `pallas_tpu`) and one position at a time (`pallas_tpu`):
    the same pool, each row's valid new positions at `lengths + t` through its table, the rest left alone (what is
    not valid goes to the null block, which nothing reads)."""
    rows, max_blocks, block_size, length = 5, 3, 4, 2
    num_blocks = rows * max_blocks + 2
    rng = np.random.default_rng(3)
    tables = (1 + rng.permutation(num_blocks - 1)[:rows * max_blocks]).reshape(rows, max_blocks).astype(np.int32)
    lengths = np.array([0, 3, 7, 10, 5], np.int32)
    valid = np.array([[1, 1], [1, 0], [1, 1], [1, 1], [0, 0]], bool)
    shape = (LAYERS, num_blocks, KV_HEADS, block_size, HEAD_DIM)
    keys = jax.random.split(jax.random.key(0), 4)
    pool = PagedKVCache(*(jax.random.normal(k, shape, jnp.float32) for k in keys[:2]))
    new_k, new_v = (jax.random.normal(k, (LAYERS, rows, KV_HEADS, length, HEAD_DIM), jnp.float32) for k in keys[2:])
    paged = PagedRows(pool, tables, np.zeros(rows, np.int32), lengths)
    scattered, each = (jax.jit(functools.partial(write_new_tokens, mesh=None, each=each))(paged, new_k, new_v, valid)
                       for each in (False, True))
    expected = [np.array(x) for x in pool]
    for r, t in zip(*np.nonzero(valid)):
        position = lengths[r] + t
        for want, new in zip(expected, (new_k, new_v)):
            want[:, tables[r, position // block_size], :, position % block_size] = new[:, r, :, t]
    for got in (scattered, each):
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(np.asarray(a)[:, NULL_BLOCK + 1:], b[:, NULL_BLOCK + 1:])


def _lowered_paged_step(attention: str, device, platform: str) -> str:
    """StableHLO of a Llama-shaped toy's `Decoder.paged_decode_step` (bfloat16, 4 rows of 8 blocks of 16) lowered
    for `platform` under an abstract one-device mesh of `device`."""
    config = llama_and_gemma3(sliding_window=8)["llama"]
    model = Decoder(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    model.attention = attention
    graphdef, state = nnx.split(model)
    rows, max_blocks, block_size = 4, 8, 16
    pool = jax.ShapeDtypeStruct((config.num_layers, rows * max_blocks + 1, config.num_kv_heads, block_size,
                                 config.head_dim), jnp.bfloat16)
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    mesh = jax.sharding.AbstractMesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device)

    def step(state, tokens, pool_k, pool_v, tables, starts, lengths):
        rows = PagedRows(PagedKVCache(pool_k, pool_v), tables, starts, lengths)
        return nnx.merge(graphdef, state).paged_decode_step(tokens, cache=rows)

    with jax.sharding.use_abstract_mesh(mesh):
        traced = jax.jit(step).trace(jax.eval_shape(lambda: state), ints(rows, 1), pool, pool, ints(rows, max_blocks),
                                     ints(rows), ints(rows))
        return traced.lower(lowering_platforms=(platform,)).as_text()


def test_a_gpu_decode_step_writes_its_new_positions_with_one_scatter_and_a_tpus_one_at_a_time():
    """Lowered for an H100, a paged decode step has one loop (the layer scan) and writes the keys and values with
    two scatters: one position at a time would be a `while` of rows x new tokens iterations a step, on a GPU a
    kernel launch and a host round trip each (128 a step at the engine's batch; compiled for an H100 that loop was
    384 of a decode step's 1,620 kernels). Lowered for a TPU (`pallas_tpu`) it keeps the loop, so the pool keeps the
    layout its kernel reads."""
    h100 = jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None, platform="gpu")
    tpu = jax.sharding.AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    count = lambda op, text: len(re.findall(rf'"?stablehlo\.{op}"?\(', text))  # noqa: E731
    gpu = _lowered_paged_step("pallas_gpu", h100, "cuda")
    assert (count("while", gpu), count("scatter", gpu)) == (1, 2)
    tpu = _lowered_paged_step("pallas_tpu", tpu, "tpu")
    assert (count("while", tpu), count("scatter", tpu)) == (2, 0)
