"""A run's programs traced and lowered at its shapes from shapes alone (no weights read), laid out on a mesh as
the trainer lays them out: the policy's abstract train state, the update, the log-prob forward, the rollout
engine's programs; and a lowered program compiled, or refused for its size."""

from __future__ import annotations

import math
import re
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgrpo.config import Config, resolve_packing
from jaxgrpo.distributed import BATCH_AXES, batch_shards, round_up
from jaxgrpo.tools.compile.analysis import itemsize


ENGINE_BLOCK_SIZE, ENGINE_DECODE_CHUNK = 16, 8


class OutOfMemory(NamedTuple):
    """A program the TPU compiler refused: what it needs does not fit the chip's HBM."""

    message: str  # the compiler's first line, e.g. "... HLO temporaries (33.05G) exceeds available HBM (15.75G)."

    def required_bytes(self) -> int:
        found = re.search(r"\(([0-9.]+)([KMGT])\) exceeds", self.message)
        return int(float(found.group(1)) * 1024 ** " KMGT".index(found.group(2))) if found else 0


def compile_lowered(lowered):
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


def decoder_config(cfg: Config):
    """The policy's architecture for `cfg.model`, without weights: a code-built model's own, else the
    checkpoint's config (`models.load_config`)."""
    from jaxgrpo import models, train

    if cfg.model in train.MODEL_BUILDERS:
        model = nnx.eval_shape(
            lambda: train.MODEL_BUILDERS[cfg.model](dtype=getattr(jnp, cfg.dtype), remat=cfg.decoder_remat)[0])
        return model.config
    return models.load_config(cfg.model)


class Abstract(NamedTuple):
    """What the programs are traced with: the policy's graph, its read-only state (`rest`: with LoRA the base
    weights), the optimizer, the abstract train state (every leaf a `ShapeDtypeStruct` carrying its sharding),
    and the parameter counts: the whole policy's and the trained ones' (the same without LoRA), and the untied input
    embedding's, which a token reads by a lookup (no FLOPs; a tied one is the unembedding's product)."""

    graphdef: Any
    rest: Any
    optimizer: optax.GradientTransformation
    state: Any
    num_params: int
    num_trained: int = 0
    decoder_graphdef: Any = None  # the policy's decoder alone (the sampler's programs take it with its state)
    num_lookup: int = 0
    lookup_trained: bool = False  # the untied input embedding is among the trained parameters (not with LoRA)

    @property
    def matmul_params(self) -> int:
        """The parameters a token's forward multiplies by: the N of the model FLOPs' 2·N and 6·N. Counting an untied
        input embedding too had put Qwen3-14B's estimated prefill MFU at 102%."""
        return self.num_params - self.num_lookup

    @property
    def matmul_trained(self) -> int:
        """The trained parameters a token's forward multiplies by (the 6 of 6·N; the frozen ones get 4)."""
        return self.num_trained - (self.num_lookup if self.lookup_trained else 0)


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
        policy = train.Policy(train.adapt(Decoder(config, dtype=dtype, param_dtype=dtype, remat=cfg.decoder_remat,
                                                  scan_layers=cfg.scan_layers, attention=cfg.attention,
                                                  rngs=nnx.Rngs(0)), cfg),
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
    lookup = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    lookup_trained = any(jax.tree_util.keystr(path).endswith("['embed']")
                         for path, _ in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(params)))
    return Abstract(graphdef, rest, optimizer, state, trained + frozen, trained, decoder_graphdef, lookup,
                    lookup_trained)


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
        packed_shape = (groups, packing.packed_length(cfg.sampling.max_prompt_len + cfg.group_size * completion),
                        cfg.group_size)
        replicated = NamedSharding(mesh, P())
        layout = ((_sharded((num_micro, groups), jnp.int32, replicated),) * 2,)
    state_sharding = jax.tree.map(lambda x: x.sharding, abstract.state)
    update = train.make_update_fn(cfg, abstract.graphdef, abstract.rest, abstract.optimizer, mesh, state_sharding,
                                    packed_shape)
    with jax.set_mesh(mesh):
        traced = update.trace(abstract.state, batch, *layout)
        return traced.lower(), num_micro * micro * length, traced.jaxpr


def lower_forward(cfg: Config, mesh, abstract: Abstract):
    """The lowered reference / old-policy log-prob forward over one step's batch (the trainer's own,
    `train.step.make_forward_fn`), its tokens per call, and its jaxpr."""
    from jaxgrpo.train import step

    _, _, length, completion = _batch_shapes(cfg)
    rows = NamedSharding(mesh, P(BATCH_AXES))
    forward = step.make_forward_fn(cfg, abstract.graphdef, abstract.rest)
    shape = (cfg.batch_size, length)
    with jax.set_mesh(mesh):
        traced = forward.trace(abstract.state.params, _sharded(shape, jnp.int32, rows),
                               _sharded(shape, jnp.bool_, rows), _sharded(shape, jnp.int32, rows), completion)
        return traced.lower(), cfg.batch_size * length, traced.jaxpr


def _abstract_decoder(abstract: Abstract) -> tuple:
    """The policy's decoder (abstract), its graph as split while tracing (`abstract_train_state`: a QLoRA base is
    state, not graph) and its state from the policy's, as placed: what the sampler's and engine's programs take."""
    decoder = nnx.merge(abstract.graphdef, abstract.state.params, abstract.rest).decoder
    state = nnx.merge_state(*(part["decoder"] for part in (abstract.state.params, abstract.rest) if "decoder" in part))
    return decoder, abstract.decoder_graphdef, state


class EnginePrograms(NamedTuple):
    """The rollout engine's compiled programs at one fill level, and what the report needs of them."""

    prefill: tuple  # (compiled, compile seconds, jaxpr)
    decode: tuple
    prompt_tokens: int  # per prefill call
    draws: int  # rows the prefill computes logits for and draws from: a slot per sample
    decode_tokens: int  # per decode chunk: slots x steps
    live_tokens: int  # positions the pool holds (every slot at the fill level)
    pool_bytes: int  # the pool's bytes per chip


def lower_engine(cfg: Config, mesh, abstract: Abstract, fill: float, processes: int = 1) -> EnginePrograms:
    """The engine's prefill and decode chunk (`jaxgrpo.engine.trace_programs`) for one step's requests: a slot
    per sample, a pool of blocks holding `fill` of every slot's whole context (prompt and completion), the
    decode chunk reading that many cached positions. Its blocks and slots split over the mesh's data and fsdp axes
    (`distributed.batch_shards`). With `processes` > 1, one process's engine (`mesh` its own chips): its share of
    the prompts and samples."""
    from jaxgrpo import engine, sampler

    decoder, graphdef, state = _abstract_decoder(abstract)
    s, g = cfg.sampling, cfg.group_size
    prompts = -(-cfg.prompts_per_step // processes)
    shards, block = batch_shards(mesh), ENGINE_BLOCK_SIZE
    slots = round_up(prompts * g, shards)  # a slot per sample, as many on each shard (the trainer's engine)
    context = s.max_prompt_len + s.max_new_tokens
    live = max(block, math.ceil(fill * context / block) * block)  # positions per slot, whole blocks
    num_blocks = shards * (slots // shards * (live // block) + 1)
    rows = round_up(prompts, shards)
    traced = engine.trace_programs(
        graphdef, state, num_slots=slots, num_blocks=num_blocks, block_size=block, max_context=context,
        prefill_rows=rows, prompt_len=sampler.bucket_length(s.max_prompt_len), draws=slots, width=live,
        steps=ENGINE_DECODE_CHUNK, mesh=mesh,
        sampling=sampler.SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p))
    c = decoder.config
    pool_bytes = 2 * c.num_layers * num_blocks * c.num_kv_heads * block * c.head_dim * itemsize(decoder.dtype)
    with jax.set_mesh(mesh):
        compiled = {name: (*compile_lowered(t.lower()), t.jaxpr) for name, t in traced.items()}
    return EnginePrograms(compiled["engine prefill"], compiled["engine decode"], rows * s.max_prompt_len, slots,
                          slots * ENGINE_DECODE_CHUNK, slots * live, pool_bytes // shards)
