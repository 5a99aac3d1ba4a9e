"""The fixed-batch sampler: a batch of prompts prefilled once into a cache their G samples share, then one `while`
loop decoding a token per row per iteration until every row stops (`generate`; the package docstring says how).
Its two compiled programs are public (`prefill_program`, `decode_program`) for what lowers or replays them."""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrpo.distributed import batch_axes
from jaxgrpo.models import backend as backends, partitioning
from jaxgrpo.models.decoder import mask_positions
from jaxgrpo.sampler.distribution import SamplingParams, row_keys, sample_tokens, step_keys
from jaxgrpo.sampler.requests import (FINISH_LENGTH, FINISH_STOP, Generation, bucket_length, check_prompts,
                                      default_stop_tokens, encode_prompts, is_int_in, left_pad, model_context_window,
                                      stop_array)

logger = logging.getLogger(__name__)

_COMPILATIONS: collections.Counter = collections.Counter()


def compilation_counts() -> dict[str, int]:
    """How many times each jitted sampler function was traced and compiled in this process.

    Keys are `"prefill"` and `"decode"`; each distinct (batch, prompt bucket, completion bucket,
    sampling settings, model) adds one to both.
    """
    return dict(_COMPILATIONS)


class _DecodeState(NamedTuple):
    """The while-loop carry. `step` tokens have been generated (buffer columns [0, step))."""

    step: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    policy_logprobs: jax.Array
    lengths: jax.Array
    done: jax.Array
    finish_reason: jax.Array
    prompt_lengths: jax.Array
    kv_mask: jax.Array  # bool[B*G, N] the completion slots written so far
    keys: jax.Array
    cache: Any  # the rows' completion keys and values, KVCache [L, B*G, kv, N, D] (as the memory forms carry it)
    prompt_cache: Any  # each prompt's keys and values, stored once: KVCache [L, B, kv, P, D] (likewise)
    prompt_mask: jax.Array  # bool[B, P]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static shapes and shardings of one compiled sampler."""

    num_samples: int
    prompt_bucket: int
    new_bucket: int
    sampling: SamplingParams
    mesh: jax.sharding.Mesh | None = None
    batch_axes: tuple[str, ...] = ()  # mesh axes the batch (rows) is split over
    kv_heads_axes: Any = None  # the cache's kv-heads entry of the PartitionSpec

    @property
    def capacity(self) -> int:
        return self.prompt_bucket + self.new_bucket

    def constrain(self, x: jax.Array, *spec) -> jax.Array:
        """Shard x's leading dims as `spec` on the mesh, where the mesh axes divide them."""
        if self.mesh is None:
            return x

        def fits(entry, size):
            axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
            return entry if axes and size % math.prod(self.mesh.shape[a] for a in axes) == 0 else None

        spec = tuple(fits(entry, x.shape[i]) for i, entry in enumerate(spec))
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, PartitionSpec(*spec)))

    def constrain_rows(self, x: jax.Array) -> jax.Array:
        """Split the leading (row) axis over the batch axes."""
        return self.constrain(x, self.batch_axes or None)

    def constrain_cache(self, cache):
        """Cache leaves are [layers, batch, kv_heads, capacity, head_dim]: batch over data, heads over model."""
        return jax.tree.map(lambda x: self.constrain(x, None, self.batch_axes or None, self.kv_heads_axes), cache)


def layout_for(model, mesh, num_samples: int, prompt_bucket: int, new_bucket: int, sampling: SamplingParams) -> Layout:
    """Rows over the mesh's `data`/`fsdp` axes, the cache's kv heads as the model's rules shard them."""
    if mesh is None:
        return Layout(num_samples, prompt_bucket, new_bucket, sampling)
    if "data" not in mesh.axis_names:
        raise ValueError(f"mesh must have a 'data' axis to shard the batch over, got axes {mesh.axis_names}")
    heads = partitioning.logical_to_mesh_spec(("kv_heads",), (model.config.num_kv_heads,), mesh)[0]
    return Layout(num_samples, prompt_bucket, new_bucket, sampling, mesh, batch_axes(mesh), heads)


def _is_done(tokens: jax.Array, stop_tokens: jax.Array) -> jax.Array:
    return jnp.any(tokens[:, None] == stop_tokens[None, :], axis=-1)


def prefill(graphdef, state, prompt_tokens, prompt_mask, keys, stop_tokens, max_new_tokens, pad_id, *, layout: Layout):
    """Run the B prompts once into the prompt cache their G samples share, sample each row's first token.

    prompt_tokens/prompt_mask [B, P]; keys [B*G]; stop_tokens int32 [S]; returns a `_DecodeState`
    with step 1, the prompt cache and an empty completion cache of capacity N.
    """
    _COMPILATIONS["prefill"] += 1
    batch, prompt_len = prompt_tokens.shape
    g, n = layout.num_samples, layout.new_bucket
    logger.info("compiling sampler prefill: batch=%d x %d samples, prompt bucket %d, completion bucket %d", batch, g, prompt_len, n)
    model = nnx.merge(graphdef, state)
    prompt_tokens = layout.constrain_rows(prompt_tokens)
    prompt_mask = layout.constrain_rows(prompt_mask)
    positions = mask_positions(prompt_mask)
    cache = layout.constrain_cache(model.init_cache(batch, prompt_len))
    hidden, prompt_cache = model.decode_step(prompt_tokens, positions, cache=cache, cache_index=0, kv_mask=prompt_mask)
    # Left padding puts every prompt's last token in the last column.
    last_logits = model.logits_from_hidden(hidden[:, -1])
    last_logits = layout.constrain_rows(jnp.repeat(last_logits, g, axis=0))

    rows = batch * g
    tokens, logprobs, policy_logprobs = sample_tokens(step_keys(keys, 0), last_logits, layout.sampling)
    done = _is_done(tokens, stop_tokens)

    def first_column(x, fill):
        return layout.constrain_rows(jnp.full((rows, n), fill, x.dtype).at[:, 0].set(x))

    forms = backends.memory_for_program()
    return _DecodeState(
        step=jnp.int32(1),
        tokens=first_column(tokens, pad_id),
        logprobs=first_column(logprobs, 0.0),
        policy_logprobs=first_column(policy_logprobs, 0.0),
        lengths=jnp.ones((rows,), jnp.int32),
        done=done | (max_new_tokens <= 1),
        finish_reason=jnp.where(done, FINISH_STOP, 0).astype(jnp.int32),
        prompt_lengths=jnp.repeat(prompt_mask.sum(axis=1, dtype=jnp.int32), g),
        kv_mask=layout.constrain_rows(jnp.zeros((rows, n), bool)),
        keys=keys,
        cache=forms.to_carry(layout.constrain_cache(model.init_cache(rows, n))),
        prompt_cache=forms.to_carry(layout.constrain_cache(prompt_cache)),
        prompt_mask=prompt_mask,
    )


def decode_loop(graphdef, state, carry: _DecodeState, stop_tokens, max_new_tokens, pad_id, *, layout: Layout) -> _DecodeState:
    """The decode `lax.while_loop`: one token per row per iteration until all rows are done.

    Iteration t feeds token t-1 at completion-cache slot t - 1 (position prompt_length + t - 1) and
    samples token t; finished rows keep running (static shapes) but record `pad_id`, masked out.
    The carry (cache included) is donated, so XLA updates it in place.
    """
    _COMPILATIONS["decode"] += 1
    logger.info(
        "compiling sampler decode: %d rows, prompt bucket %d, completion bucket %d (cache capacity %d)",
        carry.tokens.shape[0], layout.prompt_bucket, layout.new_bucket, layout.capacity,
    )
    model = nnx.merge(graphdef, state)
    rows = carry.tokens.shape[0]
    # On CPU, bfloat16 weights packed once for the one-token products (cpu_matmul); None elsewhere.
    packed_weights = model.pack_weights()
    forms = backends.memory_for_program()

    def keep_going(s: _DecodeState):
        return (s.step < max_new_tokens) & ~jnp.all(s.done)

    def one_token(s: _DecodeState) -> _DecodeState:
        previous = jax.lax.dynamic_slice_in_dim(s.tokens, s.step - 1, 1, axis=1)
        slot = s.step - 1
        kv_mask = jax.lax.dynamic_update_slice(s.kv_mask, jnp.ones((rows, 1), bool), (0, slot))
        positions = (s.prompt_lengths + s.step - 1)[:, None]
        # The caches ride the loop as the memory forms carry them (on a CPU, a bfloat16 cache as its bits:
        # no whole-cache copy per step on XLA:CPU).
        hidden, cache = model.decode_step(previous, positions, cache=forms.from_carry(s.cache, model.dtype),
                                          cache_index=slot, kv_mask=kv_mask,
                                          prefix=forms.from_carry(s.prompt_cache, model.dtype),
                                          prefix_mask=s.prompt_mask, packed_weights=packed_weights)
        logits = model.logits_from_hidden(hidden[:, 0], packed_weights)
        cache = forms.to_carry(layout.constrain_cache(cache))
        tokens, logprobs, policy_logprobs = sample_tokens(step_keys(s.keys, s.step), logits, layout.sampling)
        live = ~s.done
        stopped = live & _is_done(tokens, stop_tokens)

        def write(buffer, column, fill):
            column = jnp.where(live, column, fill).astype(buffer.dtype)
            return jax.lax.dynamic_update_slice(buffer, column[:, None], (0, s.step))

        return _DecodeState(
            step=s.step + 1,
            tokens=write(s.tokens, tokens, pad_id),
            logprobs=write(s.logprobs, logprobs, 0.0),
            policy_logprobs=write(s.policy_logprobs, policy_logprobs, 0.0),
            lengths=s.lengths + live.astype(jnp.int32),
            done=s.done | stopped | (s.step + 1 >= max_new_tokens),
            finish_reason=jnp.where(stopped, FINISH_STOP, s.finish_reason),
            prompt_lengths=s.prompt_lengths,
            kv_mask=kv_mask,
            keys=s.keys,
            cache=cache,
            prompt_cache=s.prompt_cache,
            prompt_mask=s.prompt_mask,
        )

    final = jax.lax.while_loop(keep_going, one_token, carry)
    return final._replace(finish_reason=jnp.where(final.finish_reason == FINISH_STOP, FINISH_STOP, FINISH_LENGTH))


# The two compiled programs of `generate`, public for what lowers or replays them (`jaxgrpo.tools.compile`, benchmarks).
prefill_program = jax.jit(prefill, static_argnames=("graphdef", "layout"))
decode_program = jax.jit(decode_loop, static_argnames=("graphdef", "layout"), donate_argnames=("carry",))


def _run(graphdef, state, prompt_tokens, prompt_mask, keys, stop_tokens, max_new_tokens: int, pad_id: int, layout: Layout) -> _DecodeState:
    """Prefill then decode with a given layout (`generate` without the checks; benchmarks use it
    to pick the cache capacity). Returns the final loop state; its buffers hold `layout.new_bucket` columns."""
    stop = stop_array(stop_tokens)
    limit, pad = jnp.int32(max_new_tokens), jnp.int32(pad_id)
    carry = prefill_program(graphdef, state, prompt_tokens, prompt_mask, keys, stop, limit, pad, layout=layout)
    return decode_program(graphdef, state, carry, stop, limit, pad, layout=layout)


def _mesh_of(state) -> jax.sharding.Mesh | None:
    """The mesh the policy's parameters live on, if they are sharded over more than one device."""
    for leaf in jax.tree.leaves(state):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
            return sharding.mesh
    return None


def _checked_request(model, prompts, num_samples, max_new_tokens, key, sampling: SamplingParams, prompt_ids, pad_id,
                     context_window):
    """`generate`'s arguments checked, each error one line: (prompts as token lists, i32[B] prompt ids, the key)."""
    if not is_int_in(num_samples, 1):
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    if not is_int_in(max_new_tokens, 1):
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if key is None:
        if not sampling.greedy:
            raise ValueError("key is required to sample (pass jax.random.key(seed)), or set greedy=True")
        key = jax.random.key(0)
    vocab_size = model.config.vocab_size
    prompts = check_prompts(prompts, vocab_size, model_context_window(model, context_window), int(max_new_tokens))
    if prompt_ids is None:
        prompt_ids = np.arange(len(prompts), dtype=np.int32)
    prompt_ids = np.asarray(prompt_ids, np.int32).reshape(-1)
    if prompt_ids.shape[0] != len(prompts):
        raise ValueError(f"prompt_ids has {prompt_ids.shape[0]} entries but there are {len(prompts)} prompts")
    if not 0 <= pad_id < vocab_size:
        raise ValueError(f"pad_id must be a token id in [0, {vocab_size}), got {pad_id}")
    return prompts, prompt_ids, key


def generate(
    model: nnx.Module,
    prompts: Sequence[Sequence[int]],
    *,
    num_samples: int = 1,
    max_new_tokens: int = 256,
    key: jax.Array | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    greedy: bool = False,
    stop_tokens: Sequence[int] = (),
    prompt_ids: Sequence[int] | None = None,
    pad_id: int = 0,
    context_window: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> Generation:
    """Sample `num_samples` completions for each prompt with a KV cache.

    Args:
      model: the policy, a `flax.nnx` decoder with `init_cache`, `decode_step`,
        `logits_from_hidden` and the cached call contract of `jaxgrpo.models.decoder`.
      prompts: B token id lists of any lengths (each non-empty).
      num_samples: G >= 1 completions per prompt.
      max_new_tokens: N >= 1, the most tokens a completion may have.
      key: PRNG key; required unless greedy.
      temperature, top_k, top_p, min_p, greedy: the sampling distribution (see `SamplingParams`).
      stop_tokens: token ids that end a completion (e.g. EOS and `<|im_end|>`); the stop token
        is part of the completion.
      prompt_ids: int [B], a stable id per prompt for its PRNG stream (default 0..B-1); pass
        dataset indices to make samples independent of batching.
      pad_id: token written after a row finished and used to left-pad prompts.
      context_window: the most positions a row may use, prompt plus `max_new_tokens` (default: the
        model config's `max_position_embeddings` if it has one).
      mesh: a mesh with `data` (and optionally `model`) axes to shard rows over (default: the
        mesh of the model's parameters, if they are sharded).

    Returns:
      A `Generation` with B*G rows.
    """
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, greedy=greedy)
    prompts, prompt_ids, key = _checked_request(model, prompts, num_samples, max_new_tokens, key, sampling, prompt_ids,
                                                pad_id, context_window)
    graphdef, state = nnx.split(model)
    mesh = mesh if mesh is not None else _mesh_of(state)
    prompt_bucket = bucket_length(max(len(p) for p in prompts))
    layout = layout_for(model, mesh, num_samples, prompt_bucket, bucket_length(max_new_tokens), sampling)
    tokens, mask = left_pad(prompts, prompt_bucket, pad_id)
    row_tokens, row_mask = (jnp.repeat(jnp.asarray(x), num_samples, axis=0) for x in (tokens, mask))
    keys = row_keys(key, prompt_ids, num_samples)
    final = _run(graphdef, state, tokens, mask, keys, stop_tokens, max_new_tokens, pad_id, layout)

    n = max_new_tokens
    return Generation(
        prompt_tokens=row_tokens, prompt_mask=row_mask, completion_tokens=final.tokens[:, :n],
        completion_mask=jnp.arange(n) < final.lengths[:, None], logprobs=final.logprobs[:, :n],
        policy_logprobs=final.policy_logprobs[:, :n], finish_reason=final.finish_reason,
        prompt_index=jnp.repeat(jnp.arange(len(prompt_ids), dtype=jnp.int32), num_samples),
    )


def generate_text(
    model: nnx.Module,
    tokenizer,
    prompts: Sequence[str] | Sequence[Sequence[dict]],
    *,
    num_samples: int = 1,
    max_new_tokens: int = 256,
    seed: int = 0,
    chat_template: bool | None = None,
    stop_tokens: Sequence[int] | None = None,
    skip_special_tokens: bool = True,
    **sampling,
) -> list[list[str]]:
    """Generate from text prompts and decode: `result[b][g]` is completion g of prompt b.

    Args:
      model, tokenizer: as returned by `jaxgrpo.models.load`.
      prompts: strings, or conversations (lists of `{"role": ..., "content": ...}` messages).
      num_samples, max_new_tokens: as in `generate`.
      seed: PRNG seed of the sampling (ignored when greedy).
      chat_template: apply the tokenizer's chat template (default: when it has one).
      stop_tokens: default `default_stop_tokens(tokenizer)` (EOS, `<|im_end|>`, ...).
      skip_special_tokens: drop special tokens (the stop token among them) from the text.
      **sampling: `temperature`, `top_k`, `top_p`, `min_p`, `greedy` and the other keyword
        arguments of `generate`.
    """
    if isinstance(prompts, (str, bytes)):
        raise TypeError("prompts must be a list of strings or conversations, got a single string; wrap it in a list")
    token_prompts = encode_prompts(tokenizer, prompts, chat_template=chat_template)
    rollout = generate(
        model, token_prompts, num_samples=num_samples, max_new_tokens=max_new_tokens, key=jax.random.key(seed),
        stop_tokens=default_stop_tokens(tokenizer) if stop_tokens is None else stop_tokens,
        pad_id=sampling.pop("pad_id", tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0), **sampling,
    )
    tokens, mask = np.asarray(rollout.completion_tokens), np.asarray(rollout.completion_mask)
    texts = [tokenizer.decode(row[keep].tolist(), skip_special_tokens=skip_special_tokens) for row, keep in zip(tokens, mask)]
    return [texts[b * num_samples:(b + 1) * num_samples] for b in range(len(token_prompts))]
