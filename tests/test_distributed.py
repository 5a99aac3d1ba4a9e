"""`jaxgrpo.distributed`'s mesh helpers in one process (the multi-process paths: tests/train/test_multihost.py)."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from jaxgrpo import distributed


def _mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names),
                         devices=jax.devices()[:int(np.prod(shape))])


@pytest.mark.parametrize("shape, names, axes, shards", [
    ((4, 2, 1), ("data", "fsdp", "model"), ("data", "fsdp"), 8),
    ((1, 8, 1), ("data", "fsdp", "model"), ("data", "fsdp"), 8),
    ((2, 4), ("data", "model"), ("data",), 2),
    ((2, 4), ("fsdp", "model"), ("fsdp",), 2),
    ((8,), ("model",), (), 1),
])
def test_batch_axes_are_the_meshs_data_and_fsdp_in_that_order(shape, names, axes, shards):
    mesh = _mesh(shape, names)
    assert distributed.batch_axes(mesh) == axes
    assert distributed.batch_shards(mesh) == shards


def test_batch_shards_without_a_mesh_is_one():
    assert distributed.batch_shards(None) == 1


@pytest.mark.parametrize("n, multiple, expected", [(0, 8, 0), (1, 8, 8), (8, 8, 8), (9, 8, 16), (5, 1, 5)])
def test_round_up(n, multiple, expected):
    assert distributed.round_up(n, multiple) == expected


def test_process_sharding_splits_rows_over_every_batch_axis_in_one_process():
    mesh = _mesh((4, 2, 1), ("data", "fsdp", "model"))
    assert distributed.process_sharding(mesh, 16).spec == PartitionSpec(("data", "fsdp"))
    # 4 rows do not divide over 8 shards: the first axis alone that divides them.
    assert distributed.process_sharding(mesh, 4).spec == PartitionSpec(("data",))
