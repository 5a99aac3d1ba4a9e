"""Logical axis rules: how the decoder's named parameter axes map onto a `data`/`fsdp`/`model` mesh.

Every parameter carries `logical_axes` metadata (`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`,
`mlp`, `layers`, `norm`). A rule set maps each logical name to mesh axes (a name, a tuple of names,
or None for replicated). Two conventions keep one rule set usable on any mesh:

* mesh axes the mesh does not have are dropped (`("data", "fsdp")` on a `data`/`model` mesh
  shards over `data` only);
* a dimension that the product of its mesh axes does not divide drops axes from the end until it
  does (SmolLM2's 3 key/value heads stay replicated on a 4-way `model` axis).

`DEFAULT_RULES` is FSDP (ZeRO-3 style: `embed`, and for the small norm and bias arrays `norm` /
`head_dim`, over the `data` and `fsdp` axes) combined with Megatron-style tensor parallelism (heads,
MLP and vocabulary over `model`). `FSDP_RULES` shards only over `data`/`fsdp`. A mesh axis is used
at most once per array, so `head_dim` of a projection stays whole once `embed` took `data`/`fsdp`.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

DEFAULT_RULES: Rules = (
    ("vocab", "model"),
    ("embed", ("data", "fsdp")),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("mlp", "model"),
    ("head_dim", ("data", "fsdp")),
    ("layers", None),
    ("norm", ("data", "fsdp")),
)

FSDP_RULES: Rules = (
    ("vocab", None),
    ("embed", ("data", "fsdp")),
    ("heads", None),
    ("kv_heads", None),
    ("mlp", None),
    ("head_dim", ("data", "fsdp")),
    ("layers", None),
    ("norm", ("data", "fsdp")),
)


def logical_to_mesh_spec(logical_axes: Sequence[str], shape: Sequence[int], mesh: Mesh, rules: Rules = DEFAULT_RULES) -> PartitionSpec:
    """The `PartitionSpec` of an array with these logical axes and shape on `mesh` (see module docstring)."""
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match the array's rank {len(shape)}")
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, size in zip(logical_axes, shape):
        if name not in table:
            raise KeyError(f"no partitioning rule for logical axis {name!r}; rules cover {sorted(table)}")
        target = table[name]
        axes = [target] if isinstance(target, str) else list(target or ())
        axes = [a for a in axes if a in mesh.shape and a not in used]
        while axes and size % math.prod(mesh.shape[a] for a in axes):
            axes.pop()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*spec)


def model_shardings(model: nnx.Module, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.State:
    """`NamedSharding`s in the structure of `nnx.state(model)`, e.g. for `jax.jit(out_shardings=...)`."""

    def sharding(variable: nnx.Variable) -> NamedSharding:
        axes = variable.get_metadata().get("logical_axes")
        if axes is None:
            return NamedSharding(mesh, PartitionSpec())
        return NamedSharding(mesh, logical_to_mesh_spec(axes, variable[...].shape, mesh, rules))

    return jax.tree.map(sharding, nnx.state(model), is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.Module:
    """Place the model's parameters on `mesh` according to `rules` (in place; returns the model)."""
    state = jax.device_put(nnx.state(model), model_shardings(model, mesh, rules))
    nnx.update(model, state)
    return model


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Shard the leading (batch) axis over the mesh's `data` and `fsdp` axes, replicate the rest."""
    axes = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
    return NamedSharding(mesh, PartitionSpec(axes or None))
