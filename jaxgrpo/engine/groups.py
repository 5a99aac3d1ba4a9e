"""G samples of each prompt through a rollout engine, as one `sampler.Generation`: `generate_groups` through a
given engine (the trainer's sampling), `generate` through one made for the call, `generate_text` from text to text.

    rollout = engine.generate(model, prompts, num_samples=8, max_new_tokens=256, key=jax.random.key(0),
                              temperature=1.0, top_p=0.95, stop_tokens=[eos])
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from jaxgrpo.distributed import batch_shards, round_up
from jaxgrpo.engine.engine import Engine
from jaxgrpo.engine.sequences import Request
from jaxgrpo.sampler.distribution import SamplingParams
from jaxgrpo.sampler.requests import (FINISH_LENGTH, FINISH_STOP, Generation, bucket_length, check_prompts,
                                      default_stop_tokens, encode_prompts, is_int_in, left_pad, model_context_window)


def generate_groups(engine: Engine, prompts: Sequence[Sequence[int]], *, num_samples: int, max_new_tokens: int,
                    sampling: SamplingParams, key: jax.Array | None = None, stop_tokens: Sequence[int] = (),
                    prompt_ids: Sequence[int] | None = None, pad_id: int = 0) -> Generation:
    """`num_samples` completions of each prompt through `engine`.

    Sample g of prompt b is request `prompt_ids[b] * G + g` (default ids 0..B-1) with its draws counted from the
    completion's start: they depend on that id and the token's index in the completion only (`sampler.row_keys`,
    `step_keys`), not on the engine's slots or the other prompts. Rows are prompt-major and padded as
    `sampler.Generation` says (prompts left-padded to their bucket,
    completions right-padded with `pad_id` to `max_new_tokens`); `logprobs` are the behaviour log-probs,
    `policy_logprobs` the untruncated ones.
    """
    # The sampler's checks and one-line errors first (a prompt whose row would run past the model's window).
    prompts = check_prompts(prompts, engine.config.vocab_size, engine.context_window, max_new_tokens)
    g, n = int(num_samples), int(max_new_tokens)
    ids = np.arange(len(prompts)) if prompt_ids is None else np.asarray(prompt_ids, np.int64).reshape(-1)
    if len(ids) != len(prompts):
        raise ValueError(f"prompt_ids has {len(ids)} entries but there are {len(prompts)} prompts")
    requests = [Request(id=int(i) * g + j, prompt=p, max_new_tokens=n, sampling=sampling, stop_tokens=tuple(stop_tokens),
                        draw_origin=len(p)) for i, p in zip(ids, prompts) for j in range(g)]
    completions = engine.generate(requests, key=key)
    rows = len(completions)
    tokens = np.full((rows, n), pad_id, np.int32)
    mask = np.zeros((rows, n), bool)
    logprobs, policy_logprobs = np.zeros((2, rows, n), np.float32)
    for row, c in enumerate(completions):
        k = len(c.tokens)
        tokens[row, :k], mask[row, :k] = c.tokens, True
        logprobs[row, :k], policy_logprobs[row, :k] = c.logprobs, c.policy_logprobs
    prompt_tokens, prompt_mask = left_pad(prompts, bucket_length(max(map(len, prompts))), pad_id)
    return Generation(
        prompt_tokens=np.repeat(prompt_tokens, g, axis=0), prompt_mask=np.repeat(prompt_mask, g, axis=0),
        completion_tokens=tokens, completion_mask=mask, logprobs=logprobs, policy_logprobs=policy_logprobs,
        finish_reason=np.array([FINISH_STOP if c.finish_reason == "stop" else FINISH_LENGTH for c in completions],
                               np.int32),
        prompt_index=np.repeat(np.arange(len(prompts), dtype=np.int32), g))


def _mesh_of(model) -> jax.sharding.Mesh | None:
    """The mesh the model's parameters live on, if they are sharded over more than one device."""
    for leaf in jax.tree.leaves(nnx.state(model)):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
            return sharding.mesh
    return None


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
    num_slots: int | None = None,
    block_size: int = 16,
) -> Generation:
    """Sample `num_samples` completions of each prompt: an `Engine` made for the call, then `generate_groups`.

    Args:
      model: the policy, a `jaxgrpo.models.Decoder` (or anything with its cached-call contract).
      prompts: B token id lists of any lengths (each non-empty).
      num_samples: G >= 1 completions per prompt.
      max_new_tokens: N >= 1, the most tokens a completion may have.
      key: PRNG key; required unless greedy.
      temperature, top_k, top_p, min_p, greedy: the sampling distribution (see `sampler.SamplingParams`).
      stop_tokens: token ids that end a completion (e.g. EOS and `<|im_end|>`); the stop token is part of it.
      prompt_ids: a stable id per prompt for its PRNG stream (default 0..B-1); pass dataset indices to make
        samples independent of batching.
      pad_id: the token that pads prompts (left) and completions (right) in the returned arrays.
      context_window: the most positions a row may use, prompt plus `max_new_tokens` (default: the model
        config's `max_position_embeddings` if it has one).
      mesh: a mesh with a `data` or `fsdp` axis to split the rows over (default: the mesh of the model's
        parameters, if they are sharded).
      num_slots: rows decoded together (default: all B*G, rounded up to the mesh's row shards); fewer run the
        rows through the slots with continuous batching, in less KV memory.
      block_size: positions per KV block.

    Returns:
      A `sampler.Generation` with B*G rows, prompt-major (row `b * G + g` is sample g of prompt b).
    """
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, greedy=greedy)
    for name, value in (("num_samples", num_samples), ("max_new_tokens", max_new_tokens)):
        if not is_int_in(value, 1):
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if key is None and not greedy:
        raise ValueError("key is required to sample (pass jax.random.key(seed)), or set greedy=True")
    vocab_size = model.config.vocab_size
    if not is_int_in(pad_id, 0, vocab_size - 1):
        raise ValueError(f"pad_id must be a token id in [0, {vocab_size}), got {pad_id!r}")
    window = model_context_window(model, context_window)
    prompts = check_prompts(prompts, vocab_size, window, int(max_new_tokens))
    mesh = _mesh_of(model) if mesh is None else mesh
    rows = len(prompts) * int(num_samples)
    if num_slots is None:
        num_slots = round_up(rows, batch_shards(mesh))
    context = bucket_length(max(map(len, prompts))) + bucket_length(max_new_tokens)  # one pool shape per bucket
    engine = Engine(model, num_slots=num_slots, block_size=block_size, mesh=mesh,
                    max_context=context if window is None else min(context, window),
                    decode_chunk=bucket_length(max_new_tokens))  # one chunk decodes every slot to its end
    return generate_groups(engine, prompts, num_samples=num_samples, max_new_tokens=max_new_tokens, sampling=sampling,
                           key=key, stop_tokens=stop_tokens, prompt_ids=prompt_ids, pad_id=pad_id)


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
      stop_tokens: default `sampler.default_stop_tokens(tokenizer)` (EOS, `<|im_end|>`, ...).
      skip_special_tokens: drop special tokens (the stop token among them) from the text.
      **sampling: `temperature`, `top_k`, `top_p`, `min_p`, `greedy` and the other keyword arguments of `generate`.
    """
    if isinstance(prompts, (str, bytes)):
        raise TypeError("prompts must be a list of strings or conversations, got a single string; wrap it in a list")
    token_prompts = encode_prompts(tokenizer, prompts, chat_template=chat_template)
    rollout = generate(
        model, token_prompts, num_samples=num_samples, max_new_tokens=max_new_tokens, key=jax.random.key(seed),
        stop_tokens=default_stop_tokens(tokenizer) if stop_tokens is None else stop_tokens,
        pad_id=sampling.pop("pad_id", tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0), **sampling,
    )
    texts = [tokenizer.decode(row[keep].tolist(), skip_special_tokens=skip_special_tokens)
             for row, keep in zip(rollout.completion_tokens, rollout.completion_mask)]
    return [texts[b * num_samples:(b + 1) * num_samples] for b in range(len(token_prompts))]
