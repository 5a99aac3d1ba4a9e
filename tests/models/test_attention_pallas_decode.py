"""The Pallas decode-attention kernel (jaxgrpo.models.attention.pallas_decode), run in interpret mode on CPU:
its online-softmax state equals the jnp reference at several cache fill levels, with left-padded rows, masked
slots, sliding windows, grouped-query heads, one and four new tokens, bfloat16 caches and a shared prefix; the
reference equals attention computed element by element in float64; only blocks holding live slots are copied;
rows and heads sharded over devices give the unsharded state; the kernel compiles for TPU topologies (libtpu, no
TPU) for Qwen3-1.7B's batch-128 decode, reading the cache in place; the decode roofline script counts right; and
a Decoder with attention="pallas_tpu" decodes through the kernel with the same logits as attention="xla" (left
padding, masked slots, sliding windows, a shared prefix), its decode step compiling for a v5e-8 with the kernel."""

import functools
import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrpo.models import Decoder, KVCache, architectures
from jaxgrpo.models.attention import pallas_decode, pallas_tpu
from jaxgrpo.models.attention.pallas_decode import (MASKED_SCORE, cache_attention_state, live_blocks,
                                                    xla_cache_attention_state)
from jaxgrpo.tools import compile as aot
from tests.support.paths import REPO_ROOT
from tests.support.tiny_models import llama_and_gemma3

LAYERS, ROWS, KV_HEADS, CAPACITY, HEAD_DIM, BLOCK = 2, 4, 2, 64, 16, 16
# Row 0 unpadded, row 1 from the third block (empty below 41 slots: a live row follows an empty one), row 2
# padded inside the first block, row 3 from the second.
VALID_START = np.array([0, 40, 3, 17], np.int32)
FILL_LEVELS = (1, 8, 16, 33, 64)  # one slot, mid-block, a block boundary, one past it, full capacity


def _inputs(seed, *, batch=ROWS, rows=ROWS, length=1, groups=2, dtype=jnp.float32, capacity=CAPACITY):
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (batch, length, KV_HEADS, groups, HEAD_DIM), jnp.float32).astype(dtype)
    cache_shape = (LAYERS, rows, KV_HEADS, capacity, HEAD_DIM)
    cache_k = jax.random.normal(keys[1], cache_shape, jnp.float32).astype(dtype)
    cache_v = jax.random.normal(keys[2], cache_shape, jnp.float32).astype(dtype)
    key_mask = jax.random.bernoulli(keys[3], 0.8, (rows, capacity))
    return q, cache_k, cache_v, key_mask


@functools.partial(jax.jit, static_argnames=("window", "interpret"))
def _kernel(q, cache_k, cache_v, layer, cache_index, valid_start, key_mask, query_slot, window=None, interpret=True):
    return cache_attention_state(q, cache_k, cache_v, layer, cache_index, HEAD_DIM ** -0.5, valid_start=valid_start,
                                 key_mask=key_mask, window=window, query_slot=query_slot, block_size=BLOCK,
                                 interpret=interpret)


@functools.partial(jax.jit, static_argnames=("window",))
def _reference(q, cache_k, cache_v, layer, cache_index, valid_start, key_mask, query_slot, window=None):
    return xla_cache_attention_state(q, cache_k, cache_v, layer, cache_index, HEAD_DIM ** -0.5,
                                     valid_start=valid_start, key_mask=key_mask, window=window, query_slot=query_slot)


def _assert_states_close(got, want, tolerance):
    for name, a, b in zip(("max", "normalizer", "output"), got, want):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tolerance,
                                   atol=tolerance, err_msg=name)


@pytest.mark.parametrize("length, window", [(1, None), (4, None), (4, 20)])
def test_kernel_equals_reference_at_every_fill_level(length, window):
    """Left-padded rows, random holes, 2 query heads per kv head; cache_index and layer traced (one compile).
    The TPU interpreter covers one new token with a window (`test_tpu_interpret_mode_matches_reference`)."""
    q, cache_k, cache_v, key_mask = _inputs(length, length=length)
    for cache_index in FILL_LEVELS:
        args = (q, cache_k, cache_v, 1, cache_index, VALID_START, key_mask, cache_index)
        got = _kernel(*args, window=window)
        _assert_states_close(got, _reference(*args, window=window), 2e-5)
        # A query that can read nothing leaves a merge unchanged: (MASKED_SCORE, 0, 0).
        empty = np.asarray(got[1]) == 0
        assert (np.asarray(got[0])[empty] == MASKED_SCORE).all() and (np.asarray(got[2])[empty] == 0).all()
    assert empty.sum() < empty.size


def test_reference_equals_attention_computed_slot_by_slot():
    """The oracle against float64 numpy written from the docstring's rule, query by query: the normalized output
    and the log-normalizer max + log(total) (the state is exact up to the choice of max)."""
    length, groups, window, cache_index, layer = 3, 2, 12, 30, 1
    q, cache_k, cache_v, key_mask = _inputs(7, length=length, groups=groups)
    top, total, out = _reference(q, cache_k, cache_v, layer, cache_index, VALID_START, key_mask, cache_index,
                                 window=window)
    q, k, v, mask = (np.asarray(x, np.float64) for x in (q, cache_k[layer], cache_v[layer], key_mask))
    for b in range(ROWS):
        for h in range(KV_HEADS):
            for g in range(groups):
                for t in range(length):
                    slots = [s for s in range(CAPACITY) if VALID_START[b] <= s < cache_index and mask[b, s]
                             and cache_index + t - s < window]
                    if not slots:
                        assert total[b, h, g, t] == 0
                        continue
                    scores = k[b, h, slots] @ q[b, t, h, g] * HEAD_DIM ** -0.5
                    weights = np.exp(scores - scores.max())
                    np.testing.assert_allclose(out[b, h, g, t] / total[b, h, g, t],
                                               weights @ v[b, h, slots] / weights.sum(), rtol=1e-5, atol=1e-5)
                    np.testing.assert_allclose(top[b, h, g, t] + np.log(total[b, h, g, t]),
                                               scores.max() + np.log(weights.sum()), rtol=1e-5)


def test_bfloat16_cache_matches_reference_at_bfloat16_tolerance():
    q, cache_k, cache_v, key_mask = _inputs(3, length=1, groups=4, dtype=jnp.bfloat16)
    for cache_index in (16, 47):
        args = (q, cache_k, cache_v, 0, cache_index, VALID_START, key_mask, cache_index)
        got = _kernel(*args)
        assert all(x.dtype == jnp.float32 for x in got)
        _assert_states_close(got, _reference(*args), 2e-2)


def test_shared_prefix_rows_read_their_prefix_row():
    """A prefix of 3 rows read by 9 query rows (3 each) equals the reference over the prefix repeated per row;
    the window counts from the query's slot after the prefix (query_slot = P + cache_index). (An odd number of
    cache rows runs them as one sequence, an even number as two.)"""
    share, window = 3, 40
    q, prefix_k, prefix_v, prefix_mask = _inputs(5, batch=3 * share, rows=3, length=2)
    prefix_start = np.array([5, 20, 0], np.int32)
    query_slot = CAPACITY + 9  # nine completion slots already cached after the prefix
    got = _kernel(q, prefix_k, prefix_v, 1, CAPACITY, prefix_start, prefix_mask, query_slot, window=window)
    repeat = lambda x, axis: jnp.repeat(x, share, axis=axis)  # noqa: E731
    want = _reference(q, repeat(prefix_k, 1), repeat(prefix_v, 1), 1, CAPACITY, repeat(prefix_start, 0),
                      repeat(prefix_mask, 0), query_slot, window=window)
    _assert_states_close(got, want, 2e-5)


def test_tpu_interpret_mode_matches_reference():
    """The TPU interpreter (`pltpu.InterpretParams`) simulates the scalar prefetch, the pipeline's copies and
    the grid order; the state is the same."""
    q, cache_k, cache_v, key_mask = _inputs(11, length=1)
    args = (q, cache_k, cache_v, 1, 33, VALID_START, key_mask, 33)
    _assert_states_close(_kernel(*args, window=20, interpret=pltpu.InterpretParams()),
                         _reference(*args, window=20), 2e-5)


@pytest.mark.parametrize("low, high", [(0, 1), (3, 16), (16, 33), (17, 64), (40, 41), (40, 40), (50, 9), (0, 0)])
def test_only_the_blocks_meeting_the_live_slots_are_copied(low, high):
    """The kernel copies blocks first .. first + count - 1: each holds a live slot, and every live slot is in one."""
    first, count = live_blocks(low, high, BLOCK)
    copied = set(range(first * BLOCK, (first + count) * BLOCK))
    assert copied >= set(range(low, high))
    assert all(copied & set(range(b * BLOCK, (b + 1) * BLOCK)) & set(range(low, high))
               for b in range(first, first + count))
    traced = jax.jit(live_blocks, static_argnums=2)(low, high, BLOCK)
    assert (int(traced[0]), int(traced[1])) == (first, count) or count == 0 == int(traced[1])


def test_rows_and_heads_sharded_over_devices_give_the_unsharded_state():
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=jax.devices()[:4])
    q, cache_k, cache_v, key_mask = _inputs(13, length=2)
    valid_start = VALID_START
    state = functools.partial(cache_attention_state, q, scale=HEAD_DIM ** -0.5, valid_start=valid_start,
                              key_mask=key_mask, block_size=BLOCK, interpret=True)
    sharded = jax.device_put((cache_k, cache_v), NamedSharding(mesh, PartitionSpec(None, "data", "model")))
    got = jax.jit(lambda k, v: state(cache_k=k, cache_v=v, layer=1, cache_index=37, mesh=mesh))(*sharded)
    want = jax.jit(lambda k, v: state(cache_k=k, cache_v=v, layer=1, cache_index=37))(cache_k, cache_v)
    _assert_states_close(got, want, 1e-6)


@pytest.mark.parametrize("change, message", [
    (dict(block_size=24), "block_size 24 must divide the cache capacity 64"),
    (dict(valid_start=np.zeros(3, np.int32)), r"valid_start must be \[cache rows\]"),
    (dict(key_mask=np.ones((4, 32), bool)), r"key_mask must be \[cache rows, capacity\]"),
    (dict(window=0), "window must be a positive number"),
    (dict(q=jnp.zeros((6, 1, KV_HEADS, 2, HEAD_DIM))), "the cache's 4 rows must divide q's 6 rows"),
    (dict(q=jnp.zeros((4, 1, 3, 2, HEAD_DIM))), "q has 3 kv heads of size 16 but the cache has 2 of size 16"),
])
def test_bad_input_gets_a_one_line_error(change, message):
    q, cache_k, cache_v, _ = _inputs(0)
    kwargs = dict(q=q, cache_k=cache_k, cache_v=cache_v, layer=0, cache_index=5, scale=1.0) | change
    with pytest.raises(ValueError, match=message):
        cache_attention_state(**kwargs, interpret=True)


def test_default_block_size_divides_the_capacity():
    assert pallas_decode.default_block_size(64) == 64
    assert pallas_decode.default_block_size(4096) == 256
    assert pallas_decode.default_block_size(4096, largest=512) == 512
    assert pallas_decode.default_block_size(1152) == 128  # 128 x 9
    assert pallas_decode.default_block_size(576) == 192  # 64 x 9: no multiple of 128 divides it


# Qwen3-1.7B: 28 layers, 8 kv heads of 128 and 16 query heads; batch 128 = 16 prompts x 8 samples, a 512-slot
# prompt cache (shared prefix) and a 3584-slot completion cache: 4096 slots a row, bfloat16.
QWEN3_1_7B = dict(layers=28, kv_heads=8, groups=2, head_dim=128, prompts=16, samples=8, prompt=512, completion=3584)


@pytest.mark.parametrize("topology, window", [("v5e:2x4", None), ("v5p:2x2x4", 1024)])
def test_compiles_for_tpu_reading_the_cache_in_place(topology, window):
    """Mosaic compiles the kernel (not interpreted) for the topology (one host of 8 chips; 4 hosts of 4), rows
    split over all chips, for the sampler's two calls: the completion cache with its key mask and each prompt's
    shared prefix with its left padding. The program's temporaries are nothing: no layer of either cache is
    copied out (one would be 1/28 of it)."""
    _, devices = aot.topology_devices(topology)
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    s = QWEN3_1_7B
    rows = s["prompts"] * s["samples"]
    spec = lambda dtype, shape, *axes: jax.ShapeDtypeStruct(  # noqa: E731
        shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*axes)))
    cache = lambda r, c: spec(jnp.bfloat16, (s["layers"], r, s["kv_heads"], c, s["head_dim"]), None, "data")  # noqa: E731
    q = spec(jnp.bfloat16, (rows, 1, s["kv_heads"], s["groups"], s["head_dim"]), "data")
    scalar = spec(jnp.int32, ())
    scale = s["head_dim"] ** -0.5

    def step(q, cache_k, cache_v, kv_mask, prefix_k, prefix_v, prefix_start, layer, cache_index):
        completion = cache_attention_state(q, cache_k, cache_v, layer, cache_index, scale, key_mask=kv_mask,
                                           window=window, mesh=mesh)
        prefix = cache_attention_state(q, prefix_k, prefix_v, layer, s["prompt"], scale, valid_start=prefix_start,
                                       window=window, query_slot=s["prompt"] + cache_index, mesh=mesh)
        return completion, prefix

    args = (q, cache(rows, s["completion"]), cache(rows, s["completion"]),
            spec(jnp.bool_, (rows, s["completion"]), "data"), cache(s["prompts"], s["prompt"]),
            cache(s["prompts"], s["prompt"]), spec(jnp.int32, (s["prompts"],), "data"), scalar, scalar)
    compiled = jax.jit(step).lower(*args).compile()
    assert compiled.as_text().count("tpu_custom_call") >= 2
    memory = compiled.memory_analysis()
    slot_bytes = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2
    caches_per_chip = slot_bytes * (rows * s["completion"] + s["prompts"] * s["prompt"]) // len(devices)
    assert caches_per_chip <= memory.argument_size_in_bytes < caches_per_chip * 1.01
    assert memory.temp_size_in_bytes + memory.output_size_in_bytes < caches_per_chip / s["layers"] / 100


def _roofline_script():
    path = os.path.join(REPO_ROOT, "benchmarks", "decode_roofline.py")
    spec = importlib.util.spec_from_file_location("bench_decode_roofline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_decode_roofline_counts_by_hand():
    """benchmarks/decode_roofline.py: Qwen3-1.7B's parameters as the compile report counted them from the model
    (docs/tpu/qwen3_1_7b_gsm8k_v5e_8.json), and one tiny step's bytes by hand."""
    bench = _roofline_script()
    assert bench.parameter_count(architectures.decoder_config("qwen3-1.7b")) == 1720574976
    # 1 layer, 1 kv head of 4, 2 chips, 2 prompts x 2 samples: a chip has 1 prompt, 2 rows; slot = 2 * 4 * 2 B.
    shape = bench.DecodeShape(layers=1, kv_heads=1, groups=1, head_dim=4, num_params=100, prompts=2, samples=2,
                              prompt_bucket=8, prompt_length=5, completion_bucket=8, chips=2)
    figures = bench.step_bytes(shape, live=3, prompt_block=4, completion_block=4)
    assert figures["weights"] == 200
    assert figures["roofline_cache"] == 16 * (5 + 2 * 3)
    # Prompt slots [3, 8): blocks 0 and 1 (8 slots); each row's [0, 3): block 0 (4 slots); queries 8 B in, 24 out.
    assert figures["kernel_cache"] == 16 * (8 + 2 * 4) + 2 * 2 * (8 + 24)
    assert figures["xla_cache"] == 16 * (8 + 2 * 8)


# The decoder reading its cache through the kernel (attention="pallas_tpu", interpreted on this CPU) against its
# XLA math (attention="xla"): every real row's logits at each decode step.
DECODE_STEPS = 4


def _decode_logits(name, config, run):
    """`run(model, step)`'s logits per decode step, `step` one jitted cached call of `model` (attention `name`),
    and whether that step traces a Pallas kernel."""
    model = Decoder(config, attention=name, rngs=nnx.Rngs(0))

    @nnx.jit
    def step(model, tokens, positions, cache, cache_index, kv_mask, prefix, prefix_mask):
        return model(tokens, positions, cache=cache, cache_index=cache_index, kv_mask=kv_mask, prefix=prefix,
                     prefix_mask=prefix_mask)

    uses_kernel = []

    def traced_step(*args):
        graphdef, state = nnx.split(model)
        jaxpr = jax.make_jaxpr(lambda state, *a: nnx.merge(graphdef, state)(
            a[0], a[1], cache=a[2], cache_index=a[3], kv_mask=a[4], prefix=a[5], prefix_mask=a[6]))(state, *args)
        uses_kernel.append("pallas_call" in str(jaxpr))
        return step(model, *args)

    return run(model, traced_step), any(uses_kernel)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_decoder_decode_steps_through_the_kernel_equal_xla(family):
    """Left-padded prompts prefilled (a static index: the XLA math for both), then decode steps with a traced
    cache index at fill levels 5..8 of a 12-slot cache, one row with a masked slot (kv_mask reaches the
    kernel), Gemma 3's sliding layer (window 3) cut by the fill: the same logits as attention="xla"."""
    config = llama_and_gemma3(sliding_window=3)[family]
    prompt_length, capacity = 5, 12
    prompt = jax.random.randint(jax.random.key(1), (2, prompt_length), 0, config.vocab_size)
    prompt_valid = jnp.asarray([[False, False] + [True] * 3, [True] * 5])
    upcoming = jax.random.randint(jax.random.key(2), (2, DECODE_STEPS), 0, config.vocab_size)

    def run(model, step):
        cache = model.init_cache(2, capacity)
        kv_mask = jnp.zeros((2, capacity), bool).at[:, :prompt_length].set(prompt_valid)
        positions = jnp.maximum(jnp.cumsum(prompt_valid, axis=1) - 1, 0)
        _, cache = model(prompt, positions, cache=cache, cache_index=0, kv_mask=kv_mask)
        kv_mask = kv_mask.at[1, 3].set(False)  # a hole: row 1 no longer reads its slot 3
        logits = []
        for i in range(DECODE_STEPS):
            slot = prompt_length + i
            kv_mask = kv_mask.at[:, slot].set(True)
            step_positions = positions[:, -1:] + 1 + i
            out, cache = step(upcoming[:, i:i + 1], step_positions, cache, jnp.int32(slot), kv_mask, None, None)
            logits.append(out)
        return jnp.stack(logits)

    want, xla_uses_kernel = _decode_logits("xla", config, run)
    got, pallas_uses_kernel = _decode_logits("pallas_tpu", config, run)
    assert pallas_uses_kernel and not xla_uses_kernel
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_decoder_decode_steps_with_a_shared_prefix_through_the_kernel_equal_xla():
    """The sampler's layout: two left-padded prompts prefilled once (the shared prefix, [L, 2, kv, P, D]), four
    rows (two per prompt) decoding into their own cache with a traced index; Gemma 3's sliding window (3)
    reaches back into the prefix at the first steps and not at the later ones: the same logits as "xla"."""
    config = llama_and_gemma3(sliding_window=3)["gemma3"]
    prompt_length, capacity, share = 4, 8, 2
    prompt = jax.random.randint(jax.random.key(3), (2, prompt_length), 0, config.vocab_size)
    prompt_valid = jnp.asarray([[False] + [True] * 3, [True] * 4])
    upcoming = jax.random.randint(jax.random.key(4), (2 * share, DECODE_STEPS), 0, config.vocab_size)

    def run(model, step):
        prefix = model.init_cache(2, prompt_length)
        positions = jnp.maximum(jnp.cumsum(prompt_valid, axis=1) - 1, 0)
        _, prefix = model(prompt, positions, cache=prefix, cache_index=0, kv_mask=prompt_valid)
        cache = model.init_cache(2 * share, capacity)
        kv_mask = jnp.zeros((2 * share, capacity), bool)
        first_positions = jnp.repeat(positions[:, -1:] + 1, share, axis=0)
        logits = []
        for i in range(DECODE_STEPS):
            kv_mask = kv_mask.at[:, i].set(True)
            out, cache = step(upcoming[:, i:i + 1], first_positions + i, cache, jnp.int32(i), kv_mask, prefix,
                              prompt_valid)
            logits.append(out)
        return jnp.stack(logits)

    want, _ = _decode_logits("xla", config, run)
    got, pallas_uses_kernel = _decode_logits("pallas_tpu", config, run)
    assert pallas_uses_kernel
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pallas_tpu_reads_a_cache_its_mesh_cannot_split_with_xla():
    """A cache whose rows the mesh's row shards do not divide (2 prompts on 4 "data" devices) gets the same state
    from pallas_tpu's `cache_state` through `xla_cache_attention_state` as the kernel gives unsharded."""
    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    q, cache_k, cache_v, key_mask = _inputs(17, batch=4, rows=2)
    read = functools.partial(pallas_tpu.cache_state, q, cache_k, cache_v, 1, 37, key_mask, True, window=20,
                             scale=HEAD_DIM ** -0.5)
    with jax.set_mesh(mesh):
        got = jax.jit(lambda: read(mesh=mesh))()
    _assert_states_close(got, jax.jit(read)(), 1e-6)


@pytest.mark.parametrize("prompts", [8, 4])
def test_decoder_decode_step_compiles_for_tpu_with_the_kernel(prompts):
    """The tiny Gemma 3's decode step (traced index, shared prefix, rows over a v5e-8's chips) compiled with
    libtpu's Mosaic: attention="pallas_tpu" calls the decode kernel (`tpu_custom_call` named
    cache_attention_state), attention="xla" calls no kernel. With 4 prompts on 8 chips the prefix is read by
    XLA (its rows do not split over the chips), the row cache still by the kernel."""
    _, devices = aot.topology_devices("v5e:2x4")
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    config = llama_and_gemma3(sliding_window=3)["gemma3"]
    rows, prompt_length, capacity = 16, 8, 16
    texts = {}
    for name in ("pallas_tpu", "xla"):
        abstract = nnx.eval_shape(lambda: Decoder(config, attention=name, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        replicated = NamedSharding(mesh, PartitionSpec())
        state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), state)
        spec = lambda shape, dtype, *axes: jax.ShapeDtypeStruct(  # noqa: E731
            shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*axes)))
        cache_shape = lambda r, c: (config.num_layers, r, config.num_kv_heads, c, config.head_dim)  # noqa: E731
        cache = KVCache(*(spec(cache_shape(rows, capacity), jnp.float32, None, "data") for _ in "kv"))
        prompt_axis = "data" if prompts % len(devices) == 0 else None  # 4 prompts: replicated
        prefix = KVCache(*(spec(cache_shape(prompts, prompt_length), jnp.float32, None, prompt_axis) for _ in "kv"))

        def step(state, tokens, positions, cache, cache_index, kv_mask, prefix, prefix_mask):
            return nnx.merge(graphdef, state)(tokens, positions, cache=cache, cache_index=cache_index,
                                              kv_mask=kv_mask, prefix=prefix, prefix_mask=prefix_mask)

        args = (state, spec((rows, 1), jnp.int32, "data"), spec((rows, 1), jnp.int32, "data"), cache,
                spec((), jnp.int32), spec((rows, capacity), jnp.bool_, "data"), prefix,
                spec((prompts, prompt_length), jnp.bool_, prompt_axis))
        with jax.set_mesh(mesh):
            texts[name] = jax.jit(step).lower(*args).compile().as_text()
    assert "tpu_custom_call" in texts["pallas_tpu"] and "cache_attention_state" in texts["pallas_tpu"]
    assert "tpu_custom_call" not in texts["xla"]
