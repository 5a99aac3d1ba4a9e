"""What a program does, read without running it: the collectives, host transfers and largest values of its
compiled HLO text, its matrix products and memory-bound work counted from its jaxpr (`count_products`: every
loop body times its trip count, the roofline of each), and the bytes a chip holds of a sharded tree."""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
# Ops that move data between the host and the chip inside a program.
HOST_TRANSFERS = ("infeed", "outfeed", "send", "recv", "host-compute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{collective: {"count", "bytes"}} of a compiled HLO module's text (async starts counted once)."""
    found = {name: {"count": 0, "bytes": 0} for name in COLLECTIVES}
    pattern = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")
    for shape, name, _ in pattern.findall(hlo_text):
        found[name]["count"] += 1
        found[name]["bytes"] += _shape_bytes(shape)
    return found


def _shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string such as `bf16[8,128]{1,0}` or a tuple of them."""
    total = 0
    for dtype, dims in re.findall(r"([a-z0-9]+)\[([0-9,]*)\]", shape):
        size = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += size * _DTYPE_BYTES.get(dtype, 4)
    return total


def host_transfers(hlo_text: str) -> list[str]:
    """The host-transfer ops (infeed, outfeed, send, recv, host callbacks) a compiled HLO module contains."""
    ops = re.findall(r"\b(" + "|".join(HOST_TRANSFERS) + r")(?:-start|-done)?\(", hlo_text)
    callbacks = re.findall(r'custom_call_target="([^"]*(?:callback|host)[^"]*)"', hlo_text)
    return sorted(set(ops + callbacks))


def largest_values(hlo_text: str, count: int = 3) -> list[dict]:
    """The `count` largest array values a compiled HLO module computes (not its parameters), each as
    {"bytes", "shape", "op"} with the JAX operation that made it: what dominates the temporaries."""
    found = {}
    pattern = re.compile(r"^\s*(?:ROOT\s+)?%\S+\s*=\s*([a-z0-9]+\[[0-9,]*\])\S*\s+([a-z-]+)\((.*)$", re.M)
    for shape, op, rest in pattern.findall(hlo_text):
        if op in ("parameter", "constant", "get-tuple-element", "bitcast"):
            continue
        name = re.search(r'op_name="([^"]*)"', rest)
        key = (shape, name.group(1) if name else op)
        found[key] = _shape_bytes(shape)
    top = sorted(found.items(), key=lambda item: -item[1])[:count]
    return [{"bytes": size, "shape": shape, "op": op} for (shape, op), size in top]


class ProductCount(NamedTuple):
    """A traced program's matrix products with every loop body times its trip count: FLOPs, the bytes
    their operands and results take, the roofline seconds of the products one at a time (each at
    max(FLOPs / peak, bytes / HBM bandwidth)), and the `while` loops whose trip count is only known at run
    time (counted once). Pallas calls are in the totals at their `cost_estimate` (FLOPs and HBM bytes the
    kernel states, e.g. splash attention's visited blocks, `pallas_tpu.splash_cost_estimates`), and apart
    in `pallas_flops` and `pallas_seconds`; a call that states none counts nothing and is counted in
    `pallas_calls_without_estimate`.

    The memory-bound work beside the products: `memory_bound_bytes`, what the program's other big operations
    (element-wise, reductions, transposes, gathers, slices, in-place updates; `memory_bound_bytes_of`) move, and
    `memory_bound_seconds`, those bytes at HBM bandwidth. The roofline with memory-bound work is
    `roofline_seconds + memory_bound_seconds` (`with_memory_seconds`)."""

    flops: float
    bytes: float
    roofline_seconds: float
    loops_counted_once: int
    pallas_flops: float = 0.0
    pallas_seconds: float = 0.0
    pallas_calls_without_estimate: int = 0
    memory_bound_bytes: float = 0.0
    memory_bound_seconds: float = 0.0

    @property
    def with_memory_seconds(self) -> float:
        """The roofline of the products and the memory-bound work: each operation at max(FLOPs / peak, bytes /
        HBM bandwidth), the non-product operations' FLOPs taken as 0."""
        return self.roofline_seconds + self.memory_bound_seconds


#: Operations that move no bytes of their own once XLA has compiled them: views, layout and sharding
#: annotations, and broadcasts (fused into their consumer).
_FREE_OPS = frozenset({
    "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "bitcast_convert_type", "iota", "stop_gradient",
    "optimization_barrier", "sharding_constraint", "device_put", "mesh_cast", "reshard", "pvary", "copy", "copy_p",
    "random_wrap", "random_unwrap", "random_seed", "random_bits",
    "name"})  # checkpoint_name: a remat policy's label (`jaxgrpo.models.remat`)
#: In-place updates: XLA writes the update into the operand's buffer, so they move the update's bytes.
_IN_PLACE_UPDATES = {"dynamic_update_slice": 1, "scatter": 2, "scatter-add": 2, "scatter_add": 2, "scatter-mul": 2,
                     "scatter-min": 2, "scatter-max": 2}
#: Below this many bytes an operation's result is taken to stay in caches, registers or a fusion (global shapes).
MEMORY_BOUND_MIN_BYTES = 1 << 20


def memory_bound_bytes_of(eqn, min_bytes: int = MEMORY_BOUND_MIN_BYTES) -> float:
    """The HBM bytes one non-product jaxpr operation moves, as counted by `count_products`: its results written
    once (an in-place update: the update's bytes), or 0 for an operation that moves nothing of its own
    (`_FREE_OPS`) or whose bytes are below `min_bytes`.

    Counting results, not operands, takes XLA's fusion into account roughly: a chain of element-wise operations
    fused into one kernel reads its inputs and writes its output once, where counting each operation's operands
    and results would count every intermediate three times. Against the programs measured on a real chip
    (Qwen3-0.6B's update on an H200, packing off and on, `jaxgrpo.tools.calibration.MEASURED`), the products alone
    estimate 1/3.0 and 1/4.9 of the measured time; with results counted, 1/1.3 of it in both layouts; with
    operands and results, 1.6x and 1.8x the measured time."""
    name = eqn.primitive.name
    if name in _FREE_OPS:
        return 0.0
    if name in _IN_PLACE_UPDATES:
        moved = _value_bytes(eqn.invars[_IN_PLACE_UPDATES[name]])
    else:
        moved = sum(_value_bytes(v) for v in eqn.outvars)
    return float(moved) if moved >= min_bytes else 0.0


def _value_bytes(var) -> int:
    aval = getattr(var, "aval", None)
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    try:
        return math.prod(shape) * itemsize(dtype)
    except TypeError:  # a token, or a dtype without a size
        return 0


def count_products(jaxpr, peak_flops: float, hbm_bandwidth: float,
                   min_bytes: int = MEMORY_BOUND_MIN_BYTES) -> ProductCount:
    """`ProductCount` of a (closed) jaxpr: `dot_general` and convolutions, Pallas calls at their
    `cost_estimate`, scans times their length, branches at their largest, the primal of custom derivatives
    (the transposed program is in the jaxpr already), a `while` once. Shapes are global: inside a
    `shard_map`, where shapes are one shard's, each product counts once per shard of its manual axes.
    Every other operation adds the bytes it moves (`memory_bound_bytes_of`, at least `min_bytes`) to the
    memory-bound work, with the same trip counts."""
    totals = [0.0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0.0]

    def product(eqn) -> tuple[float, float]:
        (lhs, rhs), (out,) = [v.aval for v in eqn.invars[:2]], [v.aval for v in eqn.outvars]
        if eqn.primitive.name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            flops = 2.0 * math.prod(out.shape) * math.prod(lhs.shape[d] for d in contracting)
        else:  # conv_general_dilated: each output reads the kernel's window over its input features
            out_features = rhs.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
            flops = 2.0 * math.prod(out.shape) * math.prod(rhs.shape) / out_features
        moved = sum(math.prod(a.shape) * itemsize(a.dtype) for a in (lhs, rhs, out))
        return flops, moved

    def add(flops: float, moved: float, times: float, pallas: bool = False):
        seconds = times * max(flops / peak_flops, moved / hbm_bandwidth)
        totals[0] += times * flops
        totals[1] += times * moved
        totals[2] += seconds
        if pallas:
            totals[4] += times * flops
            totals[5] += seconds

    def walk(closed, times: float):
        inner = getattr(closed, "jaxpr", closed)
        for eqn in inner.eqns:
            name = eqn.primitive.name
            if name in ("dot_general", "conv_general_dilated"):
                add(*product(eqn), times)
            elif name == "pallas_call":
                cost = eqn.params.get("cost_estimate")
                if cost is None:
                    totals[6] += 1
                else:
                    add(float(cost.flops), float(cost.bytes_accessed), times, pallas=True)
            elif name == "shard_map":
                mesh = eqn.params["mesh"]
                shards = math.prod(mesh.shape[axis] for axis in eqn.params["newly_manual_axes"])
                walk(eqn.params["jaxpr"], times * shards)
            elif name == "scan":
                walk(eqn.params["jaxpr"], times * eqn.params["length"])
            elif name == "while":
                totals[3] += 1
                walk(eqn.params["body_jaxpr"], times)
            elif name == "cond":
                branches = [count_products(b, peak_flops, hbm_bandwidth, min_bytes) for b in eqn.params["branches"]]
                widest = max(branches, key=lambda c: (c.flops, c.memory_bound_bytes))
                totals[0] += times * widest.flops
                totals[1] += times * widest.bytes
                totals[2] += times * widest.roofline_seconds
                totals[3] += widest.loops_counted_once
                totals[4] += times * widest.pallas_flops
                totals[5] += times * widest.pallas_seconds
                totals[6] += widest.pallas_calls_without_estimate
                totals[7] += times * widest.memory_bound_bytes
            else:
                for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
                    sub = eqn.params.get(key)
                    if sub is not None and hasattr(getattr(sub, "jaxpr", sub), "eqns"):
                        walk(sub, times)
                        break
                else:  # an operation of its own, not a call: element-wise, reduction, transpose, gather, ...
                    totals[7] += times * memory_bound_bytes_of(eqn, min_bytes)

    walk(jaxpr, 1.0)
    return ProductCount(*totals, memory_bound_seconds=totals[7] / hbm_bandwidth)


def per_chip_bytes(tree) -> int:
    """Bytes one chip holds of an abstract, sharded tree (for checking that a layout divides the state)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += int(np.prod(shard, dtype=np.int64)) * itemsize(leaf.dtype)
    return total


def itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # a typed PRNG key: its key data's bytes
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
        return int(np.prod(data.shape)) * data.dtype.itemsize
    return jnp.dtype(dtype).itemsize
