"""The rollout engine's decode chunk compiled for an NVIDIA GPU on a machine without one: what a decode step launches.

    python benchmarks/gpu_programs.py [--chip h100] [--model qwen3-0.6b]
        [--variants engine,engine-unshared,engine-no-split-k,engine-stacked,engine-stacked-writes-each]
        [--steps 8] [--update] [--update-remat full,save_projections]
        [--out benchmarks/results/gpu_programs_<chip>.json] [--dump DIR]

Needs the CUDA build of jax (`pip install -e ".[gpu]"`), not a GPU: XLA:GPU compiles for a description of the chip
(its compute capability, SMs, memory and caches: `TARGETS`) through `jax.experimental.topologies`, as
`jaxgrpo-compile` compiles for a TPU on a CPU. Nothing runs and nothing is timed; XLA chooses its GEMM kernels by its
heuristics, where on a GPU it would autotune them.

A decode step's time on a GPU is more than its arithmetic and memory traffic: every operation XLA launches costs a
few microseconds of launch and gap, a `while` loop whose trip count is not known at compile time sends its predicate
to the host once an iteration (a round trip that stalls the stream, unless the loop is in a command buffer), and a
copy moves bytes the arithmetic never needed. All three are read from the compiled program: per decode step (one
iteration of the decode chunk's loop, the layer scan's body counted once per layer), the device operations by kind
(XLA's thunks: fusions, GEMMs, Triton calls such as the paged attention kernel, copies; an asynchronous operation
once, at its start), the host round trips (the predicate of a loop whose trip count XLA does not know, a
conditional's branch index), and the bytes the step copies (copies, and slices of the stacked layer weights or
caches).

The shapes are `benchmarks/device_check.py`'s (16 prompts x 8 samples, 256-token prompts, 512 new tokens, one slot
per sample, the engine's 16-position blocks, the pool holding every row's whole context, each prompt's blocks read
once for its 8 samples as a shared prefix, as the engine plans such a chunk), so a device check on the same chip
times what is counted here. `--variants` (`device_check.DECODE_VARIANTS`): "engine" as jaxgrpo compiles it;
"engine-unshared" without shared prefixes (each row reads its prompt's blocks itself: one paged kernel call a
layer instead of two); "engine-stacked" on the plain memory forms (the layer scan over the stacked weights, RoPE's
halves concatenated: before `memory_forms.split_layers` and `swap_halves`); "engine-stacked-writes-each" also
writing the pool's new positions one at a time (`paged_writes_each`: the decode as it was before 2026-12-07);
"engine-graphs" with XLA command buffers for WHILE and CONDITIONAL (what a step launches stays; whether it runs
from a CUDA graph is decided at run time); "engine-no-split-k" with no GEMM split over its contraction
(`device_check.NO_SPLIT_K`). `--update` also compiles the trainer's update
at those shapes (micro-batches of 16, packing off as on a GPU) and counts its device operations and the bytes they
read and write outside the GEMMs (`_traffic`: estimated from shapes), with its temporaries, that traffic by where it
comes from (`scope`: the named scopes of each operation's metadata, "backward: " for a gradient's) and the GEMMs'
FLOPs by their operands' types (a float32 GEMM runs at half the bfloat16 rate at best); `--update-remat` compiles
it with the layers' remat off or under remat policies too (`Config.remat_policy`), and with `/unrolled`, the layers
run one after another (`Config.scan_layers=false`)."""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
from typing import NamedTuple

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # nothing runs: the CUDA plugin only compiles (no driver needed)
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # its version checks ask a driver

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: XLA:GPU's description of each chip (`stream_executor.GpuTargetConfigProto` as text): what the compiler reads
#: of a device. Figures from NVIDIA's data sheets and from the chips the device checks ran on (132 SMs; L2 50 MB on
#: the H100, 60 MB on the H200); CUDA 13 and cuDNN 9.10, as the CUDA 13 build of jax uses.
TARGETS = {
    "h100": ("NVIDIA H100 80GB HBM3", 84_929_347_584, 3_352_320_000_000, 52_428_800),
    "h200": ("NVIDIA H200", 150_754_820_096, 4_800_000_000_000, 62_914_560),
}


def target_config(chip: str) -> str:
    name, memory, bandwidth, l2 = TARGETS[chip]
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} l2_cache_size: {l2} clock_rate_ghz: 1.98 device_memory_size: {memory}
  shared_memory_per_block_optin: 232448 cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
runtime_version {{ major: 13 minor: 0 }}
device_description_str: "{name}"
"""


def gpu_mesh(chip: str):
    """A one-device mesh ("data") of `chip`, from XLA:GPU's topology for its target description."""
    import jax
    from jax.experimental import topologies

    try:
        devices = topologies.get_topology_desc(platform="cuda", target_config=target_config(chip),
                                               topology="1x1x1").devices
    except Exception as error:  # noqa: BLE001 — one line: what is missing and how to get it
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise SystemExit(f"cannot compile for a CUDA GPU here ({first}): install the CUDA build of jax, "
                         'pip install -e ".[gpu]"') from None
    return jax.sharding.Mesh(np.array(devices).reshape(1), ("data",))


# -- reading XLA:GPU's optimized HLO ---------------------------------------------------------------------------

#: Instructions that launch nothing (views, tuples, constants folded into the program).
FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id", "replica-id",
        "opt-barrier", "add-dependency", "fusion-done", "copy-done", "async-done"}
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
             "f64": 8, "s64": 8, "u64": 8}


class Program(NamedTuple):
    """Optimized HLO text read into its computations: {name: [(instruction, opcode, the rest of its line)]}, the
    entry computation's name, and each computation's root line."""

    computations: dict[str, list[tuple[str, str, str]]]
    entry: str
    roots: dict[str, str]


def read_hlo(text: str) -> Program:
    found, roots, current, entry = {}, {}, None, None
    for line in text.splitlines():
        header = re.match(r"^(ENTRY )?%(\S+) .*\{\s*$", line)
        if header:
            current = header.group(2)
            found[current] = []
            entry = current if header.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            instruction = re.match(r"\s*(ROOT )?%(\S+) = (.*)$", line)
            if instruction:
                root, name, rest = instruction.groups()
                found[current].append((name, _opcode(rest), rest))
                if root:
                    roots[current] = rest
    return Program(found, entry, roots)


def _opcode(rest: str) -> str:
    """The opcode of an instruction's line after `name = ` (its result's shape comes first)."""
    opcode = re.search(r"(?:^|[\s}\]])([a-z][a-z0-9-]*)\(", rest)
    return opcode.group(1) if opcode else "?"


def _result_bytes_all(rest: str) -> int:
    """Bytes of every array of an instruction's result (a tuple's too)."""
    shape = rest[:rest.index(_opcode(rest) + "(")] if _opcode(rest) != "?" else rest
    return sum(_bytes(array) for array in re.findall(r"\w+\[[\d,]*\]", shape))


def _called(rest: str) -> str | None:
    """The computation an instruction calls (a fusion's, an async start's), or None."""
    called = re.search(r"calls=%([\w.\-]+)", rest)
    return called.group(1) if called else None


def _traffic(program: Program, rest: str) -> int:
    """Bytes an operation reads and writes, estimated from shapes.

    An operation that calls no computation (a Triton or library call, a copy): twice its result (its operands, such
    as a whole KV pool a kernel reads a few blocks of, say nothing of what it reads). A fusion: its result, and each
    parameter of its computation, by what is read of it: a parameter that is only sliced (`slice`, `dynamic-slice`,
    `gather`, directly or through bitcasts and pads, as a backward pass reads a layer of its stacked residuals, or
    the sampler one block of its padded logits) by the slices' bytes. A fusion that updates its first operand in
    place (its root a `dynamic-update-slice` or `scatter` of a parameter, as a decode step writes its new tokens
    into the pool) writes its update, not the operand."""
    called = _called(rest)
    if not called:
        return 2 * _result_bytes_all(rest)
    inside = program.computations[called]
    root = program.roots[called]
    lines = {name: line for name, _, line in inside}
    users = collections.defaultdict(list)
    for name, opcode, line in inside:
        for operand in _operands(line):
            users[operand].append((name, opcode, line))

    def sliced_bytes(name):
        """The bytes of `name`'s slices where it is only sliced (directly or through bitcasts and pads), else None."""
        uses, found = users[name], 0
        for user, opcode, line in uses:
            first = _operands(line)[0] == name
            part = sliced_bytes(user) if opcode == "bitcast" or (opcode == "pad" and first) else \
                _bytes(line) if opcode in ("slice", "dynamic-slice", "gather") and first else None
            if part is None:
                return None
            found += part
        return found if uses else None

    written = _result_bytes_all(root)
    in_place = None
    if _opcode(root) in ("dynamic-update-slice", "scatter"):
        operand, *others = _operands(root)
        update = others[0] if _opcode(root) == "dynamic-update-slice" else others[1]
        in_place = _through_bitcasts(operand, lines)
        written = _bytes(lines.get(update, ""))
    read = 0
    for name, opcode, line in inside:
        if opcode != "parameter" or name == in_place:
            continue
        sliced = sliced_bytes(name)
        read += _bytes(line) if sliced is None else sliced
    return written + read


def _operands(line: str) -> list[str]:
    """The names an instruction's line (after `name = `) takes as operands."""
    opcode = _opcode(line)
    if opcode == "?":
        return []
    inside, depth = [], 0
    for char in line[line.index(opcode + "(") + len(opcode) + 1:]:
        if char == ")" and depth == 0:
            break
        depth += (char == "(") - (char == ")")
        inside.append(char)
    return re.findall(r"%([\w.\-]+)", "".join(inside))


def _through_bitcasts(name: str, lines: dict[str, str]) -> str:
    """The instruction `name` is a bitcast (or a chain of them) of, or `name`."""
    while name in lines and _opcode(lines[name]) == "bitcast":
        name = _operands(lines[name])[0]
    return name


def _shape(rest: str) -> tuple[str, list[int]] | None:
    """(element type, dimensions) of an instruction's result (the first array of a tuple), or None."""
    shape = re.search(r"(\w+)\[([\d,]*)\]", rest)
    return (shape.group(1), [int(d) for d in shape.group(2).split(",") if d]) if shape else None


def _bytes(rest: str) -> int:
    """Bytes of an instruction's result (the first array of a tuple)."""
    shape = _shape(rest)
    return _ITEMSIZE.get(shape[0], 4) * int(np.prod(shape[1])) if shape else 0


def _kind(program: Program, opcode: str, rest: str) -> str:
    """What an instruction launches: a GEMM (a GEMM fusion or library call; "of a slice in place" where it reads its
    operand through a dynamic slice), a Triton call, a slice of a stacked array (a fusion that makes the slice: a
    copy), another fusion, a copy."""
    if opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        if not target:
            return "?"
        return "Triton call (Pallas)" if target.group(1) == "__gpu$xla.gpu.triton" else \
            "GEMM" if "gemm" in target.group(1) or "matmul" in target.group(1) else "library call"
    if opcode in ("fusion", "fusion-start"):
        called = _called(rest)
        inside = program.computations.get(called, []) if called else []
        opcodes = {op for _, op, _ in inside}
        gemm = "dot" in opcodes or any(op == "custom-call" and re.search(r"gemm|matmul", r) for _, op, r in inside)
        if gemm:
            return "GEMM of a slice in place" if "dynamic-slice" in opcodes else "GEMM"
        root = re.match(r"\S+ ([a-z-]+)\(", program.roots.get(called, "")) if called else None
        if "dynamic-slice" in opcodes and root and root.group(1) in ("dynamic-slice", "copy", "bitcast"):
            return "slice of stacked weights or cache"
        return "fusion"
    if opcode in ("copy", "copy-start"):
        return "copy"
    return opcode


#: Scopes of an `op_name` that say how, not where: loops, jaxpr evaluation, remat's wrappers.
_NOT_SCOPES = {"while", "body", "cond", "eval_jaxpr", "checkpoint", "rematted_computation", "remat", "remat2",
               "closed_call", "shard_map", "pjit", "custom_jvp_call", "custom_vjp_call"}


def _scope_name(part: str) -> str | None:
    """A scope of an `op_name` unwrapped from its transformations (`transpose(jvp(layers))` -> "layers"), None for
    one that names no place: a jitted helper (`jit(silu)`), an einsum's spec, a scope of `_NOT_SCOPES`."""
    while (wrapped := re.fullmatch(r"(\w+)\((.*)\)", part)):
        if wrapped.group(1) == "jit":
            return None
        part = wrapped.group(2)
    return None if not part or part in _NOT_SCOPES or "->" in part else part


def scope(rest: str, depth: int = 3) -> str:
    """Where an operation comes from, read from its `op_name` metadata: "backward: " where its name is under a
    `transpose(...)` (the gradient of the scopes in it), then its first `depth` named scopes (jaxgrpo's
    `jax.named_scope`s and Flax modules: "layers/attention/core"; a scope repeated by a transformation once),
    "(unnamed)" without metadata, "(top)" with no named scope."""
    name = re.search(r'op_name="([^"]*)"', rest)
    if not name:
        return "(unnamed)"
    parts = name.group(1).split("/")
    kept = []
    for part in parts[1:-1]:  # the outer jit and the primitive name no scope
        named = _scope_name(part)
        if named and (not kept or kept[-1] != named):
            kept.append(named)
    backward = any(part.startswith("transpose(") for part in parts)
    return ("backward: " if backward else "") + ("/".join(kept[:depth]) or "(top)")


def _trips(rest: str) -> int | None:
    trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
    return int(trips.group(1)) if trips else None


def _dot_flops(program: Program, rest: str) -> dict[str, int]:
    """{"<lhs dtype> x <rhs dtype>": FLOPs} of the matrix products inside a fusion (a GEMM fusion's `dot`s, as the
    GEMM multiplies them: an operand converted inside the fusion counts in the converted type)."""
    called = _called(rest)
    if not called:
        return {}
    inside = program.computations[called]
    lines = {name: line for name, _, line in inside}
    found = collections.Counter()
    for _, opcode, line in inside:
        if opcode != "dot":
            continue
        (lhs_type, lhs_dims), (rhs_type, _) = (_shape(lines[o]) for o in _operands(line)[:2])
        contracted = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line).group(1)
        depth = int(np.prod([lhs_dims[int(i)] for i in contracted.split(",") if i]))
        found[f"{lhs_type} x {rhs_type}"] += 2 * int(np.prod(_shape(line)[1])) * depth
    return found


def per_iteration(program: Program, body: str) -> dict:
    """What one iteration of the loop `body` launches: {"operations": {kind: count}, "host_round_trips": ...,
    "copied_bytes": ..., "traffic_bytes": {kind: bytes read and written (`_traffic`)}, "loops": [(body, trips)],
    "traffic_outside_gemms_by_scope": {`scope`: bytes}, "gemm_flops_by_operand_types": {"bf16 x bf16": FLOPs}}:
    a nested loop's body counted trips times (a loop whose trip
    count XLA knows runs without testing its predicate on the host; one it does not know is counted as one
    iteration, two predicates on the host), a conditional's largest branch once and its branch index's trip to
    the host."""
    found = program.computations
    operations, traffic, totals, loops = collections.Counter(), collections.Counter(), collections.Counter(), []
    by_scope, flops = collections.Counter(), collections.Counter()

    def result_bytes(rest):  # a fusion's result is its computation's root's (an async start's result is a tuple)
        called = _called(rest)
        return _bytes(program.roots[called] if called else rest)

    def walk(name, times):
        for instruction, opcode, rest in found[name]:
            if opcode in FREE:
                continue
            if opcode == "while":
                inner = re.search(r"body=%([\w.\-]+)", rest).group(1)
                trips = _trips(rest)
                loops.append((inner, trips))
                if trips is None:  # XLA:GPU tests its predicate on the host, once per iteration and a last time
                    totals["host_round_trips"] += 2 * times
                walk(inner, times * (trips or 1))
            elif opcode == "conditional":
                branches = re.findall(r"%([\w.\-]+)", rest.split("branch_computations={", 1)[1].split("}")[0]) \
                    if "branch_computations" in rest else re.findall(r"_computation=%([\w.\-]+)", rest)
                totals["host_round_trips"] += times
                sizes = {b: sum(1 for _, op, _ in found[b] if op not in FREE) for b in branches}
                walk(max(sizes, key=sizes.get), times)
            elif opcode == "call":
                walk(re.search(r"to_apply=%([\w.\-]+)", rest).group(1), times)
            else:
                kind = _kind(program, opcode, rest)
                operations[kind] += times
                moved = times * _traffic(program, rest)
                traffic[kind] += moved
                if not kind.startswith("GEMM"):
                    by_scope[scope(rest)] += moved
                for types, count in _dot_flops(program, rest).items():
                    flops[types] += times * count
                if kind in ("copy", "slice of stacked weights or cache"):
                    totals["copied_bytes"] += times * result_bytes(rest)

    walk(body, 1)
    return {"operations": dict(operations.most_common()), "operations_total": sum(operations.values()),
            "host_round_trips": totals["host_round_trips"], "copied_bytes": totals["copied_bytes"],
            "traffic_bytes": dict(traffic.most_common()),
            "traffic_bytes_outside_gemms": sum(v for k, v in traffic.items() if not k.startswith("GEMM")),
            "traffic_outside_gemms_by_scope": dict(by_scope.most_common()),
            "gemm_flops_by_operand_types": dict(flops.most_common()),
            "loops": [{"body": b, "trips": t} for b, t in loops]}


def decode_step_counts(text: str) -> dict:
    """`per_iteration` of the decode chunk's loop: the entry's loop with the largest body."""
    program = read_hlo(text)
    loops = [(re.search(r"body=%([\w.\-]+)", rest).group(1), _trips(rest))
             for _, opcode, rest in program.computations[program.entry] if opcode == "while"]
    if not loops:
        raise ValueError("the program has no decode loop")
    body, trips = max(loops, key=lambda loop: len(program.computations[loop[0]]))
    counts = per_iteration(program, body)
    if trips is None:  # the decode loop's own predicate (it stops early when every row has): once a step
        counts["host_round_trips"] += 1
    return {"decode_loop_trips": trips, **counts}


# -- the engine's decode chunk -----------------------------------------------------------------------------------


#: Positions per KV block: the rollout engine's default, as device_check's engine runs.
BLOCK_SIZE = 16

#: The variants counted unless told (`device_check.DECODE_VARIANTS` has them all).
DEFAULT_VARIANTS = ("engine", "engine-unshared", "engine-no-split-k", "engine-merged-outside", "engine-stacked",
                    "engine-stacked-writes-each")


def compile_decode(model: str, mesh, steps: int, variant: str):
    """(optimized HLO text, seconds to compile) of the engine's decode chunk of `steps` steps for `model` (random
    weights, bfloat16) at device_check's shapes, the pool holding every row's whole context and each row half
    through its completion."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from device_check import DECODE_VARIANTS, FULL_SHAPES, Shapes, decode_variant
    from jaxgrpo import engine, sampler
    from jaxgrpo.models import Decoder, architectures
    from jaxgrpo.models.config import from_hf_config

    config = from_hf_config(dict(architectures.ARCHITECTURES[model].hf_config))
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                                                               rngs=nnx.Rngs(0))))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), state)
    shapes = Shapes(**FULL_SHAPES)
    context = sampler.bucket_length(shapes.prompt_len) + shapes.new_tokens
    jax.clear_caches()  # the variants trace the same functions at the same shapes: no traces reused
    start = time.perf_counter()
    variant = DECODE_VARIANTS[variant]
    with decode_variant(variant):
        traced = engine.trace_programs(
            graphdef, state, num_slots=shapes.rows, num_blocks=shapes.rows * context // BLOCK_SIZE + 1,
            block_size=BLOCK_SIZE, max_context=context, prefill_rows=shapes.prompts, prompt_len=shapes.prompt_len,
            draws=shapes.rows, width=shapes.prompt_len + shapes.new_tokens // 2, steps=steps, mesh=mesh,
            sampling=sampler.SamplingParams(temperature=1.0), share=shapes.samples if variant.shared_prefixes else 1)
        with jax.set_mesh(mesh):
            lowered = traced["engine decode"].lower()
            compiled = lowered.compile(dict(variant.options) or None)
    return compiled.as_text(), time.perf_counter() - start


#: `--update-remat` names -> `compile_update`'s remat (as device_check's train runs set it).
UPDATE_REMAT = {"full": True, "off": False, "save_attention": "save_attention", "save_projections": "save_projections"}


def compile_update(model: str, chip: str, remat: bool | str = True, scan_layers: bool = True):
    """(optimized HLO text, seconds to compile, bytes of temporaries) of the trainer's update at device_check's
    shapes (16 x 8 rows of 256 + 512 tokens, micro-batches of 16, packing off as on a GPU, bfloat16) for `model`,
    its layers rematerialized as `remat` says (device_check's train runs: True, False or a `Config.remat_policy`),
    scanned or (`scan_layers=False`) one after another."""
    import jax

    from device_check import FULL_SHAPES, Shapes, train_config
    from jaxgrpo import train
    from jaxgrpo.tools import compile as compile_lib

    cfg = train_config(model, Shapes(**FULL_SHAPES), packing=False, attention="auto", remat=remat,
                       scan_layers=scan_layers)
    mesh = train.make_mesh(cfg, list(gpu_mesh(chip).devices.flat))
    start = time.perf_counter()
    abstract = compile_lib.abstract_train_state(cfg, mesh)
    lowered, _, _ = compile_lib.lower_update(cfg, mesh, abstract)
    with jax.set_mesh(mesh):
        compiled = lowered.compile()
    return compiled.as_text(), time.perf_counter() - start, compiled.memory_analysis().temp_size_in_bytes


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chip", default="h100", choices=sorted(TARGETS))
    parser.add_argument("--model", default="qwen3-0.6b", help="an architecture of jaxgrpo.models.architectures")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="comma-separated, of device_check.DECODE_VARIANTS but engine-views (a GPU reads in place)")
    parser.add_argument("--steps", type=int, default=8, help="decode steps per chunk (the counts are per step)")
    parser.add_argument("--out", default=None, help="the JSON (default benchmarks/results/gpu_programs_<chip>.json)")
    parser.add_argument("--dump", default=None,
                        help="write each program's optimized HLO here (<variant>.hlo, update.hlo)")
    parser.add_argument("--update", action="store_true",
                        help="also the trainer's update: its device operations and memory traffic outside the GEMMs")
    parser.add_argument("--update-remat", default="full",
                        help="with --update, comma-separated: full (the default, the layers recomputed whole), off, "
                             "or remat policies of Config.remat_policy (save_attention, save_projections), each "
                             "optionally with /unrolled (scan_layers=false); each compiled and counted (full is the "
                             "JSON's 'update', all in 'update_remat')")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    from device_check import DECODE_VARIANTS, FULL_SHAPES

    known = [name for name, variant in DECODE_VARIANTS.items() if variant.in_place is None]
    unknown = sorted(set(variants) - set(known))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    update_remat = [r.strip() for r in args.update_remat.split(",") if r.strip()]
    unknown = sorted(set(update_remat) - {f"{r}{u}" for r in UPDATE_REMAT for u in ("", "/unrolled")})
    if unknown:
        parser.error(f"unknown --update-remat {', '.join(unknown)}; choose from {', '.join(UPDATE_REMAT)}")
    from jaxgrpo.models import architectures

    if args.model not in architectures.ARCHITECTURES:
        parser.error(f"unknown --model {args.model!r}; choose one of {', '.join(architectures.names())}")
    import jax

    mesh = gpu_mesh(args.chip)
    result = {"benchmark": "gpu_programs", "chip": TARGETS[args.chip][0], "model": args.model, "steps": args.steps,
              "shapes": {**FULL_SHAPES, "block_size": BLOCK_SIZE},
              "jax": jax.__version__, "date": time.strftime("%Y-%m-%d"),
              "command": "python benchmarks/gpu_programs.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "variants": {}}

    def dump(name, text):
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            with open(os.path.join(args.dump, f"{name}.hlo"), "w") as f:
                f.write(text)

    for variant in variants:
        text, seconds = compile_decode(args.model, mesh, args.steps, variant)
        dump(variant, text)
        counts = decode_step_counts(text)
        result["variants"][variant] = {"compile_seconds": seconds, **counts}
        print(f"{variant}: {counts['operations_total']} device operations a decode step "
              f"({', '.join(f'{n} {k}' for k, n in counts['operations'].items())}), "
              f"{counts['host_round_trips']} host round trips, {counts['copied_bytes'] / 1e6:.1f} MB copied",
              flush=True)
    for remat in update_remat if args.update else ():
        setting, _, layers = remat.partition("/")
        text, seconds, temporaries = compile_update(args.model, args.chip, UPDATE_REMAT[setting], not layers)
        name = "update" if remat == "full" else f"update_{setting}" + (f"_{layers}" if layers else "")
        dump(name, text)
        program = read_hlo(text)
        counts = per_iteration(program, program.entry)
        micro_batches = FULL_SHAPES["prompts"] * FULL_SHAPES["samples"] // FULL_SHAPES["micro_batch"]
        entry = {"compile_seconds": seconds, "micro_batches": micro_batches, "temp_bytes": temporaries, **counts}
        if remat == "full":
            result["update"] = entry
        result.setdefault("update_remat", {})[remat] = entry
        print(f"{name}: {counts['operations_total']} device operations, "
              f"{counts['traffic_bytes_outside_gemms'] / 1e12:.2f} TB read and written outside the GEMMs, "
              f"{temporaries / 2**30:.2f} GiB of temporaries; GEMMs "
              f"{', '.join(f'{n / 1e12:.1f} TFLOP {t}' for t, n in counts['gemm_flops_by_operand_types'].items())}",
              flush=True)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"gpu_programs_{args.chip}.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
