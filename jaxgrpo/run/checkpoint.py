"""Checkpoints with orbax: training state (params, optimizer, RNG) plus JSON metadata, verified on restore.

Orbax writes each step into a temporary directory and renames it when complete,
so a crash during a save leaves the previous checkpoint as the latest loadable
one; the temporary directory it leaves behind is removed when the next run opens
the checkpoints. In multi-host runs every process calls `save` and `restore`
(each writes its own shards).

Orbax does not check the bytes it reads back: its data files carry no checksum (tensorstore's crc32c
covers only the shard index), so a flipped bit restores as a wrong number, a NaN after a few steps.
Each checkpoint therefore holds a checksum of every array (`array_checksums`, in the step's
`checksums` item, written in the same atomic save), and `restore` recomputes them and refuses a
checkpoint whose arrays do not match (`CheckpointDamaged`, naming the step and the array). Checkpoints
saved before checksums restore unverified, saying so once.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgrpo.errors import UserError

logger = logging.getLogger(__name__)

#: The checkpoint item (beside `state` and `meta`) holding each array's checksum (`array_checksums`).
CHECKSUMS = "checksums"
#: The manifest's format: the hash below; a checkpoint with another format is not verified.
CHECKSUM_FORMAT = "jaxgrpo-array-checksums/murmur3-sum-2x32"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint could not be saved or restored; the message (one line) says why and what to do."""


class CheckpointDamaged(CheckpointError):
    """A checkpoint's bytes changed on disk: an array does not match the checksum saved with it (`array` names
    it), or a checksummed checkpoint's array data no longer decodes (`array` is "")."""

    def __init__(self, message: str, step: int, array: str):
        super().__init__(message)
        self.step, self.array = step, array


def array_name(path) -> str:
    """'train/params/decoder/embed/value': an array's path in a checkpoint tree, as errors and manifests name it."""
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _mix(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finalizer: a bijection of uint32 in which every input bit moves every output bit."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
    """The bits of `x` as uint32 (one word per element; two for 8-byte types, in a trailing axis)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}.get(x.dtype.itemsize)
    if unsigned is None or jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"cannot checksum an array of dtype {x.dtype}")
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _leaf_checksum(x: jax.Array) -> jax.Array:
    """uint32[2]: sum_i mix(word_i ^ mix(i ^ seed)) mod 2^32 for two seeds, i the word's row-major position.

    Each term is a bijection of its word, so a change to any one element changes both sums; other damage
    leaves them unchanged with probability about 2^-64. The sum is the same whatever the array's sharding
    (integer addition is exact), so it is computed on the devices that hold the array, without gathering it.
    """
    words = _words(x)
    index = jnp.zeros(words.shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(words.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(stride % 2**32)
        stride *= words.shape[axis]
    return jnp.stack([jnp.sum(_mix(words ^ _mix(index ^ jnp.uint32(seed))), dtype=jnp.uint32)
                      for seed in (0, 0x9E3779B9)])


@functools.lru_cache(maxsize=None)
def _checksum_fn(out_sharding):
    return jax.jit(lambda leaves: [_leaf_checksum(x) for x in leaves], out_shardings=out_sharding)


def array_checksums(tree: Any) -> dict[str, dict]:
    """{array name: {"dtype", "shape", "checksum"}} for every array of `tree` (`_leaf_checksum`, as 16 hex digits).

    Computed where the arrays live; in a multi-host run every process calls it (one SPMD program) and gets the
    same numbers.
    """
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {array_name(path): {"dtype": str(np.dtype(x.dtype)), "shape": list(np.shape(x)), "checksum": checksum}
            for (path, x), checksum in zip(leaves, _checksums([x for _, x in leaves]))}


def _checksums(leaves: list) -> list[str]:
    """`_leaf_checksum` of each array as 16 hex digits, fetched to the host: one program per set of devices
    holding arrays (a restored tree may have a mesh's arrays beside one device's), its sums replicated."""
    groups: dict = {}
    for i, x in enumerate(leaves):
        devices = tuple(sorted(d.id for d in x.sharding.device_set)) if isinstance(x, jax.Array) else ()
        groups.setdefault(devices, []).append(i)
    sums = [None] * len(leaves)
    for members in groups.values():
        arrays = [leaves[i] for i in members]
        meshes = [x.sharding.mesh for x in arrays if isinstance(getattr(x, "sharding", None), NamedSharding)]
        out_sharding = NamedSharding(meshes[0], P()) if meshes else None
        for i, total in zip(members, jax.device_get(_checksum_fn(out_sharding)(arrays))):
            sums[i] = "".join(f"{int(v):08x}" for v in total)
    return sums


class Checkpointer:
    """Saves and restores `(state pytree, metadata dict)` at integer steps, keeping the newest few."""

    def __init__(self, directory: str, *, keep: int = 3, read_only: bool = False):
        """`read_only`: only restore, writing nothing (not even orbax's clean-up of temporary directories),
        for reading a run another process may still be writing (`jaxgrpo-eval`, `jaxgrpo-export`)."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoints, got {keep}")
        # Remote paths (gs://...) go to orbax as they are: every host of a pod must see the same storage.
        self.directory = directory if "://" in directory else os.path.abspath(directory)
        options = (ocp.CheckpointManagerOptions(create=False, read_only=True, enable_async_checkpointing=False,
                                                cleanup_tmp_directories=False) if read_only else
                   ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False,
                                                cleanup_tmp_directories=True))
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._said_unverified = False  # an old checkpoint without checksums is reported once

    def save(self, step: int, state: Any, metadata: dict) -> None:
        """Writes a checkpoint for `step`, with a checksum of each array, and waits until it is complete on disk.

        Raises `CheckpointError` when orbax does not save (it skips a step at or below its latest
        one) and when the storage fails (disk full, read-only): the earlier checkpoints stay intact.
        """
        manifest = {"format": CHECKSUM_FORMAT, "arrays": array_checksums(state)}
        try:
            saved = self._manager.save(
                step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata),
                                              **{CHECKSUMS: ocp.args.JsonSave(manifest)})
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
        """Restores `(state, metadata)` at `step` (default: latest) with `like`'s structure, dtypes and shardings.

        Every array is checked against the checksum saved with it; raises `CheckpointDamaged` (one line naming
        the step and the first array that differs) when one does not match. The arrays are read in the dtype
        they were saved in, checked, then cast to `like`'s (an evaluation in another dtype reads a run's
        float32 checkpoint). A checkpoint saved before checksums is restored unverified (said once).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint to resume from in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        manifest = self._manifest(step)
        if manifest is not None:
            saved = manifest["arrays"]
            abstract = jax.tree_util.tree_map_with_path(
                lambda path, a: jax.ShapeDtypeStruct(a.shape, np.dtype(saved[array_name(path)]["dtype"]),
                                                     sharding=a.sharding)
                if isinstance(a, jax.ShapeDtypeStruct) and array_name(path) in saved else a,
                abstract)
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
            )
        except Exception as error:  # orbax and tensorstore raise many kinds for unreadable array data
            if manifest is None or not _saved_as(abstract, manifest["arrays"]):
                raise
            # The checkpoint holds every array asked for, as saved: its data files, not the request, are at fault
            # (a flipped byte inside compressed data fails to decode rather than reading back wrong numbers).
            raise CheckpointDamaged(f"checkpoint of step {step} in {self.directory} is damaged: its array data "
                                    f"could not be read ({_first_line(error, 200)})", step, "") from error
        state = restored["state"]
        if manifest is None:
            if not self._said_unverified and jax.process_index() == 0:
                logger.warning("checkpoint of step %d in %s has no checksums (saved by a jaxgrpo before they were "
                               "written): restored without verifying its arrays; checkpoints saved from now on are "
                               "verified", step, self.directory)
            self._said_unverified = True
            return state, restored["meta"]
        leaves, treedef = jax.tree.flatten(state)
        # Named by `like`'s paths (orbax may hand NamedTuples back as plain tuples), in the same order.
        names = [array_name(path) for path, _ in jax.tree_util.tree_leaves_with_path(abstract)]
        self._verify(step, names, leaves, manifest["arrays"])
        wanted = [np.dtype(x.dtype) for x in jax.tree.leaves(like)]
        state = jax.tree.unflatten(treedef, [x if x.dtype == d else x.astype(d) for x, d in zip(leaves, wanted, strict=True)])
        return state, restored["meta"]

    def _manifest(self, step: int) -> dict | None:
        """The checksums saved with `step`, or None for a checkpoint saved without them (or in another format)."""
        from etils import epath

        if not (epath.Path(self.directory) / str(step) / CHECKSUMS).exists():
            return None
        manifest = self._manager.restore(step, args=ocp.args.Composite(**{CHECKSUMS: ocp.args.JsonRestore()}))
        manifest = manifest[CHECKSUMS]
        return manifest if manifest.get("format") == CHECKSUM_FORMAT else None

    def _verify(self, step: int, names: list[str], leaves: list, saved: dict) -> None:
        """Raises `CheckpointDamaged` unless each array `leaves[i]` has the checksum `saved` holds for `names[i]`."""
        bad = [name for name, checksum in zip(names, _checksums(leaves), strict=True)
               if saved.get(name, {}).get("checksum") != checksum]
        if bad:
            name = bad[0]
            why = ("has no checksum in the checkpoint (saved with another structure)" if name not in saved else
                   "does not match the checksum saved with it (its bytes changed on disk)")
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise CheckpointDamaged(f"checkpoint of step {step} in {self.directory} is damaged: array {name}{more} "
                                    f"{why}", step, name)

    def restore_newest(self, like: Any) -> tuple[int, Any, dict, list[tuple[int, str]]] | None:
        """The newest checkpoint that restores: `(step, state, metadata, skipped)`, or None without checkpoints.

        A checkpoint that fails to restore (a data file truncated or deleted, its metadata gone, an array
        that does not match its checksum) is skipped for the one before it; `skipped` lists `(step, reason)`
        of those. They are moved out of the way, into `damaged_directory` (deleted only on remote storage,
        which has no rename), so the resumed run can save those steps again. Raises `CheckpointError` when none restores.
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


def _saved_as(abstract: Any, saved: dict) -> bool:
    """Whether the checksum manifest `saved` names every array of `abstract` with its shape."""
    return all(isinstance(leaf, jax.ShapeDtypeStruct) and array_name(path) in saved
               and list(saved[array_name(path)].get("shape", leaf.shape)) == list(leaf.shape)
               for path, leaf in jax.tree_util.tree_leaves_with_path(abstract))


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


