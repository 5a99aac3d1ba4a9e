"""Sharded forwards equal single-device ones; FSDP really splits the parameter bytes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from jaxgrpo.models import Decoder, DecoderConfig
from jaxgrpo.models.partitioning import FSDP_RULES, batch_sharding, logical_to_mesh_spec, shard_model

CONFIG = DecoderConfig(family="qwen2", vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True)


def _forward(model, tokens, mask):
    return model(tokens, attention_mask=mask)


def test_sharded_forward_on_2x4_mesh_equals_single_device(mesh_2x4):
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (4, 16), 0, CONFIG.vocab_size)
    mask = jnp.ones((4, 16), bool).at[1, :5].set(False)
    expected = np.asarray(jax.jit(_forward)(model, tokens, mask))

    shard_model(model, mesh_2x4)
    # Tensor parallelism really happened: query heads over `model`, embed over `data`.
    assert model.layers.attn.q[...].sharding.spec == PartitionSpec(None, "data", "model", None)
    tokens = jax.device_put(tokens, batch_sharding(mesh_2x4))
    mask = jax.device_put(mask, batch_sharding(mesh_2x4))
    logits = jax.jit(_forward)(model, tokens, mask)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5)


def test_full_fsdp_over_8_devices_splits_parameter_bytes():
    mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    model = shard_model(Decoder(CONFIG, rngs=nnx.Rngs(0)), mesh, FSDP_RULES)
    total = per_device = 0
    for array in jax.tree.leaves(nnx.state(model, nnx.Param)):
        total += array.nbytes
        per_device += math.prod(array.sharding.shard_shape(array.shape)) * array.dtype.itemsize
    assert per_device <= 1.05 * total / 8, (per_device, total)


@pytest.mark.parametrize(
    "axes, shape, expected",
    [
        (("embed", "kv_heads", "head_dim"), (64, 4, 16), PartitionSpec("data", "model", None)),
        (("embed", "kv_heads", "head_dim"), (64, 3, 16), PartitionSpec("data", None, None)),  # 3 heads on 4 devices
        (("layers", "norm"), (2, 64), PartitionSpec(None, "data")),
    ],
)
def test_logical_axes_map_to_mesh_axes_that_divide(mesh_2x4, axes, shape, expected):
    assert logical_to_mesh_spec(axes, shape, mesh_2x4) == expected


def test_unknown_logical_axis_is_an_error(mesh_2x4):
    with pytest.raises(KeyError, match="no partitioning rule for logical axis 'experts'"):
        logical_to_mesh_spec(("experts",), (8,), mesh_2x4)


# -- activations follow the mesh ----------------------------------------------------------------

ACT_CONFIG = DecoderConfig(family="llama", vocab_size=256, hidden_size=64, intermediate_size=256, num_layers=2,
                           num_heads=8, num_kv_heads=4, head_dim=16)


def _loss_and_grad(model, tokens, mask):
    def loss(model):
        logprobs, _ = model.token_logprobs(tokens[:, :-1], tokens[:, 1:], attention_mask=mask[:, :-1])
        return -(logprobs * mask[:, 1:]).sum() / mask.sum()

    value, grads = nnx.value_and_grad(loss)(model)
    return value, nnx.state(grads, nnx.Param)


def _loss_jaxpr(model, tokens, mask) -> str:
    graphdef, state = nnx.split(model)
    return str(jax.make_jaxpr(lambda s, t, m: _loss_and_grad(nnx.merge(graphdef, s), t, m)[0])(state, tokens, mask))


def _activation_inputs(batch=16, length=128):
    tokens = jax.random.randint(jax.random.key(2), (batch, length), 0, ACT_CONFIG.vocab_size)
    mask = jnp.ones((batch, length), bool).at[1, :7].set(False).at[5, :40].set(False)
    return tokens, mask


def test_no_mesh_adds_no_sharding_constraint():
    model = Decoder(ACT_CONFIG, rngs=nnx.Rngs(0))
    tokens, mask = _activation_inputs(4, 16)
    assert "sharding_constraint" not in _loss_jaxpr(model, tokens, mask)


def test_sharded_forward_and_grad_equal_single_device(mesh_2x4):
    model = Decoder(ACT_CONFIG, rngs=nnx.Rngs(0))
    tokens, mask = _activation_inputs(8, 32)
    loss, grads = jax.jit(_loss_and_grad)(model, tokens, mask)

    shard_model(model, mesh_2x4)
    sharded_inputs = jax.device_put((tokens, mask), batch_sharding(mesh_2x4))
    # The mesh comes from the parameters (no jax.set_mesh): the activations are constrained.
    assert "sharding_constraint" in _loss_jaxpr(model, *sharded_inputs)
    sharded_loss, sharded_grads = jax.jit(_loss_and_grad)(model, *sharded_inputs)
    np.testing.assert_allclose(float(sharded_loss), float(loss), atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5), sharded_grads, grads)
    # Under jax.set_mesh too.
    with jax.set_mesh(mesh_2x4):
        set_loss, set_grads = jax.jit(_loss_and_grad)(model, *sharded_inputs)
    np.testing.assert_allclose(float(set_loss), float(loss), atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5), set_grads, grads)


@pytest.mark.parametrize("mesh_axes", [(("data", 2), ("model", 4)), (("fsdp", 8),)])
def test_compiled_temporaries_fall_with_devices(mesh_axes):
    def temp_bytes(model, tokens, mask):
        compiled = jax.jit(_loss_and_grad).lower(model, tokens, mask).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    tokens, mask = _activation_inputs()
    one = temp_bytes(Decoder(ACT_CONFIG, rngs=nnx.Rngs(0)), tokens, mask)
    names, sizes = zip(*mesh_axes)
    mesh = jax.make_mesh(sizes, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))
    model = shard_model(Decoder(ACT_CONFIG, rngs=nnx.Rngs(0)), mesh)
    with jax.set_mesh(mesh):
        eight = temp_bytes(model, *jax.device_put((tokens, mask), batch_sharding(mesh)))
    assert eight <= one / 4, (one, eight)


def test_activation_spec_rules(mesh_2x4):
    from jaxgrpo.models.partitioning import activation_spec

    fsdp_tp = jax.make_mesh((1, 4, 2), ("data", "fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    assert activation_spec(("batch", None, None), (8, 16, 64), mesh_2x4) == PartitionSpec("data", None, None)
    assert activation_spec(("batch", None, "heads", None), (8, 16, 8, 16), mesh_2x4) == PartitionSpec("data", None, "model", None)
    assert activation_spec(("batch", None, "mlp"), (8, 16, 96), fsdp_tp) == PartitionSpec("fsdp", None, "model")
    # 9 heads do not divide the 2-way model axis: the heads stay unconstrained and the rows take `model`.
    assert activation_spec(("batch", None, "heads", None), (8, 16, 9, 16), fsdp_tp) == PartitionSpec(
        ("fsdp", "model"), None, PartitionSpec.UNCONSTRAINED, None)
    # Nothing divides: no constraint at all.
    assert activation_spec(("batch", None, None), (3, 16, 64), fsdp_tp) is None
    # Explicit axes carry their layout in the types; a one-device mesh has nothing to split.
    explicit = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    assert activation_spec(("batch", None, None), (8, 16, 64), explicit) is None
    one = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:1])
    assert activation_spec(("batch", None, None), (8, 16, 64), one) is None
