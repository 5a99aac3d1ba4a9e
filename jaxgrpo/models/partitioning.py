"""Logical axis rules: how the decoder's named parameter axes map onto a `data`/`fsdp`/`model` mesh.

Every parameter carries `logical_axes` metadata (`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`,
`mlp`, `layers`, `norm`; `lora_rank` for LoRA adapters, `jaxgrpo.models.lora`). A rule set maps each
logical name to mesh axes (a name, a tuple of names, or None for replicated). Two conventions keep one
rule set usable on any mesh:

* mesh axes the mesh does not have are dropped (`("data", "fsdp")` on a `data`/`model` mesh
  shards over `data` only);
* a dimension that the product of its mesh axes does not divide drops axes from the end until it
  does (SmolLM2's 3 key/value heads stay replicated on a 4-way `model` axis).

`DEFAULT_RULES` is FSDP (ZeRO-3 style: `embed`, and for the small norm and bias arrays `norm` /
`head_dim`, over the `data` and `fsdp` axes) combined with Megatron-style tensor parallelism (heads,
MLP and vocabulary over `model`). `FSDP_RULES` shards only over `data`/`fsdp`. A mesh axis is used
at most once per array, so `head_dim` of a projection stays whole once `embed` took `data`/`fsdp`.

Activations follow the same rules through `constrain_activation`: their batch dimension goes over
`data`/`fsdp` (`ACTIVATION_BATCH_AXES`), head and MLP-hidden dimensions over whatever the rules give
`heads`/`kv_heads`/`mlp` (the `model` axis), the residual stream's sequence dimension between
layers over `model` too (sequence parallelism), and everything else stays whole. The decoder applies it between and inside its layers whenever a mesh is active, so the
compiled temporaries fall with the device count as the parameters do.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxgrpo.distributed import BATCH_AXES, batch_axes

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
    ("lora_rank", None),  # an adapter's rank is small: each adapter is split along its weight's other axes
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
    ("lora_rank", None),
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


def variable_sharding(variable: nnx.Variable, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """Where `variable` lives on `mesh`, from its logical axes (replicated without them). Its value may be
    abstract (a `jax.ShapeDtypeStruct`, as `nnx.eval_shape` makes)."""
    axes = variable.get_metadata().get("logical_axes")
    if axes is None:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, logical_to_mesh_spec(axes, jnp.shape(variable.get_value()), mesh, rules))


def model_shardings(model: nnx.Module, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.State:
    """`NamedSharding`s in the structure of `nnx.state(model)`, e.g. for `jax.jit(out_shardings=...)`."""
    return jax.tree.map(lambda v: variable_sharding(v, mesh, rules), nnx.state(model),
                        is_leaf=lambda x: isinstance(x, nnx.Variable))


def place_state(state: nnx.State, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.State:
    """`state` (of `nnx.Variable`s) laid out on `mesh` by its variables' logical axes: a copy, moved from
    whatever devices it was on (device to device)."""
    shardings = jax.tree.map(lambda v: variable_sharding(v, mesh, rules), state,
                             is_leaf=lambda x: isinstance(x, nnx.Variable))
    return jax.device_put(state, shardings)


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.Module:
    """Place the model's parameters on `mesh` according to `rules` (in place; returns the model)."""
    nnx.update(model, place_state(nnx.state(model), mesh, rules))
    return model


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Shard the leading (batch) axis over the mesh's `data` and `fsdp` axes, replicate the rest."""
    return NamedSharding(mesh, PartitionSpec(batch_axes(mesh) or None))


#: Mesh axes an activation's batch dimension is split over (in this order, those the mesh has): the batch's.
ACTIVATION_BATCH_AXES = BATCH_AXES
#: Mesh axes the residual stream's sequence dimension is split over between the tensor-parallel
#: matmuls (sequence parallelism, Korthikanti et al. 2022), so it is not replicated over `model`.
ACTIVATION_SEQUENCE_AXES = ("model",)


def active_mesh(like: jax.Array | None = None):
    """The mesh activations are laid out on: the one set with `jax.set_mesh`, else `like`'s mesh.

    `like` is typically a parameter (a tracer under `jit`, whose type carries the mesh its argument
    was sharded on). Returns None when there is neither, i.e. on a single device.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if (mesh is None or mesh.empty) and like is not None:
        sharding = getattr(jax.typeof(like), "sharding", None)
        mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return None
    return mesh


def activation_spec(logical_axes: Sequence[str | None], shape: Sequence[int], mesh, rules: Rules = DEFAULT_RULES) -> PartitionSpec | None:
    """The `PartitionSpec` constraining an activation with these logical axes on `mesh`, or None.

    `"batch"` maps to the `ACTIVATION_BATCH_AXES`, `"sequence"` (the residual stream's length) to the
    `ACTIVATION_SEQUENCE_AXES`; `heads`, `kv_heads`, `mlp` and `vocab` map as the parameter `rules`
    say; None (or any other name) stays whole. Only the mesh's Auto axes larger
    than one are used (Explicit axes already carry the layout in the array types, Manual ones belong
    to a `shard_map`). A dimension its axes do not divide drops axes from the end, and is left
    unconstrained (for XLA to choose) if none fits; an axis so left over splits the `"batch"`
    dimension further where it divides it. None when nothing would be constrained.
    """
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match the activation's rank {len(shape)}")
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", None) or (AxisType.Auto,) * len(sizes)))
    usable = {a for a, n in sizes.items() if n > 1 and types[a] == AxisType.Auto}
    if not usable:
        return None
    table = dict(rules)
    used: set[str] = set()
    spare: list[str] = []
    spec: list = []
    for name, size in zip(logical_axes, shape):
        if name == "batch":
            target = ACTIVATION_BATCH_AXES
        elif name == "sequence":
            target = ACTIVATION_SEQUENCE_AXES
        elif name in ("heads", "kv_heads", "mlp", "vocab"):
            target = table.get(name)
        else:
            target = None
        wanted = [target] if isinstance(target, str) else list(target or ())
        axes = [a for a in wanted if a in usable and a not in used]
        while axes and size % math.prod(sizes[a] for a in axes):
            axes.pop()
        used.update(axes)
        spare.extend(a for a in wanted if a in usable and a not in used and a not in spare)
        if axes:
            spec.append(axes)
        elif any(a in usable for a in wanted):
            spec.append(PartitionSpec.UNCONSTRAINED)  # wanted a split that does not divide: XLA decides
        else:
            spec.append(None)
    # A tensor-parallel axis a head or MLP dimension could not take splits the rows further where
    # they divide (SmolLM2's 9 heads on a 2-way `model` axis: attention runs on a quarter of the rows).
    if "batch" in logical_axes:
        i = list(logical_axes).index("batch")
        rows = list(spec[i]) if isinstance(spec[i], list) else []
        for a in spare:
            if a not in used and shape[i] % math.prod(sizes[b] for b in rows + [a]) == 0:
                rows.append(a)
                used.add(a)
        if rows:
            spec[i] = rows
    spec = [tuple(e) if isinstance(e, list) and len(e) > 1 else e[0] if isinstance(e, list) else e for e in spec]
    return PartitionSpec(*spec) if used else None


def constrain_activation(x: jax.Array, logical_axes: Sequence[str | None], mesh, rules: Rules = DEFAULT_RULES) -> jax.Array:
    """`x` constrained to `activation_spec` on `mesh` (`active_mesh()`); unchanged when `mesh` is None.

    A no-op without a mesh or when no axis applies, so single-device numerics are untouched.
    """
    if mesh is None:
        return x
    spec = activation_spec(logical_axes, x.shape, mesh, rules)
    if spec is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
