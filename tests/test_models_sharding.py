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
