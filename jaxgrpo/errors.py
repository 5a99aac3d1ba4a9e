"""The errors a user can cause, as opposed to bugs: what the console scripts report in one line.

Every mistake in what a user gives (an experiment file, `--set` values, names of a model, task or
reward, a data directory, a run directory, a study) raises an exception of this family, whose message is
one line naming the problem and the fix. `jaxgrpo.tools.cli` prints it as `jaxgrpo-<tool>: error: <message>` and
exits with status 1 (2 for a bad command line or config, found before anything is built); an exception of
any other type is a bug and keeps its traceback.

The family is `UserError`: its subclasses below, and the one-line errors other modules define for their own
inputs, each a `UserError` too (`jaxgrpo.config.ExperimentError`, `jaxgrpo.run.rundir.RunDirectoryError`,
`jaxgrpo.run.checkpoint.CheckpointError`, `jaxgrpo.train.health.NoLearningSignal` and `NonFiniteUpdates`,
`jaxgrpo.evaluation.runs.RunReadError`, `jaxgrpo.tools.export.ExportError`, `jaxgrpo.evaluation.policy_eval.EvalSetupError`,
`jaxgrpo.evaluation.study.StudyError`, and the model loader's `UnsupportedConfigError` and `WeightFileError`), so this
module, at the bottom of the package, imports none of them. An `OSError` naming a file (a disk full, a
directory not writable, a path that does not exist) is the user's too: `os_error_message` says which.
"""

from __future__ import annotations

import errno
import os
import re


class UserError(Exception):
    """Base of the errors of this module: what the user gave cannot be used; the message is one line."""


class ConfigError(UserError, ValueError):
    """A config value, or what it names (a model, a task, a reward, a device layout), cannot be used."""


class DataError(UserError, ValueError):
    """A task's data cannot be used: a file is malformed or empty; the message names the file and the line."""


class MissingDataError(DataError, FileNotFoundError):
    """A task's data directory, or a file it must hold, does not exist."""


class OutOfDeviceMemory(UserError, RuntimeError):
    """A program (the update, the sampler, the scoring forward) needs more device memory than the device has:
    XLA's RESOURCE_EXHAUSTED, while compiling it or running it. The message names the program, what XLA could
    not allocate and the device's memory where known, and the config fields that shrink it
    (`jaxgrpo.train.device_memory`); the XLA error is chained as its cause."""


def is_resource_exhausted(error: BaseException) -> bool:
    """Whether an exception is XLA's out-of-memory status (jax's `JaxRuntimeError` / `XlaRuntimeError` with
    RESOURCE_EXHAUSTED, from compiling or running a program), and not already reported as one."""
    return not isinstance(error, OutOfDeviceMemory) and "RESOURCE_EXHAUSTED" in str(error)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)i?B?\b"
#: Where XLA's out-of-memory messages state the bytes a program needs, most specific first: GPU and CPU allocators
#: ("Out of memory while trying to allocate 63963136000 bytes", "allocating 4398046511104 bytes", "Failed to
#: allocate 59.57GiB"), the TPU compiler ("Used 33.05G of 15.75G hbm", "HLO temporaries (33.05G) exceeds").
_NEEDS = (r"allocat\w*\s+([0-9]+)\s*(b)ytes", r"allocat[^(]*\(([0-9]+)([bB])\)",
          r"allocat\w*\s+(?:request\s+(?:for\s+)?)?" + _SIZE, r"Used\s+" + _SIZE + r"\s+of",
          r"\(" + _SIZE + r"\)\s+exceeds", r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT])i?B\b")


def requested_bytes(message: str) -> int | None:
    """The bytes an XLA RESOURCE_EXHAUSTED message says were needed (the allocation that failed, or the
    program's total on a TPU), or None where it states none."""
    for pattern in _NEEDS:
        found = re.search(pattern, message)
        if found:
            number, unit = found.group(1), found.group(2)
            return int(float(number) * _UNITS[unit.upper() if unit.lower() != "b" else ""])
    return None


def device_memory_bytes(device) -> int | None:
    """The memory an accelerator offers a program (`memory_stats()["bytes_limit"]`); None where the platform does
    not say (a CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # a platform without memory statistics
        return None
    limit = (stats or {}).get("bytes_limit")
    return int(limit) if limit else None


#: OSError numbers that say something about a path the user chose, not about the program.
_PATH_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC,
                errno.EDQUOT, errno.EEXIST, errno.ENAMETOOLONG, errno.ENOTEMPTY}


def os_error_message(error: OSError) -> str | None:
    """One line for an OSError about a path the user gave (what, where, what to do); None for any other."""
    if error.errno not in _PATH_ERRNOS or not error.filename:
        return None
    where = os.fspath(error.filename)
    fixes = {errno.ENOSPC: "free space on that disk, then rerun", errno.EDQUOT: "free space on that disk, then rerun",
             errno.EACCES: "make it writable or pick another path", errno.EPERM: "make it writable or pick another path",
             errno.EROFS: "pick a path on a writable file system",
             errno.EEXIST: "a file of that name is in the way: remove it or pick another path",
             errno.ENOTDIR: "a part of the path is a file, not a directory: pick another path"}
    fix = fixes.get(error.errno, "check the path")
    return f"{where}: {error.strerror or error}; {fix}"


def one_line(error: BaseException) -> str:
    """An exception's message on one line (a KeyError's without its quotes)."""
    message = error.args[0] if isinstance(error, KeyError) and error.args else error
    return " ".join(str(message).split()) or type(error).__name__
