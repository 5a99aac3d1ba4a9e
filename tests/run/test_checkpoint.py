"""Checkpoint checksums: every array's bits are covered, the layout is not, and a checkpoint whose bytes changed on
disk is refused naming the step and the array (orbax alone restores it as wrong numbers)."""

import glob
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgrpo.run.checkpoint import CHECKSUMS, CheckpointDamaged, Checkpointer, array_checksums


def checksum(x):
    return array_checksums({"x": x})["x"]["checksum"]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int32, np.uint8])
def test_flipping_any_one_bit_changes_the_checksum(dtype):
    x = np.arange(1, 13).reshape(3, 4).astype(dtype)
    bits = x.reshape(-1).view(np.uint8).copy()
    base = checksum(x)
    for byte in range(bits.size):
        for bit in range(8):
            flipped = bits.copy()
            flipped[byte] ^= 1 << bit
            assert checksum(flipped.view(x.dtype).reshape(x.shape)) != base, (byte, bit)
    # The same values at other positions are another array: the sum is weighted by position.
    assert checksum(x[::-1].copy()) != base and checksum(x.T.copy()) != checksum(x.reshape(4, 3))


def test_the_checksum_is_the_same_however_the_array_is_laid_out():
    x = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
    mesh = jax.make_mesh((4, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    for spec in (P("a", "b"), P("b", None), P()):
        assert checksum(jax.device_put(x, NamedSharding(mesh, spec))) == checksum(x), spec


def tiny_checkpoint(directory):
    tree = {"params": {"w": np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64),
                       "b": np.ones(64, np.float32)}, "step": np.array(7, np.int32)}
    checkpointer = Checkpointer(directory)
    checkpointer.save(1, tree, {"step": 1})
    checkpointer.close()
    return tree


def test_a_flipped_byte_is_refused_naming_the_step_and_the_array(tmp_path):
    """Before: the flipped bytes restored without a word, as different numbers."""
    directory = str(tmp_path / "checkpoints")
    tree = tiny_checkpoint(directory)
    data = [f for f in glob.glob(os.path.join(directory, "1", "state", "ocdbt.process_0", "d", "*"))]
    biggest = max(data, key=os.path.getsize)  # w's 16 kB
    with open(biggest, "r+b") as f:
        f.seek(os.path.getsize(biggest) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    checkpointer = Checkpointer(directory)
    with pytest.raises(CheckpointDamaged, match=r"^checkpoint of step 1 in .*checkpoints is damaged: array params/w "
                                                r"does not match the checksum saved with it") as raised:
        checkpointer.restore(1, tree)
    assert (raised.value.step, raised.value.array) == (1, "params/w") and "\n" not in str(raised.value)


def test_a_checkpoint_saved_before_checksums_restores_unverified_saying_so_once(tmp_path, caplog):
    directory = str(tmp_path / "checkpoints")
    tree = tiny_checkpoint(directory)
    shutil.rmtree(os.path.join(directory, "1", CHECKSUMS))  # as a jaxgrpo before checksums saved it
    checkpointer = Checkpointer(directory)
    with caplog.at_level(logging.WARNING, logger="jaxgrpo.run.checkpoint"):
        for _ in range(2):
            state, meta = checkpointer.restore(1, tree)
            jax.tree.map(np.testing.assert_array_equal, tree, state)
    said = [r.getMessage() for r in caplog.records if "no checksums" in r.getMessage()]
    assert len(said) == 1 and "restored without verifying" in said[0], said


def test_a_checkpoint_restores_into_another_dtype_after_its_check(tmp_path):
    """An evaluation in bfloat16 reads a float32 run: the arrays are checked as saved, then cast."""
    directory = str(tmp_path / "checkpoints")
    tree = tiny_checkpoint(directory)
    like = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.dtype == np.float32 else x, tree)
    state, _ = Checkpointer(directory).restore(1, like)
    assert state["params"]["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(state["params"]["w"], like["params"]["w"])
