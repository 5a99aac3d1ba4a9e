"""Ahead-of-time compilation of a run's training programs for a TPU topology, on any machine, and their report.

libtpu compiles for a TPU topology without a TPU: `jax.experimental.topologies` describes the topology's
chips, a mesh is laid over them as the experiment's mesh config says, the model is built from shapes
alone (no weights are read), and `jax.jit(...).lower(abstract inputs).compile()` gives what XLA's TPU
compiler decided: memory per chip, FLOPs and bytes, its time estimate, and the compiled HLO, which
shows the collectives. Programs compiled here, each at the experiment's shapes:

* `prefill` and `decode`: the sampler's two programs (`sampler.generate`) for one step's prompts, at the
  prompt and completion buckets of `sampling.max_prompt_len` and `sampling.max_new_tokens`: the
  prompts run once into a shared cache, then a `while` loop samples one token per row per iteration;
* `forward`: the reference / old-policy log-prob forward (`jaxgrpo.train.step.make_forward_fn`) over a batch;
* `update`: one optimizer step of `jaxgrpo.train.step.make_update_fn` over a minibatch of micro-batches (packed
  groups at their worst case, one group per row, when `packing` is on).
* `engine` (asked for by name, not in the default set while the trainer samples with `sampler.generate`):
  the rollout engine's programs (`jaxgrpo.engine.trace_programs`): its prefill, and a chunk of decode steps
  over one slot per sample at two fill levels (`ENGINE_FILLS`: a pool holding half and all of every slot's
  context), each with its KV pool's bytes per chip: KV memory follows the live positions, in whole blocks.

The compiler's cost analysis counts a loop body once, whatever its trip count (the update's micro-batch
scan, the decoder's layer scan, the decode loop): its FLOPs and time are lower bounds. So the report also
counts the traced program's matrix products with every scan body times its length (`count_products`:
remat's recomputation and attention included), and each Pallas call at the analytic `cost_estimate` it
states (splash attention: the blocks its mask visits, `pallas_tpu.splash_cost_estimates`; the decode
kernel: a full cache, `pallas_decode.full_cache_cost_estimate`), estimates the time as their roofline,
each at max(FLOPs / peak, bytes / HBM bandwidth), with the Pallas calls' share apart (`pallas_seconds`),
and gives the estimated MFU (a roofline bound) that time implies for the model's analytic FLOPs (2·N per
token forward, 6·N per token trained). The products leave out the memory-bound work (element-wise
operations, reductions, transposes, gathers and slices over the big arrays), so the report also gives the
roofline with it: the products' time plus the bytes those operations move at HBM bandwidth
(`memory_bound_bytes_of`), and the estimated MFU at that time. A `while` loop whose trip
count is known only at run time (the decode loop) is counted once: its figures are one step's.
For the decode loop, whose body is one step, it also gives the step's HBM floor: the parameters and the
whole cache a chip holds, read once per token at the chip's bandwidth.

Every figure here is an estimate: nothing runs. Beside each estimated time and MFU the report prints how far
the nearest real run was from the same estimate (`jaxgrpo.calibration`: measured / estimated seconds, with the
chip and jax version). Qwen3-0.6B's update on an H200 took 3.0x the products' estimate with packing off and
4.9x with packing on, and 1.3x the estimate with the memory-bound work in both; no TPU run has been measured yet.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgrpo.config import Config, resolve_packing, validate
from jaxgrpo.distributed import BATCH_AXES

GiB = 1 << 30


class Chip(NamedTuple):
    """One TPU chip's published figures: bfloat16 peak FLOP/s, HBM bytes and HBM bandwidth (bytes/s)."""

    name: str
    peak_flops: float
    hbm_bytes: int
    hbm_bandwidth: float


#: Per-chip figures from the Cloud TPU system-architecture pages (v4, v5e, v5p, v6e "Trillium").
CHIPS = {
    "v4": Chip("TPU v4", 275e12, 32 * GiB, 1200e9),
    "v5e": Chip("TPU v5e", 197e12, 16 * GiB, 819e9),
    "v5p": Chip("TPU v5p", 459e12, 95 * GiB, 2765e9),
    "v6e": Chip("TPU v6e", 918e12, 32 * GiB, 1640e9),
}
EXAMPLE_TOPOLOGIES = "v5e:2x4, v5e:4x4, v5p:2x2x1, v5p:4x4x4, v6e:2x4, v4:2x2x2"

DEFAULT_PROGRAMS = ("prefill", "decode", "forward", "update")
PROGRAMS = (*DEFAULT_PROGRAMS, "engine")
SAMPLER_PROGRAMS = ("prefill", "decode", "engine")  # on the sampler's chips under a split mesh
ENGINE_FILLS = (0.5, 1.0)
"""The rollout engine's fill levels (`--programs engine`): its pool holds this share of every slot's whole context."""
ENGINE_BLOCK_SIZE, ENGINE_DECODE_CHUNK = 16, 8
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
# Ops that move data between the host and the chip inside a program.
HOST_TRANSFERS = ("infeed", "outfeed", "send", "recv", "host-compute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def topology_devices(topology: str) -> tuple[Chip, list]:
    """(the chip, the devices) of a TPU topology such as "v5e:2x4"; one-line errors for what cannot be had."""
    generation = topology.split(":", 1)[0]
    if ":" not in topology or generation not in CHIPS:
        raise ValueError(f"unknown TPU topology {topology!r}: write GENERATION:SHAPE with GENERATION one of "
                         f"{', '.join(CHIPS)}, e.g. {EXAMPLE_TOPOLOGIES}")
    # libtpu takes a machine-wide lock when it loads, meant for processes that drive TPU chips; a process that
    # only compiles (this one runs on CPUs) must not fail because another compiling process holds it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        import libtpu  # noqa: F401  (the TPU compiler; nothing else here needs it)
    except ImportError:
        raise RuntimeError('compiling for a TPU needs libtpu: pip install "jax[tpu]==0.10.2" '
                           '(or pip install -e ".[tpu]")') from None
    from jax.experimental import topologies

    try:
        devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    except Exception as error:  # libtpu's errors are long; keep the first line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"libtpu cannot lay out the topology {topology!r} ({first}); "
                         f"valid examples: {EXAMPLE_TOPOLOGIES}") from None
    return CHIPS[generation], list(devices)


def decoder_config(cfg: Config):
    """The policy's architecture for `cfg.model`, without weights: a code-built model's own, else the
    checkpoint's config (`models.load_config`)."""
    from jaxgrpo import models, train

    if cfg.model in train.MODEL_BUILDERS:
        model = nnx.eval_shape(lambda: train.MODEL_BUILDERS[cfg.model](dtype=getattr(jnp, cfg.dtype), remat=cfg.remat)[0])
        return model.config
    return models.load_config(cfg.model)


class Abstract(NamedTuple):
    """What the programs are traced with: the policy's graph, its read-only state (`rest`: with LoRA the base
    weights), the optimizer, the abstract train state (every leaf a `ShapeDtypeStruct` carrying its sharding),
    and the parameter counts: the whole policy's and the trained ones' (the same without LoRA)."""

    graphdef: Any
    rest: Any
    optimizer: optax.GradientTransformation
    state: Any
    num_params: int
    num_trained: int = 0
    decoder_graphdef: Any = None  # the policy's decoder alone (the sampler's programs take it with its state)


def _placed(tree, mesh):
    """`tree` (an abstract nnx state) with every leaf a `ShapeDtypeStruct` carrying its sharding on `mesh` as the
    trainer lays it out (`lora.shardings`: by logical axes; a LoRA run's quantized weights as their projections)."""
    from jaxgrpo.models import lora

    def place(sharding, leaf):
        if isinstance(leaf, nnx.Variable):
            value = leaf.get_value()
            return leaf.replace(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding))
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree.map(place, lora.shardings(tree, mesh), tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract_train_state(cfg: Config, mesh) -> Abstract:
    """The policy and its optimizer state as the trainer lays them out on `mesh`, from shapes alone (with LoRA,
    the adapted policy: its base weights quantized under QLoRA)."""
    from jaxgrpo import train
    from jaxgrpo.models import Decoder

    config, dtype = decoder_config(cfg), getattr(jnp, cfg.dtype)
    graphdefs = []

    def split_policy():
        policy = train.Policy(train.adapt(Decoder(config, dtype=dtype, param_dtype=dtype, remat=cfg.remat,
                                                  attention=cfg.attention, rngs=nnx.Rngs(0)), cfg),
                              value_head=cfg.value_head)
        graphdef, params, rest = nnx.split(policy, train.trainable(cfg), ...)
        graphdefs.append((graphdef, nnx.split(policy.decoder)[0]))
        return params, rest

    # Split while tracing, not after `nnx.eval_shape`: a QLoRA base weight is a pytree of arrays (qwix's QArray),
    # not a variable, and is state only while its leaves are arrays; as shapes it would be folded into the graph.
    params, rest = jax.eval_shape(split_policy)
    graphdef, decoder_graphdef = graphdefs[0]
    params, rest = _placed(params, mesh), _placed(rest, mesh)
    replicated = NamedSharding(mesh, P())
    optimizer = train.make_optimizer(cfg.optimizer)
    # The optimizer's moments live where their parameters do (as `optimizer.init` on placed parameters gives).
    opt_state = optax.tree_map_params(
        optimizer, lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p.sharding),
        jax.eval_shape(optimizer.init, params), params,
        transform_non_params=lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated))
    state = train.TrainState(params, opt_state, jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated))
    trained = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))
    # A quantized weight counts its values (its scales are not parameters of the model).
    frozen = sum(math.prod(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(rest)
                 if jax.tree_util.keystr(path[-1:]) != "['scale']")
    return Abstract(graphdef, rest, optimizer, state, trained + frozen, trained, decoder_graphdef)


def _batch_shapes(cfg: Config) -> tuple[int, int, int, int]:
    """(micro-batches per minibatch, rows per micro-batch, prompt + completion length, completion length)."""
    minibatch, micro = cfg.minibatch_size, cfg.micro_batch_rows
    completion = cfg.sampling.max_new_tokens
    return minibatch // micro, micro, cfg.sampling.max_prompt_len + completion, completion


def _sharded(shape, dtype, sharding):
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def lower_update(cfg: Config, mesh, abstract: Abstract):
    """The lowered update program at `cfg`'s shapes, its trained tokens per call, and its jaxpr."""
    from jaxgrpo import train
    from jaxgrpo.models import packing

    from jaxgrpo.models.attention import target_platform

    cfg = resolve_packing(cfg, target_platform(mesh))  # packing=None: the mesh's platform's default
    num_micro, micro, length, completion = _batch_shapes(cfg)
    rows = NamedSharding(mesh, P(None, BATCH_AXES))
    tokens = lambda dtype: _sharded((num_micro, micro, length), dtype, rows)  # noqa: E731
    per_token = [_sharded((num_micro, micro, completion), jnp.float32, rows) for _ in range(6)]
    batch = train.TrainBatch(tokens(jnp.int32), tokens(jnp.bool_), tokens(jnp.int32), *per_token)
    packed_shape, layout = None, ()
    if cfg.packing:
        # The worst case: no two groups share a row, each group a prompt and G full completions.
        groups = micro // cfg.group_size
        packed_shape = (groups, packing.packed_length(cfg.sampling.max_prompt_len + cfg.group_size * completion))
        replicated = NamedSharding(mesh, P())
        layout = ((_sharded((num_micro, groups), jnp.int32, replicated),) * 2,)
    state_sharding = jax.tree.map(lambda x: x.sharding, abstract.state)
    update = train.make_update_fn(cfg, abstract.graphdef, abstract.rest, abstract.optimizer, mesh, state_sharding,
                                    packed_shape)
    with jax.set_mesh(mesh):
        traced = update.trace(abstract.state, batch, *layout)
        return traced.lower(), num_micro * micro * length, traced.jaxpr


def lower_forward(cfg: Config, mesh, abstract: Abstract):
    """The lowered reference / old-policy log-prob forward over one step's batch, its tokens per call, and
    its jaxpr."""
    from jaxgrpo import train

    _, _, length, completion = _batch_shapes(cfg)
    rows = NamedSharding(mesh, P(BATCH_AXES))

    def forward(rest, params, tokens, attention, positions):
        policy = nnx.merge(abstract.graphdef, params, rest)
        logp, _, values = train.completion_outputs(policy, tokens, attention, positions, completion,
                                                     cfg.sampling.temperature, with_values=cfg.value_head)
        return logp, (values if values is not None else jnp.zeros_like(logp))

    shape = (cfg.batch_size, length)
    with jax.set_mesh(mesh):
        traced = jax.jit(forward).trace(abstract.rest, abstract.state.params, _sharded(shape, jnp.int32, rows),
                                        _sharded(shape, jnp.bool_, rows), _sharded(shape, jnp.int32, rows))
        return traced.lower(), cfg.batch_size * length, traced.jaxpr


def _abstract_decoder(abstract: Abstract) -> tuple:
    """The policy's decoder (abstract), its graph as split while tracing (`abstract_train_state`: a QLoRA base is
    state, not graph) and its state from the policy's, as placed: what the sampler's and engine's programs take."""
    decoder = nnx.merge(abstract.graphdef, abstract.state.params, abstract.rest).decoder
    state = nnx.merge_state(*(part["decoder"] for part in (abstract.state.params, abstract.rest) if "decoder" in part))
    return decoder, abstract.decoder_graphdef, state


def lower_sampler(cfg: Config, mesh, abstract: Abstract) -> tuple:
    """The compiled prefill and decode programs of one step's sampling (each with its compile seconds and
    jaxpr), and what the report needs of them: (prefill, prompt tokens per call, decode, generated tokens
    per call, per-chip bytes of the decode loop's state)."""
    from jaxgrpo import sampler

    decoder, graphdef, state = _abstract_decoder(abstract)
    s, prompts, g = cfg.sampling, cfg.prompts_per_step, cfg.group_size
    prompt_bucket, new_bucket = sampler.bucket_length(s.max_prompt_len), sampler.bucket_length(s.max_new_tokens)
    params = sampler.SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p)
    layout = sampler.layout_for(decoder, mesh, g, prompt_bucket, new_bucket, params)
    replicated = NamedSharding(mesh, P())
    scalar = _sharded((), jnp.int32, replicated)
    stop = _sharded((8,), jnp.int32, replicated)
    key_dtype = jax.eval_shape(lambda: jax.random.key(0)).dtype
    with jax.set_mesh(mesh):
        prefill = sampler.prefill_program.trace(
            graphdef, state, _sharded((prompts, prompt_bucket), jnp.int32, replicated),
            _sharded((prompts, prompt_bucket), jnp.bool_, replicated),
            _sharded((prompts * g,), key_dtype, replicated), stop, scalar, scalar, layout=layout)
        # The decode loop starts from what the prefill returns, laid out as the prefill leaves it.
        prefill = (*_compile(prefill.lower()), prefill.jaxpr)
        if isinstance(prefill[0], OutOfMemory):
            raise RuntimeError(f"the prefill of {prompts} prompts of {prompt_bucket} tokens does not fit "
                               f"({prefill[0].message}); compile --programs forward update, or fewer prompts")
        carry = jax.tree.map(lambda info, sharding: _sharded(info.shape, info.dtype, sharding),
                             prefill[0].out_info, prefill[0].output_shardings)
        decode = sampler.decode_program.trace(graphdef, state, carry, stop, scalar, scalar, layout=layout)
        decode = (*_compile(decode.lower()), decode.jaxpr)
    return prefill, prompts * prompt_bucket, decode, prompts * g * s.max_new_tokens, per_chip_bytes(carry)


class EnginePrograms(NamedTuple):
    """The rollout engine's compiled programs at one fill level, and what the report needs of them."""

    prefill: tuple  # (compiled, compile seconds, jaxpr)
    decode: tuple
    prompt_tokens: int  # per prefill call
    decode_tokens: int  # per decode chunk: slots x steps
    live_tokens: int  # positions the pool holds (every slot at the fill level)
    pool_bytes: int  # the pool's bytes per chip


def lower_engine(cfg: Config, mesh, abstract: Abstract, fill: float) -> EnginePrograms:
    """The engine's prefill and decode chunk (`jaxgrpo.engine.trace_programs`) for one step's requests: a slot
    per sample, a pool of blocks holding `fill` of every slot's whole context (prompt and completion), the
    decode chunk reading that many cached positions. Its blocks and slots split over the mesh's data axis."""
    from jaxgrpo import engine, sampler

    decoder, graphdef, state = _abstract_decoder(abstract)
    s, prompts, g = cfg.sampling, cfg.prompts_per_step, cfg.group_size
    shards, block = mesh.shape["data"], ENGINE_BLOCK_SIZE
    slots = prompts * g
    context = s.max_prompt_len + s.max_new_tokens
    live = max(block, math.ceil(fill * context / block) * block)  # positions per slot, whole blocks
    num_blocks = shards * (slots // shards * (live // block) + 1)
    rows = math.ceil(prompts / shards) * shards
    traced = engine.trace_programs(
        graphdef, state, num_slots=slots, num_blocks=num_blocks, block_size=block, max_context=context,
        prefill_rows=rows, prompt_len=sampler.bucket_length(s.max_prompt_len), draws=slots, width=live,
        steps=ENGINE_DECODE_CHUNK, mesh=mesh,
        sampling=sampler.SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p))
    c = decoder.config
    pool_bytes = 2 * c.num_layers * num_blocks * c.num_kv_heads * block * c.head_dim * _itemsize(decoder.dtype)
    with jax.set_mesh(mesh):
        compiled = {name: (*_compile(t.lower()), t.jaxpr) for name, t in traced.items()}
    return EnginePrograms(compiled["engine prefill"], compiled["engine decode"], rows * s.max_prompt_len,
                          slots * ENGINE_DECODE_CHUNK, slots * live, pool_bytes // shards)


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
    "random_wrap", "random_unwrap", "random_seed", "random_bits"})
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
    (Qwen3-0.6B's update on an H200, packing off and on, `jaxgrpo.calibration.MEASURED`), the products alone
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
        return math.prod(shape) * _itemsize(dtype)
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
        moved = sum(math.prod(a.shape) * _itemsize(a.dtype) for a in (lhs, rhs, out))
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


@dataclasses.dataclass
class ProgramReport:
    """What the TPU compiler reports for one program, per chip, with the roofline figures derived from it."""

    program: str
    fits: bool
    hbm_bytes: int  # arguments + outputs + temporaries - donated (aliased) bytes
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    hbm_capacity: int
    flops: float  # the compiler's count: each loop body once
    bytes_accessed: float
    compiler_seconds: float | None  # the compiler's time estimate ("optimal_seconds"), loop bodies once; None
    # where it is negative, as it comes out for programs with loops
    model_flops: float  # analytic per chip: 6·N (update) or 2·N (forward) per token
    model_flops_seconds: float  # model_flops at the chip's peak
    hbm_roofline_seconds: float  # bytes_accessed at the chip's HBM bandwidth
    step_floor_seconds: float | None  # decode: parameters + cache per chip at the chip's HBM bandwidth, per token
    program_flops: float  # per chip: the traced program's matrix products and Pallas calls, loop bodies times
    # their trip counts
    estimated_seconds: float  # per chip: their roofline (`count_products`), an estimate; decode: one step
    pallas_flops: float  # per chip: the Pallas calls' part of program_flops (their stated cost estimates)
    pallas_seconds: float  # the Pallas calls' part of estimated_seconds
    mfu: float | None  # estimated MFU, a roofline bound: model FLOPs / (peak x estimated_seconds); None where a
    # loop was counted once (decode)
    loops_counted_once: int  # `while` loops of run-time trip count (decode's token loop), counted once
    largest_values: list  # the largest arrays the compiled program computes (`largest_values`)
    collectives: dict
    host_transfers: list
    compile_seconds: float
    error: str | None = None  # why the compiler refused the program (it does not fit), else None
    pallas_calls_without_estimate: int = 0  # Pallas calls that state no cost estimate: not in the estimate
    memory_bound_bytes: float = 0.0  # per chip: what the other big operations move (`memory_bound_bytes_of`)
    memory_bound_seconds: float = 0.0  # those bytes at the chip's HBM bandwidth
    estimated_seconds_with_memory: float = 0.0  # estimated_seconds + memory_bound_seconds: the roofline estimate
    # with the memory-bound work
    mfu_with_memory: float | None = None  # estimated MFU at estimated_seconds_with_memory (a roofline bound too)
    calibration: dict | None = None  # the measured run nearest this program (`jaxgrpo.calibration.nearest`):
    # its fields with "factor" (measured / products' estimate) and "factor_with_memory"; None where none is
    kv_pool_bytes: int | None = None  # the engine's programs: its KV pool's bytes per chip
    live_tokens: int | None = None  # the engine's programs: positions that pool holds, over all slots

    def calibration_note(self, chip: str, with_memory: bool = False) -> str:
        """'measured 3.0x this on an H200, jax 0.11.2 ...' for the estimate (with the memory-bound work or not)."""
        from jaxgrpo import calibration

        row = None
        if self.calibration:
            fields = {k: v for k, v in self.calibration.items() if k in calibration.Calibration._fields}
            row = calibration.Calibration(**fields)
        return calibration.note(row, chip, with_memory)

    def estimate_lines(self, chip: str) -> list[str]:
        """The two roofline estimates, products alone and with the memory-bound work, each labelled as a bound
        with how far the nearest measured run was from it, and the estimated MFU each implies."""
        products = (f"estimated {_duration(self.estimated_seconds)} (roofline bound, the products alone: "
                    f"{self.program_flops:.3g} FLOPs, Pallas calls {self.pallas_flops:.3g} FLOPs in "
                    f"{_duration(self.pallas_seconds)}; {self.calibration_note(chip)})")
        memory = (f"estimated {_duration(self.estimated_seconds_with_memory)} with the memory-bound work (roofline "
                  f"bound: the products and the {self.memory_bound_bytes / GiB:.2f} GiB per chip other operations "
                  f"move at HBM bandwidth, {_duration(self.memory_bound_seconds)}; "
                  f"{self.calibration_note(chip, with_memory=True)})")
        if self.mfu is not None:
            products += f"; estimated MFU {100 * self.mfu:.0f}% (roofline bound)"
        if self.mfu_with_memory is not None:
            memory += f"; estimated MFU {100 * self.mfu_with_memory:.0f}% (roofline bound)"
        return [products, memory]


def _duration(seconds: float) -> str:
    """'1.52 s', '12.40 ms' or '3.1 us'."""
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclasses.dataclass
class Report:
    topology: str
    chip: str
    chips: int
    hosts: int
    mesh: dict
    model: str
    num_params: int
    programs: list
    attention: str  # the attention implementation the programs were traced with ("auto" resolved)
    lora: dict | None = None  # the run's `LoraConfig` fields, None for a full fine-tune
    num_trained: int = 0  # the parameters that train (with LoRA the adapters, else num_params)
    #: A split mesh (`mesh.rollout_devices`): the sampler's chips, its mesh, the programs on it and the bytes of
    #: weights moved to it after each update; None when sampler and learner share the chips (`mesh` above).
    rollout: dict | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def table(self) -> str:
        """A human-readable summary, one line per program."""
        trained = "" if not self.lora else (
            f", LoRA rank {self.lora['rank']} ({self.num_trained / 1e6:.1f}M trained"
            f"{', base ' + self.lora['quantize_base'] if self.lora['quantize_base'] else ''})")
        lines = [f"{self.model} ({self.num_params / 1e6:.1f}M parameters{trained}) on {self.topology}: {self.chips} x "
                 f"{self.chip}, {self.hosts} host(s), mesh {self.mesh}, attention {self.attention}"]
        if self.rollout:
            r = self.rollout
            lines.append(f"  split: the learner on {self.chips - r['chips']} chips (mesh {self.mesh}), the sampler on "
                         f"{r['chips']} (mesh {r['mesh']}: {', '.join(r['programs']) or 'no program compiled'}); "
                         f"weights moved to the sampler after each update: {r['weight_transfer_bytes'] / 2**20:.1f} MiB")
        for p in self.programs:
            estimate = "no time estimate" if p.compiler_seconds is None else f"{p.compiler_seconds * 1e3:.2f} ms"
            step = "" if p.step_floor_seconds is None else f"; a step's HBM floor {p.step_floor_seconds * 1e3:.3f} ms"
            per_step = f" ({p.loops_counted_once} run-time loop(s) counted once)" if p.loops_counted_once else ""
            if p.pallas_calls_without_estimate:
                per_step += f" ({p.pallas_calls_without_estimate} Pallas call(s) without a cost estimate, not counted)"
            if p.error:
                lines.append(f"  {p.program:8s} DOES NOT FIT: the compiler refused it: {p.error}")
                continue
            moved = ", ".join(f"{k} x{v['count']} ({v['bytes'] / 2**20:.1f} MiB)" for k, v in p.collectives.items()
                              if v["count"]) or "none"
            lines.append(
                f"  {p.program:8s} {'fits' if p.fits else 'DOES NOT FIT'}: {p.hbm_bytes / GiB:.2f} of "
                f"{p.hbm_capacity / GiB:.0f} GiB per chip (arguments {p.argument_bytes / GiB:.2f}, temporaries "
                f"{p.temp_bytes / GiB:.2f}, outputs {p.output_bytes / GiB:.2f}, donated {p.alias_bytes / GiB:.2f}); "
                f"model FLOPs {p.model_flops:.3g} per chip = {p.model_flops_seconds * 1e3:.2f} ms at peak; compiler: "
                f"{p.flops:.3g} FLOPs, {p.bytes_accessed / 2**20:.1f} MiB accessed, {estimate} "
                f"(loop bodies once){step}; collectives: {moved}; host transfers: "
                f"{', '.join(p.host_transfers) or 'none'}; compiled in {p.compile_seconds:.1f} s")
            if p.kv_pool_bytes is not None:
                lines.append(f"  {'':8s} KV pool {p.kv_pool_bytes / GiB:.3f} GiB per chip for {p.live_tokens} live "
                             f"positions, {p.kv_pool_bytes / p.live_tokens / 1024:.1f} KiB each")
            # The estimates, loops x trip counts, each labelled with how far the nearest measured run was from it.
            lines += [f"  {'':8s} {line}{per_step}" for line in p.estimate_lines(self.chip)]
        return "\n".join(lines)


class OutOfMemory(NamedTuple):
    """A program the TPU compiler refused: what it needs does not fit the chip's HBM."""

    message: str  # the compiler's first line, e.g. "... HLO temporaries (33.05G) exceeds available HBM (15.75G)."

    def required_bytes(self) -> int:
        found = re.search(r"\(([0-9.]+)([KMGT])\) exceeds", self.message)
        return int(float(found.group(1)) * 1024 ** " KMGT".index(found.group(2))) if found else 0


def _compile(lowered):
    """(the compiled program, or `OutOfMemory` where the compiler refuses it for its size; seconds the
    compiler took)."""
    start = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as error:  # jax's XlaRuntimeError, whose message names the status
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        compiled = OutOfMemory(str(error).strip().splitlines()[0])
    return compiled, time.perf_counter() - start


def _program_report(name: str, compiled, seconds: float, jaxpr, chip: Chip, chips: int, model_flops: float,
                    step_floor_bytes: int | None = None, calibrations=None, packing: bool | None = None) -> ProgramReport:
    from jaxgrpo import calibration

    products = count_products(jaxpr, chip.peak_flops * chips, chip.hbm_bandwidth * chips)
    with_memory = products.with_memory_seconds
    row = calibration.nearest(calibration.MEASURED if calibrations is None else calibrations, chip.name, name, packing)
    # What every estimate below gets beside it: the measured run nearest this program, and its factors.
    estimates = dict(
        memory_bound_bytes=products.memory_bound_bytes / chips, memory_bound_seconds=products.memory_bound_seconds,
        estimated_seconds_with_memory=with_memory,
        calibration=None if row is None else {**row._asdict(), "factor": row.factor,
                                              "factor_with_memory": row.factor_with_memory})
    if isinstance(compiled, OutOfMemory):
        # What the compiler said it needs (temporaries, or all of it) stands for the whole; no cost analysis.
        return ProgramReport(
            program=name, fits=False, hbm_bytes=compiled.required_bytes(), argument_bytes=0, output_bytes=0,
            temp_bytes=compiled.required_bytes(), alias_bytes=0, hbm_capacity=chip.hbm_bytes, flops=0.0,
            bytes_accessed=0.0, compiler_seconds=None, model_flops=model_flops / chips,
            model_flops_seconds=model_flops / chips / chip.peak_flops, hbm_roofline_seconds=0.0,
            step_floor_seconds=None if step_floor_bytes is None else step_floor_bytes / chip.hbm_bandwidth,
            program_flops=products.flops / chips, estimated_seconds=products.roofline_seconds,
            pallas_flops=products.pallas_flops / chips, pallas_seconds=products.pallas_seconds, mfu=None,
            loops_counted_once=products.loops_counted_once, largest_values=[], collectives={}, host_transfers=[],
            compile_seconds=seconds, error=compiled.message,
            pallas_calls_without_estimate=products.pallas_calls_without_estimate, **estimates)
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    text = compiled.as_text()
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
             - memory.alias_size_in_bytes)
    flops_per_chip = model_flops / chips
    bytes_accessed = float(cost.get("bytes accessed", 0.0))
    # Global shapes: a chip does its share of every product (the mesh splits each one over all chips).
    estimated = products.roofline_seconds
    return ProgramReport(
        program=name, fits=total <= chip.hbm_bytes, hbm_bytes=int(total),
        argument_bytes=int(memory.argument_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes), alias_bytes=int(memory.alias_size_in_bytes),
        hbm_capacity=chip.hbm_bytes, flops=float(cost.get("flops", 0.0)), bytes_accessed=bytes_accessed,
        compiler_seconds=estimate if (estimate := float(cost.get("optimal_seconds", -1.0))) > 0 else None,
        model_flops=flops_per_chip,
        model_flops_seconds=flops_per_chip / chip.peak_flops, hbm_roofline_seconds=bytes_accessed / chip.hbm_bandwidth,
        step_floor_seconds=None if step_floor_bytes is None else step_floor_bytes / chip.hbm_bandwidth,
        program_flops=products.flops / chips, estimated_seconds=estimated,
        pallas_flops=products.pallas_flops / chips, pallas_seconds=products.pallas_seconds,
        mfu=(flops_per_chip / chip.peak_flops / estimated) if estimated > 0 and not products.loops_counted_once else None,
        loops_counted_once=products.loops_counted_once, largest_values=largest_values(text),
        collectives=collectives(text), host_transfers=host_transfers(text), compile_seconds=seconds,
        pallas_calls_without_estimate=products.pallas_calls_without_estimate,
        mfu_with_memory=(flops_per_chip / chip.peak_flops / with_memory)
        if with_memory > 0 and not products.loops_counted_once else None, **estimates)


def compile_experiment(cfg: Config, topology: str, programs=DEFAULT_PROGRAMS, cpu_forms: bool = False,
                       calibrations=None) -> Report:
    """Compiles `programs` of `cfg` for `topology` and reports each; nothing runs and no weights are read.
    `cpu_forms` traces the decoder's CPU-specific forms (`jaxgrpo.models.backend.force_cpu_forms`) too, to compare them.
    `calibrations`: the measured runs each estimate is compared with (`jaxgrpo.calibration.load`; default the
    committed ones, `calibration.MEASURED`)."""
    from jaxgrpo.models import backend

    with backend.force_cpu_forms(cpu_forms):
        return _compile_experiment(cfg, topology, programs, calibrations)


def _compile_experiment(cfg: Config, topology: str, programs, calibrations=None) -> Report:
    from jaxgrpo import train
    from jaxgrpo.train import preflight

    unknown = [p for p in programs if p not in PROGRAMS]
    if unknown:
        raise ValueError(f"unknown program(s) {', '.join(unknown)}; valid: {', '.join(PROGRAMS)}")
    chip, devices = topology_devices(topology)
    cfg = resolve_packing(cfg, devices[0].platform)
    split = cfg.mesh.rollout_devices
    preflight.check_rollout_split(cfg, len(devices), f"{topology}'s {len(devices)} chips")
    learner_devices, sampler_devices = devices[:len(devices) - split], devices[len(devices) - split:]
    mesh = train.make_mesh(cfg, learner_devices)
    validate(cfg, num_devices=mesh.shape["data"] * mesh.shape["fsdp"])
    abstract = abstract_train_state(cfg, mesh)
    n, chips, reports = abstract.num_params, len(learner_devices), []
    # The sampler's programs run on its own chips (`mesh.rollout_devices`: one-step-off), or on the learner's.
    sampler_mesh, sampler_abstract, sampler_chips = mesh, abstract, chips
    rollout = None
    if split:
        sampler_mesh = train.rollout_mesh(sampler_devices)
        sampler_abstract, sampler_chips = abstract_train_state(cfg, sampler_mesh), split
        # After each update the behaviour policy's weights (the trained ones) go learner -> sampler.
        moved = sum(math.prod(leaf.shape) * _itemsize(leaf.dtype) for leaf in jax.tree.leaves(abstract.state.params))
        rollout = {"chips": split, "mesh": dict(sampler_mesh.shape), "weight_transfer_bytes": moved,
                   "programs": [p for p in programs if p in SAMPLER_PROGRAMS]}
    if "prefill" in programs or "decode" in programs:
        prefill, prompt_tokens, decode, new_tokens, carry_bytes = lower_sampler(cfg, sampler_mesh, sampler_abstract)
        if "prefill" in programs:
            reports.append(_program_report("prefill", *prefill, chip, sampler_chips, 2 * n * prompt_tokens,
                                           calibrations=calibrations))
        if "decode" in programs:
            # One step reads every parameter (a LoRA run's base and adapters) and the whole cache once.
            floor = per_chip_bytes((sampler_abstract.state.params, sampler_abstract.rest)) + carry_bytes
            reports.append(_program_report("decode", *decode, chip, sampler_chips, 2 * n * new_tokens, floor,
                                           calibrations=calibrations))
    if "engine" in programs:
        for fill in ENGINE_FILLS:
            e = lower_engine(cfg, sampler_mesh, sampler_abstract, fill)
            if fill == ENGINE_FILLS[0]:  # the prefill reads no cached positions: one fill level tells it
                reports.append(dataclasses.replace(
                    _program_report("engine prefill", *e.prefill, chip, sampler_chips, 2 * n * e.prompt_tokens,
                                    calibrations=calibrations), kv_pool_bytes=e.pool_bytes, live_tokens=e.live_tokens))
            floor = per_chip_bytes((sampler_abstract.state.params, sampler_abstract.rest)) + e.pool_bytes
            reports.append(dataclasses.replace(
                _program_report(f"engine decode {fill:.0%} full", *e.decode, chip, sampler_chips,
                                2 * n * e.decode_tokens,
                                floor, calibrations=calibrations), kv_pool_bytes=e.pool_bytes,
                live_tokens=e.live_tokens))
    if "forward" in programs:
        lowered, tokens, jaxpr = lower_forward(cfg, mesh, abstract)
        reports.append(_program_report("forward", *_compile(lowered), jaxpr, chip, chips, 2 * n * tokens,
                                       calibrations=calibrations))
    if "update" in programs:
        lowered, tokens, jaxpr = lower_update(cfg, mesh, abstract)
        # 6·N per trained token: the forward (2·N), the activations' gradients (2·N) and the weights' (2·N);
        # with LoRA the frozen weights get no gradient (4·N, and 6 per adapter parameter).
        frozen = n - abstract.num_trained
        reports.append(_program_report("update", *_compile(lowered), jaxpr, chip, chips,
                                       (6 * abstract.num_trained + 4 * frozen) * tokens, calibrations=calibrations,
                                       packing=cfg.packing))
    hosts = len({d.process_index for d in devices})
    policy = nnx.merge(abstract.graphdef, abstract.state.params, abstract.rest)
    attention = policy.decoder.attention_implementation(mesh.abstract_mesh).name
    return Report(topology, chip.name, len(devices), hosts, dict(mesh.shape), cfg.model, abstract.num_params, reports,
                  attention, dataclasses.asdict(cfg.lora) if cfg.lora else None, abstract.num_trained, rollout)


def fits_everywhere(report: Report) -> bool:
    return all(p.fits for p in report.programs)


def per_chip_bytes(tree) -> int:
    """Bytes one chip holds of an abstract, sharded tree (for checking that a layout divides the state)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += int(np.prod(shard, dtype=np.int64)) * _itemsize(leaf.dtype)
    return total


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # a typed PRNG key: its key data's bytes
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
        return int(np.prod(data.shape)) * data.dtype.itemsize
    return jnp.dtype(dtype).itemsize
