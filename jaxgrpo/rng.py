"""A run's randomness: one JAX key from `Config.seed`, folded once per purpose.

    root = run_key(seed)                        # LoopState.key, saved in every checkpoint
    stream(root, "sample", step)                # the step's rollout (then folded per sampling round)
    stream(root, "evaluate", step)              # the held-out evaluation after `step`
    seed_of(stream(root, "prompts"))            # grain's shuffle of the training prompts
    seed_of(stream(root, "warmup_prompts"))     # grain's shuffle of the supervised warm-up's prompts
    generator(stream(root, "minibatches", step))  # numpy: the step's order of groups over minibatches
    seed_of(stream(root, "adapters"))           # LoRA's adapter initialization

Numpy and grain take integer seeds, drawn here from a purpose's key (`seed_of`, `generator`), so every random
choice a run makes descends from its one seed through this table, and two purposes never share a draw: each is
`fold_in(root, its index in PURPOSES)` (a new purpose goes at the end, leaving the others' draws as they were).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

#: The purposes a run draws for, by index (the value folded into the run's key).
PURPOSES = ("sample", "evaluate", "prompts", "warmup_prompts", "minibatches", "adapters")


def run_key(seed: int) -> jax.Array:
    """The run's key: the root every purpose's key is folded from."""
    return jax.random.key(seed)


def stream(key: jax.Array, purpose: str, *indices: int) -> jax.Array:
    """The key of `purpose` under the run's `key`, folded with each of `indices` in turn (e.g. the step)."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown random purpose {purpose!r}; valid purposes: {', '.join(PURPOSES)} (add a new one "
                         "at the end of jaxgrpo.rng.PURPOSES)")
    key = jax.random.fold_in(key, PURPOSES.index(purpose))
    for index in indices:
        key = jax.random.fold_in(key, index)
    return key


def seed_of(key: jax.Array) -> int:
    """A 31-bit integer seed drawn from `key`, for a library that takes an integer (grain's shuffles)."""
    return int(jax.random.bits(key, dtype=jnp.uint32)) >> 1


def generator(key: jax.Array) -> np.random.Generator:
    """A numpy generator seeded with 128 bits drawn from `key`."""
    return np.random.default_rng(np.asarray(jax.random.bits(key, (4,), jnp.uint32)))
