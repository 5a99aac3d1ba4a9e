"""The attention implementations (jaxgrpo.models.attention) against the XLA reference.

Splash attention (pallas_tpu) runs interpreted on this CPU: its values and gradients must equal the dense
XLA math on every real query for packed segments, packed prompt groups (trunk + branches, the two-call
merge and its custom backward), grouped-query heads, sliding windows, soft-capped scores and left-padded
rows, on fixed and on randomly drawn shapes and layouts; and a whole Decoder must give the same logits and
parameter gradients with either. Shapes are tiny: interpreted kernels are slow.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo import config as config_lib
from jaxgrpo.models import Decoder, attention
from jaxgrpo.models.attention import AttentionLayout
from tests.support.tiny_models import llama_and_gemma3

RTOL, ATOL = 1e-5, 2e-6


def _branch_row(groups, length):
    """(segment ids, branch ids, positions) [1, length] of packed prompt groups: `groups` lists (trunk
    slots, [branch slots, ...]) laid out one after the other, then padding (models/packing.py's layout)."""
    segments, branches, positions = np.zeros(length, int), np.zeros(length, int), np.zeros(length, int)
    slot = 0
    for j, (trunk, branch_lengths) in enumerate(groups, start=1):
        segments[slot:slot + trunk], positions[slot:slot + trunk] = j, np.arange(trunk)
        slot += trunk
        for g, n in enumerate(branch_lengths, start=1):
            segments[slot:slot + n], branches[slot:slot + n] = j, g
            positions[slot:slot + n] = trunk + np.arange(n)  # each branch continues the trunk
            slot += n
    assert slot <= length
    return tuple(jnp.asarray(x[None], jnp.int32) for x in (segments, branches, positions))


def _assert_same_attention(layout, positions, real, *, kv_heads, groups, window=None, soft_cap=None, seed=0):
    """pallas_tpu == xla, outputs on the `real` queries and the gradients of a loss over them."""
    batch, length = real.shape
    keys = jax.random.split(jax.random.key(seed), 4)
    head_dim = 8
    q = jax.random.normal(keys[0], (batch, length, kv_heads, groups, head_dim))
    k = jax.random.normal(keys[1], (batch, length, kv_heads, head_dim))
    v = jax.random.normal(keys[2], (batch, length, kv_heads, head_dim))
    weights = jax.random.normal(keys[3], q.shape) * real[:, :, None, None, None]

    def loss_and_out(name, q, k, v):
        impl = attention.get(name)
        out = impl.attend(q, k, v, impl.prepare(layout, positions, window), window is not None, window=window,
                          scale=0.7, logit_soft_cap=soft_cap)
        return jnp.sum(out * weights), out

    results = {name: jax.jit(jax.value_and_grad(lambda *a: loss_and_out(name, *a), argnums=(0, 1, 2), has_aux=True))(
        q, k, v) for name in ("xla", "pallas_tpu")}
    (_, out_xla), grads_xla = results["xla"]
    (_, out_splash), grads_splash = results["pallas_tpu"]
    np.testing.assert_allclose(np.asarray(out_splash)[np.asarray(real)], np.asarray(out_xla)[np.asarray(real)],
                               rtol=RTOL, atol=ATOL)
    for name, a, b in zip("qkv", grads_splash, grads_xla):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"d loss / d {name}")


def test_packed_segments_grouped_heads_and_soft_cap_match_xla():
    segment_ids = jnp.asarray([[1] * 5 + [2] * 7 + [3] * 2 + [0] * 2, [1] * 12 + [0] * 4], jnp.int32)
    layout = AttentionLayout.segments(segment_ids)
    positions = jnp.broadcast_to(jnp.arange(16), (2, 16))  # unused by this layout
    _assert_same_attention(layout, positions, segment_ids != 0, kv_heads=2, groups=2, soft_cap=2.0)


def test_prefix_grouper_layout_matches_xla():
    """Two prompt groups in one row, each a trunk and uneven branches: a branch sees its trunk and itself."""
    segments, branches, positions = _branch_row([(4, [3, 5, 1]), (2, [4, 2])], 24)
    layout = AttentionLayout.branches(segments, branches)
    _assert_same_attention(layout, positions, segments != 0, kv_heads=1, groups=2)


def test_left_padded_rows_with_a_sliding_window_match_xla():
    valid = jnp.asarray([[False] * 5 + [True] * 11, [True] * 16])
    layout = AttentionLayout.padded(valid)
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    _assert_same_attention(layout, positions, valid, kv_heads=2, groups=1, window=4)


def test_prefix_grouper_sliding_layer_counts_positions_like_xla():
    """A sliding layer of packed prompt groups: the window counts positions (here shorter than the trunk)."""
    segments, branches, positions = _branch_row([(6, [3, 5])], 16)
    layout = AttentionLayout.branches(segments, branches)
    _assert_same_attention(layout, positions, segments != 0, kv_heads=1, groups=2, window=3)


def _random_layout(rng: np.random.Generator, batch: int, length: int):
    """(layout, positions, real queries) of one kind drawn by `rng`: left-padded rows, packed segments of
    random lengths, or packed prompt groups with random trunks and branches."""
    kind = rng.choice(["padded", "segments", "branches"])
    if kind == "padded":
        pads = rng.integers(0, length // 2, batch)
        valid = jnp.asarray(np.arange(length)[None] >= pads[:, None])
        return AttentionLayout.padded(valid), jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0), valid
    if kind == "segments":
        rows = []
        for _ in range(batch):
            cuts = np.sort(rng.choice(np.arange(1, length), size=rng.integers(1, 4), replace=False))
            rows.append(np.repeat(np.arange(1, len(cuts) + 2), np.diff(np.r_[0, cuts, length])))
            rows[-1][rng.integers(length - 3, length + 1):] = 0  # a padded tail, sometimes empty
        segment_ids = jnp.asarray(np.stack(rows), jnp.int32)
        positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
        return AttentionLayout.segments(segment_ids), positions, segment_ids != 0
    groups, used = [], 0
    while used < length - 6:
        trunk, branches = int(rng.integers(1, 5)), [int(n) for n in rng.integers(1, 4, rng.integers(1, 4))]
        if used + trunk + sum(branches) > length:
            break  # the first group always fits: at most 4 + 3 x 3 = 13 slots, and length >= 20 here
        groups.append((trunk, branches))
        used += trunk + sum(branches)
    rows = [_branch_row(groups, length) for _ in range(batch)]
    segments, branches, positions = (jnp.concatenate(parts) for parts in zip(*rows))
    return AttentionLayout.branches(segments, branches), positions, segments != 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_shapes_and_layouts_match_xla(seed):
    """Random batch, length, heads per key/value head, window and soft cap, over a random layout kind."""
    rng = np.random.default_rng(seed)
    batch, length = int(rng.integers(1, 3)), int(rng.choice([20, 29, 37]))
    layout, positions, real = _random_layout(rng, batch, length)
    window = None if layout.kind == "branches" or rng.random() < 0.4 else int(rng.integers(2, 8))
    soft_cap = None if rng.random() < 0.5 else float(rng.uniform(1.0, 5.0))
    _assert_same_attention(layout, positions, real, kv_heads=int(rng.integers(1, 3)), groups=int(rng.choice([1, 2, 4])),
                           window=window, soft_cap=soft_cap, seed=seed)


def test_decoder_with_splash_attention_equals_xla():
    """Logits and every parameter's gradient of a tiny Gemma 3 Decoder (two query heads per key/value head,
    a sliding and a full layer: one `lax.cond` per layer in the scan, on a traced flag) are the same with
    attention="pallas_tpu" and "xla"."""
    config = llama_and_gemma3(sliding_window=4)["gemma3"]
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, config.vocab_size)
    mask = jnp.asarray([[False] * 3 + [True] * 9, [True] * 12])

    def logits_and_grads(name):
        model = Decoder(config, attention=name, rngs=nnx.Rngs(0))

        def loss(model):
            logits = model(tokens, attention_mask=mask)
            return jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(logits), 0.0) ** 2), logits

        (_, logits), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
        return logits, jax.tree.leaves(nnx.to_pure_dict(grads))

    logits_xla, grads_xla = logits_and_grads("xla")
    logits_splash, grads_splash = logits_and_grads("pallas_tpu")
    np.testing.assert_allclose(logits_splash[mask], logits_xla[mask], rtol=RTOL, atol=ATOL)
    for a, b in zip(grads_splash, grads_xla):  # float32 sums in another order: relative to the largest entry
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * float(np.abs(b).max()))


def test_registry_names_platforms_and_defaults():
    assert attention.available("cpu") == ("xla", "pallas_tpu", "pallas_gpu", "cpu")
    assert attention.available("tpu") == ("xla", "pallas_tpu")
    assert attention.available("gpu") == ("xla", "pallas_gpu")
    assert (attention.default_for("tpu"), attention.default_for("cpu"), attention.default_for("gpu")) == (
        "pallas_tpu", "cpu", "pallas_gpu")
    assert attention.resolve("auto", "tpu").name == "pallas_tpu"
    assert attention.resolve("auto", "gpu").name == "pallas_gpu"
    assert config_lib.ATTENTION_NAMES == (attention.AUTO,) + attention.NAMES


def test_unknown_or_unavailable_implementations_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown attention implementation 'flash'; choose one of auto, xla, pallas_tpu, "
                                         "pallas_gpu, cpu"):
        attention.get("flash")
    with pytest.raises(ValueError, match="unknown attention implementation 'flash'"):
        Decoder(llama_and_gemma3(4)["llama"], attention="flash", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="'cpu' does not run on tpu; available there: auto, xla, pallas_tpu"):
        attention.resolve("cpu", "tpu")
    with pytest.raises(ValueError, match="'pallas_tpu' does not run on gpu; available there: auto, xla, pallas_gpu"):
        attention.resolve("pallas_tpu", "gpu")
    with pytest.raises(ValueError, match="'pallas_gpu' does not run on tpu; available there: auto, xla, pallas_tpu"):
        attention.resolve("pallas_gpu", "tpu")
    cfg = config_lib.Config(attention="splash")
    with pytest.raises(Exception, match="attention must be one of auto, xla, pallas_tpu, pallas_gpu, cpu, got 'splash'"):
        config_lib.validate(cfg, row_shards=1)
