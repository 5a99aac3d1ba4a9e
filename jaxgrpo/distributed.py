"""Every multi-host helper in one place: which rows a process holds, and how rows move between hosts.

A multi-host run has one process per host (`jax.distributed.initialize()` called first) and
every process runs the same program. Rows of a batch are split over the processes in contiguous
blocks, process p of P holding block p (`process_block`); a global array of rows places each
process's block on its own devices (`process_sharding`). The sampler builds its outputs this way
and the trainer gathers small per-row numbers (`gather_rows`) so every host computes the same
advantages and metrics. In a single process every helper is the identity (or all rows).

This module imports nothing else of jaxgrpo, so the models, the sampler and the trainer can all use it.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

#: Mesh axes the batch is split over (the model axis holds tensor-parallel shards).
BATCH_AXES = ("data", "fsdp")


def batch_axes(mesh: jax.sharding.Mesh) -> tuple[str, ...]:
    """The `BATCH_AXES` that `mesh` has, in that order: the axes a batch's rows split over (data-major)."""
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def batch_shards(mesh: jax.sharding.Mesh | None) -> int:
    """How many shards a batch's rows split into on `mesh`: the product of its batch axes (1 without a mesh)."""
    return 1 if mesh is None else math.prod(mesh.shape[a] for a in batch_axes(mesh))


def round_up(n: int, multiple: int) -> int:
    """The least multiple of `multiple` that is at least `n`."""
    return -(-n // multiple) * multiple


def process_block(num_rows: int) -> slice:
    """This process's contiguous block of `num_rows` rows split evenly over the processes, in process order.

    All rows in a single-process run; block p of P is rows [p * num_rows / P, (p + 1) * num_rows / P).
    """
    count, index = jax.process_count(), jax.process_index()
    if num_rows % count:
        raise ValueError(f"{num_rows} rows cannot be split evenly over {count} processes")
    size = num_rows // count
    return slice(index * size, (index + 1) * size)


def process_sharding(mesh: jax.sharding.Mesh, num_rows: int) -> NamedSharding:
    """A sharding of [num_rows, ...] arrays over the mesh's batch axes under which each process's
    devices hold exactly its `process_block` of the rows (the other dims replicated).

    Tries the rows over (`data`, `fsdp`), then over each axis alone, then replicated (which only a
    single process satisfies); the first that divides `num_rows` and keeps every process's rows in
    its own block wins.
    """
    every = batch_axes(mesh)
    candidates = [every, *((a,) for a in every if len(every) > 1), ()]
    size = num_rows // jax.process_count()
    for axes in candidates:
        if num_rows % math.prod(mesh.shape[a] for a in axes):
            continue
        sharding = NamedSharding(mesh, PartitionSpec(axes or None))
        rows = sharding.devices_indices_map((num_rows,)).items()
        if all(device.process_index * size <= (index[0].start or 0) and (index[0].stop or num_rows) <= (device.process_index + 1) * size
               for device, index in rows):
            return sharding
    raise ValueError(
        f"no split of {num_rows} rows over the mesh's batch axes {every} (shape {dict(mesh.shape)}) gives each of the "
        f"{jax.process_count()} processes its own block of rows; the data/fsdp axes must separate the hosts"
    )


def global_rows(local: np.ndarray, mesh: jax.sharding.Mesh) -> jax.Array:
    """The global array [process_count * n, ...] whose `process_block` on this process is `local` [n, ...]."""
    rows = local.shape[0] * jax.process_count()
    return jax.make_array_from_process_local_data(process_sharding(mesh, rows), local, (rows,) + local.shape[1:])


def local_rows(x: jax.Array, mesh: jax.sharding.Mesh) -> np.ndarray:
    """Numpy copy of this process's `process_block` of a global array's rows (resharded first if needed)."""
    if x.is_fully_addressable:
        return np.asarray(x)[process_block(x.shape[0])]
    x = jax.device_put(x, process_sharding(mesh, x.shape[0]))
    shards = {shard.index[0].start or 0: shard.data for shard in x.addressable_shards}  # replicas share a start
    return np.concatenate([np.asarray(shards[start]) for start in sorted(shards)])


def global_batch(tree, mesh: jax.sharding.Mesh):
    """The global batch from every host's rows (numpy [n, ...], block `process_index` of it).

    A single process already holds the whole batch: its numpy arrays are returned as they are.
    """
    if jax.process_count() == 1:
        return tree
    return jax.tree.map(lambda x: global_rows(x, mesh), tree)


def gather_rows(tree):
    """The whole batch of per-row numpy arrays [N, ...] from every host's block [n, ...], in process order.

    For small per-row arrays (rewards, flags, lengths); a single process's are returned as they are.
    """
    if jax.process_count() == 1:
        return tree
    wire = lambda x: x.astype(np.int32) if x.dtype == bool else x  # noqa: E731  (gathered as int32)
    gathered = multihost_utils.process_allgather(jax.tree.map(wire, tree), tiled=True)
    return jax.tree.map(lambda x, g: np.asarray(g).astype(x.dtype), tree, gathered)


def across_processes(value) -> np.ndarray:
    """A scalar from every process: [process_count] in process order."""
    if jax.process_count() == 1:
        return np.array([value])
    return np.asarray(multihost_utils.process_allgather(np.asarray(value)))


def to_host(tree):
    """Numpy copies of a pytree's arrays, the same global values on every process.

    Arrays that span other processes' devices (the sampler's rows are split over
    every host) are gathered with `process_allgather`; the rest are copied.
    """

    def fetch(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(fetch, tree)


def on_mesh(tree, mesh: jax.sharding.Mesh):
    """Leaves not already laid out on `mesh` are replicated over it."""

    def place(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return x
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))

    return jax.tree.map(place, tree)
