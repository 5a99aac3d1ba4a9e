"""G samples of each prompt through a rollout engine, returned as the fixed-batch sampler returns them (a
`sampler.Generation`): the trainer's sampling."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from jaxgrpo.engine.engine import Engine
from jaxgrpo.engine.sequences import Request
from jaxgrpo.sampler.distribution import SamplingParams
from jaxgrpo.sampler.requests import FINISH_LENGTH, FINISH_STOP, Generation, bucket_length, check_prompts, left_pad


def generate_groups(engine: Engine, prompts: Sequence[Sequence[int]], *, num_samples: int, max_new_tokens: int,
                    sampling: SamplingParams, key: jax.Array | None = None, stop_tokens: Sequence[int] = (),
                    prompt_ids: Sequence[int] | None = None, pad_id: int = 0) -> Generation:
    """`num_samples` completions of each prompt through `engine`, as `sampler.generate` returns them.

    Sample g of prompt b is request `prompt_ids[b] * G + g` (default ids 0..B-1) with its draws counted from the
    completion's start: they depend on that id and the token's index in the completion only, and are
    `sampler.generate`'s (`row_keys`, `step_keys`), so both sample the same tokens wherever the logits agree.
    Rows are prompt-major and padded as `sampler.Generation` says (prompts left-padded to their bucket,
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
