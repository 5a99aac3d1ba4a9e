"""The run directory's guard: one writer at a time, no silent overwrite, resume only with a compatible config.

`RunDirectory.open` is called at the start of `Trainer.run` and holds for the run's life:

* a lock: `fcntl.flock` on `run.lock` (holding the pid and host of the run). A second run into the
  same directory fails at once, naming the holder. The kernel drops a flock when its process dies
  (SIGKILL included), so a lock left by a killed run is taken over, not obeyed;
* a fresh run (no `resume`) into a directory that holds anything but the lock is refused, unless
  `overwrite`, which deletes the directory's contents first, and only when every entry is one a run
  writes (`is_run_entry`: config.json, metrics.jsonl, checkpoints/, ...): a directory holding anything
  else (a user's `thesis.tex`, a folder of their own) is refused whole, naming those entries, and nothing
  in it is deleted. Refusing is safer than deleting the run's files and keeping the rest: a directory
  mixing both is more likely a user's folder with a stray run in it than a run with a stray file;
* `resume` compares the saved `config.json` with the new config and refuses changes other than
  `RESUMABLE_KEYS`, naming each changed key with its old and new value;
* `config.json` is written by `write_config` once the run can start (after these checks and the
  checkpoint restore), so a refused or failed resume leaves the config the checkpoints were
  trained with in place.

In a multi-host run process 0 takes the lock and checks the directory (which every host shares, as
orbax needs); its verdict reaches every process, so all of them fail with the same message.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import shutil
import socket
from typing import Any

import jax
import numpy as np

from jaxgrpo.config import Config
from jaxgrpo.errors import UserError

LOCK_FILE = "run.lock"
CONFIG_FILE = "config.json"
#: What a run (`jaxgrpo-train`, and `jaxgrpo-eval` into its directory) writes there: the only entries
#: `--overwrite` deletes. `eval_*` are `jaxgrpo-eval`'s completions and summaries of a checkpoint.
RUN_ENTRIES = frozenset({CONFIG_FILE, CONFIG_FILE + ".tmp", LOCK_FILE, "metrics.jsonl", "eval.jsonl", "checkpoints",
                         "checkpoints_damaged", "tensorboard", "plots", "profile"})

#: Config keys `--resume` may change: how long to train and what to evaluate, log and keep. Any other
#: change (group size, seed, learning rate, ...) would silently continue a different experiment.
RESUMABLE_KEYS = frozenset({
    "steps", "eval_every", "eval_pass_k", "task.num_eval_examples", "checkpoint_every", "keep_checkpoints",
    "log_every", "run_dir", "max_steps_without_signal", "collapse_entropy", "collapse_window", "max_nonfinite_steps",
})


class RunDirectoryError(UserError, RuntimeError):
    """The run directory cannot be used as asked; the message (one line) says why and what to do."""


def flatten(config: dict) -> dict[str, Any]:
    """{'task.name': value, ...} for a config dict: sections (task, sampling, ...) are opened, dict-valued
    fields (loss_kwargs, rewards, ...) are kept whole, as the user writes them."""
    sections = {f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.default_factory)}
    flat = {}
    for key, value in config.items():
        if key in sections and isinstance(value, dict):
            flat.update({f"{key}.{name}": item for name, item in value.items()})
        else:
            flat[key] = value
    return flat


def config_changes(saved: dict, new: dict, defaults: dict | None = None, *,
                   ignore: frozenset[str] = RESUMABLE_KEYS) -> list[str]:
    """'key old -> new' for each key whose value differs between two config dicts, except `ignore`
    (by default `RESUMABLE_KEYS`).

    A key the saved config lacks (a field added since) counts as changed only when the new value is not
    the field's default from `defaults`, the behaviour the saved run had.
    """
    saved, new = flatten(_normalized(saved)), flatten(_normalized(new))
    defaults = flatten(_normalized(defaults)) if defaults is not None else {}
    changes = []
    for key in sorted(set(saved) | set(new)):
        if key in ignore:
            continue
        if key not in saved:
            if key in defaults and new[key] == defaults[key]:
                continue
            changes.append(f"{key} (absent) -> {new[key]!r}")
        elif key not in new:
            continue  # a field removed since: nothing the new run can honour or violate
        elif saved[key] != new[key]:
            changes.append(f"{key} {saved[key]!r} -> {new[key]!r}")
    return changes


def _normalized(config: dict) -> dict:
    # Through JSON, as config.json holds it: tuples become lists, keys strings.
    return json.loads(json.dumps(config, default=repr))


class RunDirectory:
    """A run directory held by this run (see the module docstring); use `open`, then `close` (or `with`)."""

    def __init__(self, path: str, lock_fd: int | None, is_writer: bool):
        self.path = path
        self._lock_fd = lock_fd
        self.is_writer = is_writer

    @staticmethod
    def preflight(path: str, config: dict, *, resume: bool = False, overwrite: bool = False,
                  defaults: dict | None = None) -> None:
        """The checks of `open` that change nothing, for a caller to run before anything heavy (building the
        model): contradicting flags, a directory another run holds (its lock taken and let go at once), a
        used directory without `resume` or `overwrite`, a changed config on `resume`, files no run wrote under
        `overwrite` (nothing is deleted here). `open` checks again."""
        if resume and overwrite:
            raise RunDirectoryError("--resume and --overwrite contradict each other: pick one")
        message = ""
        if jax.process_index() == 0 and os.path.exists(path) and not os.path.isdir(path):
            message = _not_a_directory(path)
        elif jax.process_index() == 0 and os.path.isdir(path):
            try:
                os.close(_lock(path))
                _check(path, config, resume=resume, overwrite=overwrite, defaults=defaults, delete=False)
            except RunDirectoryError as e:
                message = str(e)
            except OSError as e:
                message = storage_error_message(path, e)
        message = _from_process_0(message)
        if message:
            raise RunDirectoryError(message)

    @classmethod
    def open(cls, path: str, config: dict, *, resume: bool = False, overwrite: bool = False,
             defaults: dict | None = None) -> "RunDirectory":
        """Locks `path` and checks it for a fresh run, `overwrite` or `resume`; raises `RunDirectoryError`."""
        if resume and overwrite:
            raise RunDirectoryError("--resume and --overwrite contradict each other: pick one")
        is_writer = jax.process_index() == 0
        lock_fd, message = None, ""
        if is_writer:
            try:
                lock_fd = _lock(path)
                _check(path, config, resume=resume, overwrite=overwrite, defaults=defaults)
            except RunDirectoryError as e:
                message = str(e)
            except OSError as e:
                message = storage_error_message(path, e)
            if message and lock_fd is not None:
                os.close(lock_fd)
                lock_fd = None
        message = _from_process_0(message)
        if message:
            raise RunDirectoryError(message)
        return cls(path, lock_fd, is_writer)

    def write_config(self, config: dict) -> None:
        """Writes config.json (process 0), replacing it atomically: a crash leaves the old or the new one."""
        if not self.is_writer:
            return
        target = os.path.join(self.path, CONFIG_FILE)
        with open(target + ".tmp", "w") as f:
            json.dump(config, f, indent=2, default=repr)  # repr: a Python-API config may hold any object
        os.replace(target + ".tmp", target)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> "RunDirectory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _not_a_directory(path: str) -> str:
    return f"run directory {path} exists and is not a directory; pick another --run-dir"


def _lock(path: str) -> int:
    """Creates `path` and takes its lock; returns the lock file's descriptor (the lock lives as long as it)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunDirectoryError(_not_a_directory(path))
    os.makedirs(path, exist_ok=True)
    lock_path = os.path.join(path, LOCK_FILE)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunDirectoryError(
            f"run directory {path} is in use by {holder} (lock {lock_path}); wait for that run to end, "
            "or train into another --run-dir"
        ) from None
    # A lock file left by a dead run still names it: the flock, not the file, says who holds the directory.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
    return fd


def _entries(path: str) -> list[str]:
    return sorted(e for e in os.listdir(path) if e not in (LOCK_FILE, CONFIG_FILE + ".tmp"))


def is_run_entry(name: str) -> bool:
    """Whether `name`, an entry of a run directory, is one a run writes (`RUN_ENTRIES`, `eval_*.jsonl` and
    their `.summary.json`): what `--overwrite` may delete."""
    return name in RUN_ENTRIES or (name.startswith("eval_") and name.endswith((".jsonl", ".summary.json")))


def _check(path: str, config: dict, *, resume: bool, overwrite: bool, defaults: dict | None,
           delete: bool = True) -> None:
    entries = _entries(path)
    if overwrite:
        foreign = [e for e in entries if not is_run_entry(e)]
        if foreign:
            shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
            raise RunDirectoryError(
                f"--overwrite deletes only a run directory's own files, and {path} holds {len(foreign)} "
                f"{'entry' if len(foreign) == 1 else 'entries'} no run wrote ({shown}); nothing was deleted: move "
                "those elsewhere, or pick another --run-dir"
            )
        if not delete:
            return
        for entry in entries:
            full = os.path.join(path, entry)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.remove(full)
        return
    if not resume:
        if entries:
            shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
            raise RunDirectoryError(
                f"run directory {path} already holds a run ({shown}): pass --resume to continue it, "
                "--overwrite to delete it and start over, or another --run-dir"
            )
        return
    saved_path = os.path.join(path, CONFIG_FILE)
    if not os.path.exists(saved_path):
        return  # nothing to compare with (a run started by an older version, or an empty directory)
    try:
        with open(saved_path) as f:
            saved = json.load(f)
    except json.JSONDecodeError as e:
        raise RunDirectoryError(f"cannot check the config to resume: {saved_path} is not valid JSON ({e}); "
                                "restore it, or start over with --overwrite") from None
    changes = config_changes(saved, config, defaults)
    if changes:
        raise RunDirectoryError(
            f"--resume with a config that differs from the one the checkpoints in {path} were trained with: "
            f"{'; '.join(changes)}. Drop those changes to resume (only {', '.join(sorted(RESUMABLE_KEYS))} "
            "may change), or start a new run with another --run-dir"
        )


def storage_error_message(path: str, error: OSError) -> str:
    """One line for an OSError in the run directory: what failed, where, and what to do."""
    where = error.filename or path
    reason = error.strerror or str(error)
    if error.errno == errno.ENOSPC:
        fix = "free space on that disk, then rerun with --resume"
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable (or pick another --run-dir), then rerun"
    else:
        fix = "fix the storage, then rerun (with --resume to continue from the last checkpoint)"
    return f"cannot write the run directory {path}: {reason} ({where}); {fix}"


def _from_process_0(message: str) -> str:
    """Process 0's message (empty: no error) on every process of a multi-host run."""
    if jax.process_count() == 1:
        return message
    from jax.experimental import multihost_utils

    data = np.zeros(4096, np.uint8)
    encoded = message.encode()[: data.size]
    data[: len(encoded)] = np.frombuffer(encoded, np.uint8)
    data = np.asarray(multihost_utils.broadcast_one_to_all(data))
    return bytes(data).rstrip(b"\0").decode(errors="replace")
