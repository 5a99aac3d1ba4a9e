"""Checkpoints with orbax: training state (params, optimizer, RNG) plus JSON metadata.

Orbax writes each step into a temporary directory and renames it when complete,
so a crash during a save leaves the previous checkpoint as the latest loadable
one; the temporary directory it leaves behind is removed when the next run opens
the checkpoints. In multi-host runs every process calls `save` and `restore`
(each writes its own shards).
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or restored; the message (one line) says why and what to do."""


class Checkpointer:
    """Saves and restores `(state pytree, metadata dict)` at integer steps, keeping the newest few."""

    def __init__(self, directory: str, *, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoints, got {keep}")
        # Remote paths (gs://...) go to orbax as they are: every host of a pod must see the same storage.
        self.directory = directory if "://" in directory else os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False,
                                                 cleanup_tmp_directories=True),
        )

    def save(self, step: int, state: Any, metadata: dict) -> None:
        """Writes a checkpoint for `step` and waits until it is complete on disk.

        Raises `CheckpointError` when orbax does not save (it skips a step at or below its latest
        one) and when the storage fails (disk full, read-only): the earlier checkpoints stay intact.
        """
        try:
            saved = self._manager.save(
                step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata))
            )
            self._manager.wait_until_finished()
        except Exception as e:
            reason = storage_failure(e)
            if reason is None:
                raise
            raise CheckpointError(
                f"could not save the checkpoint of step {step} in {self.directory}: {reason}; the earlier "
                "checkpoints are intact: free space (or fix permissions), then rerun with --resume"
            ) from e
        if not saved:
            raise CheckpointError(
                f"orbax did not save step {step} in {self.directory}: it already holds step {self.latest_step()}; "
                "a run must not write over another run's checkpoints (use --resume, --overwrite or another --run-dir)"
            )

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

    def restore_newest(self, like: Any) -> tuple[int, Any, dict, list[tuple[int, str]]] | None:
        """The newest checkpoint that restores: `(step, state, metadata, skipped)`, or None without checkpoints.

        A checkpoint that fails to restore (a data file truncated or deleted, its metadata gone) is
        skipped for the one before it; `skipped` lists `(step, reason)` of those. They are moved out of the
        way, into `damaged_directory` (deleted only on remote storage, which has no rename), so the resumed
        run can save those steps again. Raises `CheckpointError` when none restores.
        In a multi-host run the processes agree on each attempt (a step counts only if it restored everywhere).
        """
        steps = sorted(self.all_steps(), reverse=True)
        skipped: list[tuple[int, str]] = []
        for step in steps:
            try:
                state, meta = self.restore(step, like)
                reason = ""
            except Exception as e:  # orbax and tensorstore raise many kinds for a damaged checkpoint
                reason = _first_line(e)
            if _on_every_process(not reason):
                if skipped:
                    self._set_aside([bad for bad, _ in skipped])
                return step, state, meta, skipped
            skipped.append((step, reason or "failed on another process"))
        if skipped:
            listed = "; ".join(f"step {s}: {r}" for s, r in skipped)
            raise CheckpointError(
                f"no checkpoint in {self.directory} restores ({listed}); start over with --overwrite, or "
                "restore the directory from a backup"
            )
        return None

    @property
    def damaged_directory(self) -> str:
        """Where checkpoints that do not restore are moved: beside the checkpoints, never read by orbax."""
        return self.directory.rstrip("/") + "_damaged"

    def _set_aside(self, steps: list[int]) -> None:
        """Moves the checkpoints of `steps` into `damaged_directory` (process 0; the others wait for it)."""
        if "://" in self.directory:  # remote storage has no rename
            for step in steps:
                self._manager.delete(step)
            return
        if jax.process_index() == 0:
            os.makedirs(self.damaged_directory, exist_ok=True)
            for step in steps:
                source = os.path.join(self.directory, str(step))
                target = os.path.join(self.damaged_directory, str(step))
                suffix = 1
                while os.path.exists(target):  # an earlier resume set the same step aside
                    target = os.path.join(self.damaged_directory, f"{step}.{suffix}")
                    suffix += 1
                os.replace(source, target)
        _on_every_process(True)
        self._manager.reload()

    def close(self) -> None:
        self._manager.close()


def _on_every_process(flag: bool) -> bool:
    """True when `flag` holds on every process (a multi-host run's agreement)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).min())


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()
    line = f"{type(error).__name__}: {text[0] if text else ''}"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def storage_failure(error: BaseException) -> str | None:
    """'reason' when `error` (or one it was raised from) is the storage failing, else None.

    Python raises OSError; tensorstore, which writes the arrays, raises ValueError naming the OS
    error code (`... No space left on device [os_error_code='28']`).
    """
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return f"{error.strerror or os.strerror(error.errno)} ({error.filename or 'errno ' + str(error.errno)})"
        match = re.search(r"os_error_code='(\d+)'", str(error))
        if match:
            code = int(match.group(1))
            return f"{os.strerror(code)} (errno {errno.errorcode.get(code, code)})"
        error = error.__cause__ or error.__context__
    return None


