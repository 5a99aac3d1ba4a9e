"""Checkpoints with orbax: training state (params, optimizer, RNG) plus JSON metadata.

Orbax writes each step into a temporary directory and renames it when complete,
so a crash during a save leaves the previous checkpoint as the latest loadable
one. In multi-host runs every process calls `save` and `restore` (each writes
its own shards).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """Saves and restores `(state pytree, metadata dict)` at integer steps, keeping the newest few."""

    def __init__(self, directory: str, *, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoints, got {keep}")
        # Remote paths (gs://...) go to orbax as they are: every host of a pod must see the same storage.
        self.directory = directory if "://" in directory else os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False),
        )

    def save(self, step: int, state: Any, metadata: dict) -> None:
        """Writes a checkpoint for `step` and waits until it is complete on disk."""
        self._manager.save(
            step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata))
        )
        self._manager.wait_until_finished()

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore(self, step: int | None, like: Any) -> tuple[Any, dict]:
        """Restores `(state, metadata)` at `step` (default: latest) with `like`'s structure and shardings."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint to resume from in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
        return restored["state"], restored["meta"]

    def close(self) -> None:
        self._manager.close()
