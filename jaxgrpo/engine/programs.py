"""The rollout engine's compiled programs: pure functions of the weights, the paged pool and small per-row arrays.

`Engine` (`jaxgrpo.engine.engine`) schedules; these run on the device, each jitted with the pool donated:
`forward_program` (prefill or extend: new tokens after each row's cached positions, then one draw per sample
row), `decode_program` (a chunk of decode steps over every slot, a `lax.while_loop`), `copy_program` (copy-on-write
of blocks). On a mesh the slots and the pool's blocks split over its batch axes (`distributed.batch_axes`: `data`
and `fsdp`, as the decoder's activations split their rows), and the paged reads and writes run per row shard
(`jax.shard_map`).
`trace_programs` traces them at abstract shapes for `jaxgrpo.tools.compile`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgrpo.distributed import batch_axes
from jaxgrpo.engine import paged
from jaxgrpo.engine.blocks import blocks_for
from jaxgrpo.models import backend as backends
from jaxgrpo.models.paged_cache import PagedKVCache, PagedRows, per_shard
from jaxgrpo.sampler.distribution import SamplingParams, sample_tokens
from jaxgrpo.sampler.requests import bucket_length

logger = logging.getLogger(__name__)

STOP_SLOTS = 8
"""Stop tokens a request may have (padded with -1, never a token, so the set never recompiles)."""

_COMPILATIONS: collections.Counter = collections.Counter()


def compilation_counts() -> dict[str, int]:
    """How many times each engine program was traced in this process (`"forward"`, `"decode"`, `"copy"`)."""
    return dict(_COMPILATIONS)


def _draw(base_keys, indices, logits, samplings: tuple[SamplingParams, ...], choice):
    """Each row's token from `logits` [R, V] under `samplings[choice[r]]`, keyed by (its base key, its draw index:
    the token's position less its request's `draw_origin`)."""
    keys = jax.vmap(jax.random.fold_in)(base_keys, indices)
    draws = [sample_tokens(keys, logits, params) for params in samplings]
    if len(draws) == 1:
        return draws[0]
    return tuple(jnp.stack(parts)[choice, jnp.arange(logits.shape[0])] for parts in zip(*draws))


def init_pool(config, num_blocks: int, block_size: int, dtype, mesh: jax.sharding.Mesh | None = None) -> PagedKVCache:
    """An empty pool as the engine keeps it between programs: in the program's memory forms' carried form (on
    XLA:CPU a bfloat16 pool as its bits, which XLA:CPU gathers and scatters in place, where a bfloat16 one it
    converts whole on the way in and out of every program); laid out over `mesh`'s row shards."""
    def init():
        return backends.memory_for_program().to_carry(paged.init_paged_cache(config, num_blocks, block_size, dtype))

    return init() if mesh is None else jax.jit(init, out_shardings=NamedSharding(mesh, pool_spec(mesh)))()


def _as_model_reads(cache, dtype):
    """The pool as `init_pool` keeps it, read as `dtype`: a bitcast, which XLA cancels against the paged reads' and
    writes' own (`paged`), so the pool's bits are read and written in place."""
    return backends.memory_for_program().from_carry(cache, dtype)


def _as_stored(cache, stored):
    """The pool back in the form the engine keeps it in (`stored`: the program's input)."""
    return cache if cache.k.dtype == stored.k.dtype else backends.memory_for_program().to_carry(cache)


def pool_spec(mesh: jax.sharding.Mesh) -> P:
    """The pool's layout, [layers, blocks, ...], and a dense view's, [layers, rows, ...]: each row shard its own."""
    return P(None, batch_axes(mesh))


def _read(cache, tables, lengths, starts=None, *, width, new, mesh):
    """`paged.dense_view` on each row shard."""
    def view(*args):  # (cache, tables, lengths[, starts])
        return paged.dense_view(*args[:3], width, new, *args[3:])

    arrays = (cache, tables, lengths) if starts is None else (cache, tables, lengths, starts)
    return per_shard(view, mesh, ("pool",) + ("rows",) * (len(arrays) - 1), ("pool", "rows"))(*arrays)


def _write(cache, tables, start, view, width, counts, *, mesh):
    """`paged.write` of a dense view's columns from `width` on, on each row shard (sliced as the program's memory
    forms carry the view: XLA:CPU slices a bfloat16 view through a float32 copy of it whole)."""
    forms = backends.memory_for_program()
    keys, values = (forms.from_carry(forms.to_carry(x)[:, :, :, width:], x.dtype) for x in (view.k, view.v))
    return per_shard(paged.write, mesh, ("pool", "rows", "rows", "pool", "pool", "rows"), "pool")(
        cache, tables, start, keys, values, counts)


def _hidden_after(model, cache, tables, lengths, tokens, counts, width, mesh):
    """Run each row's `counts[r]` new tokens `tokens` [R, T] (right-padded) after its `lengths[r]` cached
    positions: (the hidden state after each row's last new token [R, E], the pool with the new keys written)."""
    rows, new = tokens.shape
    view, cached = _read(cache, tables, lengths, width=width, new=new, mesh=mesh)
    steps = jnp.arange(new)[None]
    kv_mask = jnp.concatenate([cached, steps < counts[:, None]], axis=1)
    hidden, view = model.decode_step(tokens, lengths[:, None] + steps, cache=view, cache_index=width, kv_mask=kv_mask)
    cache = _write(cache, tables, lengths, view, width, counts, mesh=mesh)
    last = hidden[jnp.arange(rows), jnp.maximum(counts - 1, 0)]
    return last, cache


def engine_forward(graphdef, state, cache, tables, lengths, tokens, counts, sample_rows, key, ids, origins, choice, *,
                   width, samplings, mesh):
    """Prefill or extend: run new tokens into the cache, then draw one token for each sample row.

    Sample row i draws from row `sample_rows[i]`'s logits (the G samples of one prompt share its prefill),
    at that row's next position, keyed by request `ids[i]` and that position less `origins[i]`. Returns (cache,
    tokens, logprobs, policy_logprobs), the last three [I].
    """
    _COMPILATIONS["forward"] += 1
    logger.info("compiling engine forward: %d rows x %d tokens after %d cached, %d draws",
                tokens.shape[0], tokens.shape[1], width, sample_rows.shape[0])
    model = nnx.merge(graphdef, state)
    last, pool = _hidden_after(model, _as_model_reads(cache, model.dtype), tables, lengths, tokens, counts, width, mesh)
    logits = model.logits_from_hidden(last[sample_rows])
    positions = (lengths + counts)[sample_rows]
    base_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)
    return (_as_stored(pool, cache), *_draw(base_keys, positions - origins, logits, samplings, choice))


class _DecodeCarry(NamedTuple):
    step: jax.Array
    memory: Any  # the chunk's dense KVCache [L, S, kv, width + steps, D] as the memory forms carry it, or the pool
    # (a PagedKVCache) where the blocks are read in place
    kv_mask: jax.Array | None  # bool [S, width + steps] (None: read in place)
    lengths: jax.Array  # int32 [S]
    pending: jax.Array  # int32 [S], each row's next input
    running: jax.Array  # bool [S]
    remaining: jax.Array  # int32 [S]
    finished: jax.Array  # int32, rows that stopped in this chunk
    tokens: jax.Array  # int32 [S, K]
    logprobs: jax.Array  # float32 [S, K]
    policy_logprobs: jax.Array  # float32 [S, K]


def _keep_going(c, *, steps, exit_after):
    """Whether a decode chunk takes another step: steps left, a row running, fewer than `exit_after` finished."""
    return (c.step < steps) & jnp.any(c.running) & (c.finished < exit_after)


def _drawn(c, logits, base_keys, origins, samplings, choice, stop_tokens) -> dict:
    """A decode step's draw from `logits` [S, V] for the running rows of carry `c`: the carry's fields after it
    (the step counted, lengths, next inputs, which rows still run, the budgets, the finished count, and the token,
    log-prob and policy log-prob recorded at column `c.step`)."""
    live = c.running.astype(jnp.int32)
    lengths = c.lengths + live
    tokens, logprobs, policy_logprobs = _draw(base_keys, lengths - origins, logits, samplings, choice)
    stopped = c.running & jnp.any(tokens[:, None] == stop_tokens, axis=1)
    remaining = c.remaining - live
    ended = c.running & (stopped | (remaining <= 0))

    def put(buffer, values):
        return jax.lax.dynamic_update_slice(buffer, jnp.where(c.running, values, 0).astype(buffer.dtype)[:, None],
                                            (0, c.step))

    return dict(step=c.step + 1, lengths=lengths, pending=jnp.where(c.running, tokens, c.pending),
                running=c.running & ~ended, remaining=remaining, finished=c.finished + ended.sum(dtype=jnp.int32),
                tokens=put(c.tokens, tokens), logprobs=put(c.logprobs, logprobs),
                policy_logprobs=put(c.policy_logprobs, policy_logprobs))


class SharedPrefixes(NamedTuple):
    """A decode chunk's shared prefixes: rows [i * share, (i + 1) * share) read prefix row i (the decoder's
    `prefix` contract), its first `lengths[i]` positions through block table `tables[i]`; each row's own
    view starts at position `starts[r]` (its prefix row's length; 0 in a row with no prefix)."""

    tables: jax.Array  # int32 [R / share, M]
    lengths: jax.Array  # int32 [R / share]
    starts: jax.Array  # int32 [R]


def engine_decode(graphdef, state, cache, tables, lengths, pending, running, remaining, stop_tokens, key, ids, origins,
                  choice, exit_after, prefixes=None, *, width, steps, samplings, mesh, prefix_width=0, in_place=False):
    """Up to `steps` decode steps for every running row; stops early once `exit_after` rows have finished.

    With `in_place` the steps read the rows' blocks in place (`_paged_decode`; `width` and `prefix_width` 0), which
    the engine chooses where the backend has a paged kernel (`reads_pages_in_place`). Otherwise:

    The rows' blocks are gathered once into a dense view with `steps` free columns after them; step k feeds
    each running row's pending token at column `width + k` (its position `lengths[r]`), a decode step of the
    decoder with a run-time cache index like the sampler's, and draws the token at the next position. A row
    runs from step 0 until it stops, so its new keys fill columns [width, width + k_r), written back to its
    blocks when the chunk ends. Returns (cache, final carry); row r sampled `tokens[r, :k_r]`, its length grew
    by k_r.

    With `prefixes` (`SharedPrefixes`), the rows that share a prompt's blocks read them once, as one prefix
    row of `prefix_width` columns (the decoder's shared prefix: their queries stacked into one product), and
    their dense views hold only the positions after it.
    """
    _COMPILATIONS["decode"] += 1
    model = nnx.merge(graphdef, state)
    stored, cache = cache, _as_model_reads(cache, model.dtype)
    base_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)
    packed_weights = model.pack_weights()  # on a CPU, bfloat16 weights packed for one-token products
    if in_place:
        logger.info("compiling engine decode: %d slots reading their blocks in place, %d steps a chunk%s",
                    lengths.shape[0], steps,
                    "" if prefixes is None else f", {prefixes.lengths.shape[0]} shared prefixes")
        cache, final = _paged_decode(model, packed_weights, cache, tables, lengths, pending, running, remaining,
                                     stop_tokens, base_keys, origins, choice, exit_after, prefixes, steps=steps,
                                     samplings=samplings, mesh=mesh)
        return _as_stored(cache, stored), final
    logger.info("compiling engine decode: %d slots, %d cached columns, %d steps a chunk%s", lengths.shape[0], width,
                steps, "" if prefixes is None else f", {prefixes.lengths.shape[0]} shared prefixes of {prefix_width}")
    slots = lengths.shape[0]
    forms = backends.memory_for_program()
    prefix = prefix_mask = None
    if prefixes is not None:
        prefix, prefix_mask = _read(cache, prefixes.tables, prefixes.lengths, width=prefix_width, new=0, mesh=mesh)
    view, cached = _read(cache, tables, lengths, None if prefixes is None else prefixes.starts, width=width,
                         new=steps, mesh=mesh)

    def one_step(c: _DecodeCarry) -> _DecodeCarry:
        column = width + c.step
        kv_mask = jax.lax.dynamic_update_slice(c.kv_mask, c.running[:, None], (0, column))
        hidden, view = model.decode_step(c.pending[:, None], c.lengths[:, None],
                                         cache=forms.from_carry(c.memory, model.dtype), cache_index=column,
                                         kv_mask=kv_mask, prefix=prefix, prefix_mask=prefix_mask,
                                         packed_weights=packed_weights)
        logits = model.logits_from_hidden(hidden[:, 0], packed_weights)
        return c._replace(memory=forms.to_carry(view), kv_mask=kv_mask,
                          **_drawn(c, logits, base_keys, origins, samplings, choice, stop_tokens))

    zeros = lambda dtype: jnp.zeros((slots, steps), dtype)  # noqa: E731
    carry = _DecodeCarry(jnp.int32(0), forms.to_carry(view), jnp.concatenate([cached, zeros(bool)], axis=1), lengths,
                         pending, running, remaining, jnp.int32(0), zeros(jnp.int32), zeros(jnp.float32),
                         zeros(jnp.float32))
    final = jax.lax.while_loop(functools.partial(_keep_going, steps=steps, exit_after=exit_after), one_step, carry)
    cache = _write(cache, tables, lengths, forms.from_carry(final.memory, model.dtype), width, final.lengths - lengths,
                   mesh=mesh)
    return _as_stored(cache, stored), final._replace(memory=None, kv_mask=None)  # the view is written back


def reads_pages_in_place(model, mesh) -> bool:
    """Whether the engine's decode reads the pool's blocks in place on this backend (`Backend.reads_pages_in_place`:
    the attention implementation has a paged kernel: `pallas_tpu`, `pallas_gpu`), rather than through dense views
    gathered once a chunk (the reference form, which the CPU's cache reader runs fastest)."""
    return model.backend(mesh).reads_pages_in_place


def _paged_decode(model, packed_weights, cache, tables, lengths, pending, running, remaining, stop_tokens, base_keys,
                  origins, choice, exit_after, prefixes, *, steps, samplings, mesh):
    """`engine_decode` reading the rows' blocks in place (`Decoder.paged_decode_step`): no dense view; each step
    writes its running rows' keys and values to their blocks (the others' to the null block) and reads each row's
    positions, and its shared prefix's, through the block tables. Returns what `engine_decode` does."""
    slots = lengths.shape[0]
    starts = jnp.zeros_like(lengths) if prefixes is None else prefixes.starts

    def one_step(c: _DecodeCarry) -> _DecodeCarry:
        rows = PagedRows(c.memory, tables, starts, c.lengths)
        prefix = None if prefixes is None else PagedRows(c.memory, prefixes.tables, jnp.zeros_like(prefixes.lengths),
                                                         prefixes.lengths)
        hidden, pool = model.paged_decode_step(c.pending[:, None], cache=rows, prefix=prefix, running=c.running,
                                               mesh=mesh, packed_weights=packed_weights)
        logits = model.logits_from_hidden(hidden[:, 0], packed_weights)
        return c._replace(memory=pool,
                          **_drawn(c, logits, base_keys, origins, samplings, choice, stop_tokens))

    zeros = lambda dtype: jnp.zeros((slots, steps), dtype)  # noqa: E731
    carry = _DecodeCarry(jnp.int32(0), cache, None, lengths, pending, running, remaining, jnp.int32(0),
                         zeros(jnp.int32), zeros(jnp.float32), zeros(jnp.float32))
    final = jax.lax.while_loop(functools.partial(_keep_going, steps=steps, exit_after=exit_after), one_step, carry)
    return final.memory, final._replace(memory=None)  # the pool once: not a second output to copy


def engine_copy(cache, sources, destinations, *, mesh):
    """Copy block `sources[i]` to `destinations[i]`, ids local to the row shard holding entry i."""
    _COMPILATIONS["copy"] += 1
    return per_shard(paged.copy_blocks, mesh, ("pool", "rows", "rows"), "pool")(cache, sources, destinations)


# Named engine_* so a profile's program table tells them from the trainer's programs.
forward_program = jax.jit(engine_forward, static_argnames=("graphdef", "width", "samplings", "mesh"),
                          donate_argnames=("cache",))
decode_program = jax.jit(engine_decode, static_argnames=("graphdef", "width", "steps", "samplings", "mesh",
                                                         "prefix_width", "in_place"), donate_argnames=("cache",))
copy_program = jax.jit(engine_copy, static_argnames=("mesh",), donate_argnames=("cache",))


def trace_programs(graphdef, state, *, num_slots: int, num_blocks: int, block_size: int, max_context: int,
                   prefill_rows: int, prompt_len: int, draws: int, width: int, steps: int, sampling: SamplingParams,
                   mesh: jax.sharding.Mesh | None = None, share: int = 1) -> dict[str, jax.stages.Traced]:
    """The engine's programs traced at abstract shapes, for ahead-of-time compilation (`jaxgrpo.tools.compile`).

    `graphdef`, `state`: the decoder split (`state` may be abstract, placed as the run places it). Returns
    {"engine prefill": `prefill_rows` prompts of `prompt_len` tokens into a pool of `num_blocks` blocks,
    `draws` first tokens; "engine decode": a chunk of `steps` decode steps of `num_slots` slots holding
    `width` cached positions each}. With a mesh the pool's blocks and the rows split over its row axes
    (`distributed.batch_axes`), as `Engine(mesh=...)` lays them out. With `share` > 1 the decode's rows read
    shared prefixes in groups of `share` (`SharedPrefixes`: each prompt read once for its samples, as `Engine`
    plans a chunk whose rows are the samples of a few prompts), over `prompt_len` positions.
    """
    if share < 1 or num_slots % share:
        raise ValueError(f"share must be a positive divisor of num_slots ({num_slots}), got {share}")
    model = nnx.merge(graphdef, state)
    config, dtype = model.config, model.dtype
    shape = (config.num_layers, num_blocks, config.num_kv_heads, block_size, config.head_dim)

    def abstract(shape, dtype, spec=P()):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=None if mesh is None else NamedSharding(mesh, spec))

    axes = () if mesh is None else batch_axes(mesh)
    with (contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)):  # the forms the programs are traced in
        stored = jax.eval_shape(lambda: init_pool(config, num_blocks, block_size, dtype)).k.dtype  # as Engine keeps it
    pool = PagedKVCache(abstract(shape, stored, P(None, axes)), abstract(shape, stored, P(None, axes)))
    max_blocks = blocks_for(max_context, block_size)
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = abstract(key.shape, key.dtype)

    def rows(count, *tail, dtype=jnp.int32):
        return abstract((count, *tail), dtype, P(axes))

    def replicated(count, dtype=jnp.int32):
        return abstract((count,), dtype)

    samplings = (sampling,)
    in_place = reads_pages_in_place(model, mesh)  # as `Engine` chooses: then no dense view (width 0)
    prefixes, prefix_width = None, 0
    if share > 1:
        prefixes = SharedPrefixes(rows(num_slots // share, max_blocks), rows(num_slots // share), rows(num_slots))
        prefix_width = 0 if in_place else bucket_length(prompt_len)
    with (contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)):
        prefill = forward_program.trace(
            graphdef, state, pool, rows(prefill_rows, max_blocks), rows(prefill_rows), rows(prefill_rows, prompt_len),
            rows(prefill_rows), replicated(draws), key, replicated(draws), replicated(draws), replicated(draws), width=0,
            samplings=samplings, mesh=mesh)
        decode = decode_program.trace(
            graphdef, state, pool, rows(num_slots, max_blocks), rows(num_slots), rows(num_slots),
            rows(num_slots, dtype=jnp.bool_), rows(num_slots), rows(num_slots, STOP_SLOTS), key, rows(num_slots),
            rows(num_slots), rows(num_slots), abstract((), jnp.int32), prefixes, width=0 if in_place else width,
            steps=steps, samplings=samplings, mesh=mesh, prefix_width=prefix_width, in_place=in_place)
    return {"engine prefill": prefill, "engine decode": decode}
