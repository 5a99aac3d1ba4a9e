"""pallas_gpu (jaxgrpo.models.attention.pallas_gpu), our Pallas flash attention for GPUs, against the XLA reference.

Its kernels run interpreted on this CPU: the outputs on every real query and the gradients (q, k, v) of a
loss over them must equal the dense XLA math, in float32 to 1e-5, for left-padded rows, packed segments
(and ids scattered in no runs at all, which block skipping must survive), packed prompt groups (the
two-call union and its backward, with and without a sliding window counted in positions), grouped-query
heads, soft-capped scores and lengths that are no multiple of the block; in bfloat16 to bfloat16's
precision. Small blocks (16) make every case several blocks long. A whole Decoder gives the same logits
and parameter gradients with it as with "xla", on one device and per shard on a mesh; the blocks it
visits are the ones a packed row's segments and a window allow; and its forward and backward lower for a
CUDA target through the Triton backend without a GPU.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo.models import Decoder, DecoderConfig, attention
from jaxgrpo.models.attention import AttentionLayout, flash_common, pallas_gpu
from jaxgrpo.models.partitioning import batch_sharding, shard_model
from tests.models.test_attention_impl import _branch_row
from tests.support.tiny_models import llama_and_gemma3

RTOL, ATOL = 1e-5, 2e-6
SMALL = pallas_gpu.Tiling(block_q=16, block_k=16)


def _gradient_program(name, window, soft_cap, **options):
    """jit(value_and_grad) of sum(out * weights) through implementation `name`, in q, k, v, with the masks
    as an argument: layouts of one shape and one kind of call share the compiled program (compiling the
    interpreted kernels is what takes a test's time)."""
    implementation = attention.get(name)

    def loss(q, k, v, masks, weights):
        out = implementation.attend(q, k, v, masks, window is not None, window=window, scale=0.7,
                                    logit_soft_cap=soft_cap, **options)
        return jnp.sum(out.astype(jnp.float32) * weights), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def _assert_matches_xla(layouts, *, kv_heads, groups, window=None, soft_cap=None, seed=0, head_dim=8,
                        dtype=jnp.float32):
    """For each (layout, positions, real queries) of `layouts` (one shape): pallas_gpu on random inputs in
    `dtype` == xla on the same values in float32, outputs on the real queries (float32: to 1e-5) and the
    gradients of a loss over them (float32: to 1e-5 of the largest entry, as sums in another order differ;
    bfloat16: both within 2% of the largest entry)."""
    programs = {"pallas_gpu": _gradient_program("pallas_gpu", window, soft_cap, tiling=SMALL),
                "xla": _gradient_program("xla", window, soft_cap)}
    for index, (layout, positions, real) in enumerate(layouts):
        batch, length = real.shape
        keys = jax.random.split(jax.random.key(seed + index), 4)
        q = jax.random.normal(keys[0], (batch, length, kv_heads, groups, head_dim)).astype(dtype)
        k = jax.random.normal(keys[1], (batch, length, kv_heads, head_dim)).astype(dtype)
        v = jax.random.normal(keys[2], (batch, length, kv_heads, head_dim)).astype(dtype)
        weights = jax.random.normal(keys[3], q.shape) * real[:, :, None, None, None]

        def run(name, inputs):
            masks = attention.get(name).prepare(layout, positions, window)
            (_, out), grads = programs[name](*inputs, masks, weights)
            return np.asarray(out, np.float32)[np.asarray(real)], [np.asarray(g, np.float32) for g in grads]

        out, grads = run("pallas_gpu", (q, k, v))
        out_xla, grads_xla = run("xla", [x.astype(jnp.float32) for x in (q, k, v)])
        relative = RTOL if dtype == jnp.float32 else 0.02
        atol = ATOL if dtype == jnp.float32 else relative * np.abs(out_xla).max()
        np.testing.assert_allclose(out, out_xla, rtol=RTOL, atol=atol, err_msg=f"{layout.kind}: out")
        for name, a, b in zip("qkv", grads, grads_xla):  # float32 sums in another order: relative to the largest
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=relative * np.abs(b).max(),
                                       err_msg=f"{layout.kind}: d loss / d {name}")


def _padded(rng, batch, length):
    """Left-padded rows: up to half of each row padding."""
    valid = jnp.asarray(np.arange(length)[None] >= rng.integers(0, length // 2, batch)[:, None])
    return AttentionLayout.padded(valid), jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0), valid


def _segments(rng, batch, length):
    """4 packed segments of random lengths per row, then 3 slots of padding."""
    rows = []
    for _ in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, length - 3), 3, replace=False))
        rows.append(np.r_[np.repeat(np.arange(1, 5), np.diff(np.r_[0, cuts, length - 3])), [0] * 3])
    return _segment_layout(rows)


def _scattered(rng, batch, length):
    """Segment ids 0 (padding) to 3 drawn per slot: no runs at all, so block skipping gains nothing and
    must lose nothing."""
    return _segment_layout(rng.integers(0, 4, (batch, length)))


def _segment_layout(rows):
    segment_ids = jnp.asarray(np.stack(rows), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(segment_ids.shape[1]), segment_ids.shape)  # unused by this layout
    return AttentionLayout.segments(segment_ids), positions, segment_ids != 0


def _prompt_groups(rng, batch, length):
    """Rows of packed prompt groups (trunks of 1 to 12 slots, 1 to 3 branches of 1 to 9), then padding."""
    rows = []
    for _ in range(batch):
        groups, used = [], 0
        while True:
            group = (int(rng.integers(1, 13)), [int(n) for n in rng.integers(1, 10, rng.integers(1, 4))])
            if used + group[0] + sum(group[1]) > length:
                break
            groups.append(group)
            used += group[0] + sum(group[1])
        rows.append(_branch_row(groups, length))
    segments, branches, positions = (jnp.concatenate(parts) for parts in zip(*rows))
    return AttentionLayout.branches(segments, branches), positions, segments != 0


def test_padded_rows_packed_segments_and_scattered_ids_with_a_window_and_soft_cap_match_xla():
    """Random layouts of 3 rows of 53 slots (no multiple of the block), 2 heads per kv head, one call each:
    left-padded rows, packed segments, and segment ids in no runs."""
    rng = np.random.default_rng(0)
    layouts = [make(rng, 3, 53) for make in (_padded, _segments, _scattered)]
    _assert_matches_xla(layouts, kv_heads=2, groups=2, window=6, soft_cap=2.0)


def test_packed_prompt_groups_with_4_heads_per_kv_head_match_xla():
    """Two random rows of packed prompt groups (two calls merged by log-sum-exp, and their backward)."""
    rng = np.random.default_rng(1)
    _assert_matches_xla([_prompt_groups(rng, 2, 71)], kv_heads=1, groups=4, seed=1)


def test_packed_prompt_groups_with_a_window_counted_in_positions_and_soft_cap_match_xla():
    rng = np.random.default_rng(2)
    _assert_matches_xla([_prompt_groups(rng, 2, 45)], kv_heads=2, groups=2, window=4, soft_cap=2.5, seed=2)


def test_bfloat16_matches_xla_to_bfloat16_precision():
    layout = _prompt_groups(np.random.default_rng(7), 2, 48)
    _assert_matches_xla([layout], kv_heads=2, groups=2, window=7, soft_cap=3.0, head_dim=16, dtype=jnp.bfloat16)


def test_one_call_writes_its_gradients_in_the_inputs_dtype_rounded_once():
    """One call (padded rows) in bfloat16: the dq and dk/dv kernels write bfloat16 gradients (no float32 copy for
    XLA to convert), equal to the kernels' float32 gradients rounded once; the union of two calls (packed prompt
    groups) asks its kernels for float32, to be summed."""
    rng = np.random.default_rng(3)
    batch, length, kv_heads, groups, head_dim = 2, 48, 2, 2, 16
    settings = pallas_gpu.CallSettings(scale=0.5, logit_soft_cap=None, window=None, length=length, groups=groups,
                                       tiling=SMALL, interpret=True)
    keys = jax.random.split(jax.random.key(0), 4)  # the model's layout; whole blocks of 16: no padding
    q = jax.random.normal(keys[0], (batch, length, kv_heads * groups, head_dim)).astype(jnp.bfloat16)
    k, v = (jax.random.normal(key, (batch, length, kv_heads, head_dim)).astype(jnp.bfloat16) for key in keys[1:3])
    d_out = jax.random.normal(keys[3], q.shape).astype(jnp.bfloat16)
    layout, _, _ = _padded(rng, batch, length)
    call = flash_common.segment_ids(layout)
    out, lse = pallas_gpu._forward(q, k, v, call, settings=settings)
    wide = pallas_gpu._backward(q, k, v, call, out, lse, d_out, jnp.float32, settings=settings)
    narrow = pallas_gpu._backward(q, k, v, call, out, lse, d_out, jnp.bfloat16, settings=settings)
    for name, a, b in zip("qkv", narrow, wide):
        assert a.dtype == jnp.bfloat16 and b.dtype == jnp.float32, name
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b.astype(jnp.bfloat16), np.float32),
                                      err_msg=f"d{name}")

    asked = []

    def forward(q, k, v, ids):
        return q, jnp.zeros(q.shape[:-1], jnp.float32)

    def backward(q, k, v, ids, out, lse, d_out, grad_dtype):
        asked.append(grad_dtype)
        return (jnp.zeros(q.shape, grad_dtype), jnp.zeros(k.shape, grad_dtype), jnp.zeros(v.shape, grad_dtype))

    union = flash_common.lse_union(forward, backward)
    for calls in ([call], [call, call]):
        asked.clear()
        jax.grad(lambda q: union(q, k, v, calls).astype(jnp.float32).sum())(q)
        assert asked == ([jnp.bfloat16] if len(calls) == 1 else [jnp.float32] * 2), asked


def test_blocks_visited_are_those_segments_causality_and_a_window_allow():
    """Golden values: a row of 2 packed segments of 64 slots in blocks of 16 (one head per kv head) visits,
    per segment, the 10 blocks on and below the diagonal of its 4 x 4, none across segments: 20 of 64
    pairs. A window of 8 slots keeps the diagonal and the one below it (query block i's first slot is
    16 (i - j) - 15 after key block j's last: below 8 only for i - j <= 1): 7 per segment."""
    ids = jnp.asarray(np.repeat([1, 2], 64)[None], jnp.int32)
    slots = jnp.arange(128, dtype=jnp.int32)[None]
    blocks = np.arange(4)
    for window, bands in ((None, 4), (8, 2)):
        settings = pallas_gpu.CallSettings(scale=1.0, logit_soft_cap=None, window=window, length=128, groups=1,
                                           tiling=SMALL, interpret=True)
        visited = pallas_gpu.visited_blocks({"query": ids, "key": ids, "query_position": slots,
                                             "key_position": slots}, settings, slots=128)
        segment = (blocks[:, None] >= blocks[None, :]) & (blocks[:, None] - blocks[None, :] < bands)
        expected = np.kron(np.eye(2, dtype=bool), segment)
        assert expected.sum() == {None: 20, 8: 14}[window]
        np.testing.assert_array_equal(np.asarray(visited[0]), expected, err_msg=f"window {window}")


def _decoder_logits(name, config, mesh=None):
    """Logits on the real tokens of a Decoder over two rows, one left-padded; on `mesh`, with its parameters
    and rows sharded there. (Gradients are the kernel tests'.)"""
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, config.vocab_size)
    mask = jnp.asarray([[False] * 3 + [True] * 9, [True] * 12])
    model = Decoder(config, attention=name, rngs=nnx.Rngs(0))
    if mesh is not None:
        shard_model(model, mesh)
        tokens, mask = (jax.device_put(x, batch_sharding(mesh)) for x in (tokens, mask))
    logits = nnx.jit(lambda model, tokens, mask: model(tokens, attention_mask=mask))(model, tokens, mask)
    return np.asarray(logits)[np.asarray(mask)]


def test_decoder_with_pallas_gpu_equals_xla():
    """A tiny Gemma 3: two query heads per kv head; a sliding and a full layer (a `lax.cond` per layer in
    the scan, on a traced flag)."""
    config = llama_and_gemma3(sliding_window=4)["gemma3"]
    np.testing.assert_allclose(_decoder_logits("pallas_gpu", config), _decoder_logits("xla", config),
                               rtol=RTOL, atol=ATOL)


def test_decoder_with_pallas_gpu_per_shard_on_a_mesh_equals_one_device(mesh_2x4):
    """On a (data=2, model=4) mesh the kernels run per shard (`shard_map`): rows over `data`, the 4 kv
    heads with their query heads over `model`; the same logits as "xla" on one device."""
    config = DecoderConfig(family="llama", vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2,
                           num_heads=8, num_kv_heads=4, head_dim=8)
    np.testing.assert_allclose(_decoder_logits("pallas_gpu", config, mesh_2x4), _decoder_logits("xla", config),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype, head_dim", [(jnp.bfloat16, 128), (jnp.float32, 8)])
def test_forward_and_backward_lower_for_an_h100_through_triton(dtype, head_dim):
    """Lowered for a CUDA target on this CPU (`lowering_platforms=("cuda",)`, under an abstract mesh whose
    device is an H100, whose compute capability JAX 0.11's Triton lowering reads; `interpret=False`):
    packed prompt groups (two calls), grouped-query heads, a soft cap and a traced sliding flag (windowed
    and full kernels) give only Triton calls (`__gpu$xla.gpu.triton`) for the forward, dq and dk/dv
    kernels. Triton's own compilation to PTX happens in XLA on a GPU, so it is not checked here."""
    batch, length, kv_heads, groups = 2, 200, 2, 4
    layout, positions, _ = _prompt_groups(np.random.default_rng(0), batch, length)
    masks = pallas_gpu.prepare(layout, positions, 16)

    def loss(q, k, v, sliding):
        out = pallas_gpu.attend(q, k, v, masks, sliding, window=16, scale=0.1, logit_soft_cap=30.0, interpret=False)
        return out.astype(jnp.float32).sum()

    specs = [jax.ShapeDtypeStruct((batch, length, kv_heads, groups, head_dim), dtype)]
    specs += [jax.ShapeDtypeStruct((batch, length, kv_heads, head_dim), dtype)] * 2
    specs.append(jax.ShapeDtypeStruct((), bool))
    h100 = jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=h100)
    for program in (loss, jax.grad(loss, argnums=(0, 1, 2))):
        with jax.sharding.use_abstract_mesh(mesh):
            text = jax.jit(program).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
        targets = set(re.findall(r"stablehlo.custom_call @([\w$.]+)", text))
        names = set(re.findall(r'name = "(flash_attention_\w+)"', text))
        assert targets == {"__gpu$xla.gpu.triton"}, targets
        assert names == ({"flash_attention_forward"} if program is loss else
                         {"flash_attention_forward", "flash_attention_dq", "flash_attention_dkv"})
