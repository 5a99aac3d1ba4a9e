"""Trainer updates run twice from one state, for tests that compare two ways of running them."""

import jax
import numpy as np


def host_params(*states):
    """The parameters of train states, copied to the host."""
    return [jax.tree.map(np.asarray, state.params) for state in states]


def on_device(trainer, state):
    """A host copy of a train state laid out on the trainer's mesh again (a fresh input for the donating update)."""
    return jax.tree.map(lambda x, s: jax.device_put(x, s), state, trainer.state_sharding)


def packed_and_padded(trainer, start, batch):
    """`trainer.update` of `batch` from the host train state `start`, scored as packed trees, then as padded rows
    (`trainer.cfg.packing` true, then false, then as it was): ((state, metrics), (state, metrics))."""
    cfg, was = trainer.cfg, trainer.cfg.packing
    try:
        cfg.packing = True
        packed = trainer.update(on_device(trainer, start), batch)
        cfg.packing = False
        padded = trainer.update(on_device(trainer, start), batch)
    finally:
        cfg.packing = was
    return packed, padded
