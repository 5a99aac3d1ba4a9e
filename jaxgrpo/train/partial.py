"""Partial rollouts (Kimi k1.5, 2025): a step samples at most `partial_rollout_tokens` new tokens per row; a group
with a row still going is carried to the next step, where the updated policy continues it.

A long-tailed length distribution makes a synchronous step wait for its longest completion. With partial
rollouts a step's sampling is bounded by the per-step budget instead: the groups whose rows all ended train
this step, the others wait (kept out of the loss, their tokens so far in `LoopState.partial`) and go on next
step by the policy one update later, from their prompt and their tokens so far. A row's tokens then come from
more than one policy: `Trajectories.token_versions` holds the version of each, the behaviour log-probs are each
token's own policy's, and the staleness bound holds by construction: a group is carried at most
`max_staleness - 1` times (one-step-off adds one update to every token), and `partial_rollout_tokens x
max_staleness >= sampling.max_new_tokens` lets every row end within it.

Everything here is host side (numpy) around the trainer's `generate`; the state between steps is
`state.Partial`, which a checkpoint holds (its metadata), so a resumed run continues the same rows identically.
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import numpy as np

from jaxgrpo import profiling, sampler
from jaxgrpo.config import Config
from jaxgrpo.train.rollout import PromptStream, Trajectories, scored
from jaxgrpo.train.state import Partial

#: Folded into the step's key for every row's draws: row j of the group at prompt-stream position p is request
#: p * G + j, so its tokens depend on the step, its example and its place in the group only.
CONTINUE_STREAM = 2_000_003


def collect(cfg: Config, key: jax.Array, prompts: PromptStream, carried: Partial | None, version: int,
            generate: Callable, tokenizer, reward_fns: list, prompt_ids: Callable) -> tuple[
                Trajectories, PromptStream, Partial | None, np.ndarray, dict]:
    """The step's `prompts_per_step` groups: the carried ones continued first, then new prompts.

    `generate(prompts, num_samples, key, prompt_ids=..., max_new_tokens=...)` samples token prompts by the
    policy of `version`; `prompt_ids(example)` renders an example's prompt. Returns the step's rows (the
    groups still going are kept out of the loss and unscored), the stream after the new prompts, the groups
    carried to the next step (None when there are none), i32[N, C] each token's policy version, and the
    timings."""
    g, p, limit, budget = cfg.group_size, cfg.prompts_per_step, cfg.sampling.max_new_tokens, cfg.partial_rollout_tokens
    may_carry = lambda carries: carries < cfg.max_staleness - 1  # noqa: E731  (a carried group's next carry)
    old = carried if carried is not None else _empty(limit)
    fresh = p - len(old.positions)
    positions = np.concatenate([old.positions, prompts.position + np.arange(fresh)]).astype(np.int64)
    examples = [prompts.example(int(i)) for i in positions]
    stream = prompts.at(prompts.position + fresh)
    rows = p * g
    tokens = np.zeros((rows, limit), np.int32)
    logp = np.zeros((rows, limit), np.float32)
    versions = np.full((rows, limit), -1, np.int32)
    lengths, done, stopped = np.zeros(rows, np.int32), np.zeros(rows, bool), np.zeros(rows, bool)
    k = len(old.lengths)
    tokens[:k], logp[:k], versions[:k] = old.tokens, old.logp, old.versions
    lengths[:k], done[:k], stopped[:k] = old.lengths, old.done, old.stopped
    carries = np.concatenate([old.carries, np.zeros(fresh, np.int32)])
    # A group that cannot be carried again goes to its end this step: its rows get the whole remaining length.
    allowance = np.repeat(np.where([may_carry(c) for c in carries], budget, limit), g)
    t0 = time.perf_counter()
    sampled = 0
    with profiling.phase("sample"):
        going = np.flatnonzero(~done)
        for want in np.unique(allowance[going]):  # at most two programs: the budget and the whole length
            chosen = going[allowance[going] == want]
            heads = [prompt_ids(examples[r // g]) + tokens[r, :lengths[r]].tolist() for r in chosen]
            ids = positions[chosen // g] * g + chosen % g
            out = generate(heads, 1, jax.random.fold_in(key, CONTINUE_STREAM), prompt_ids=ids.astype(np.int32),
                           max_new_tokens=int(min(want, limit)))
            out = jax.tree.map(np.asarray, out)
            for i, r in enumerate(chosen):
                n = min(int(out.completion_mask[i].sum()), limit - lengths[r])
                at = slice(lengths[r], lengths[r] + n)
                tokens[r, at], logp[r, at], versions[r, at] = out.completion_tokens[i, :n], out.policy_logprobs[i, :n], version
                lengths[r] += n
                sampled += n
                stopped[r] = n > 0 and bool(out.finish_reason[i] == sampler.FINISH_STOP) and n == int(
                    out.completion_mask[i].sum())
                done[r] = stopped[r] or lengths[r] >= limit or not may_carry(carries[r // g])
    time_sample = time.perf_counter() - t0
    finished_groups = done.reshape(p, g).all(-1)
    t0 = time.perf_counter()
    with profiling.phase("reward"):
        batch = _rows(cfg, tokens, lengths, logp, stopped, examples, g, tokenizer, reward_fns, prompt_ids,
                      finished_groups)
    timings = {"time_sample": time_sample, "time_reward": time.perf_counter() - t0, "sampling_rounds": 1,
               "sampled_tokens": sampled, "rows_carried": int((~finished_groups).sum() * g)}
    keep = np.repeat(~finished_groups, g)
    nxt = None
    if keep.any():
        nxt = Partial(positions[~finished_groups], carries[~finished_groups] + 1, tokens[keep], lengths[keep],
                      logp[keep], versions[keep], stopped[keep])
    return batch, stream, nxt, versions, timings


def _empty(limit: int) -> Partial:
    return Partial(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros((0, limit), np.int32),
                   np.zeros(0, np.int32), np.zeros((0, limit), np.float32), np.zeros((0, limit), np.int32),
                   np.zeros(0, bool))


def _rows(cfg: Config, tokens, lengths, logp, stopped, examples, g: int, tokenizer, reward_fns, prompt_ids,
          finished_groups) -> Trajectories:
    """The step's `Trajectories`: the finished groups scored and training, the others neither (valid and kept
    False: they train when they end)."""
    rows_examples = [e for e in examples for _ in range(g)]
    heads = [prompt_ids(e) for e in rows_examples]
    prompt_tokens, prompt_mask = sampler.left_pad(heads, sampler.bucket_length(max(map(len, heads))))
    mask = np.arange(tokens.shape[1])[None] < lengths[:, None]
    out = sampler.Generation(
        prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, completion_tokens=np.where(mask, tokens, 0),
        completion_mask=mask, logprobs=logp, policy_logprobs=logp,
        finish_reason=np.where(stopped, sampler.FINISH_STOP, sampler.FINISH_LENGTH).astype(np.int32),
        prompt_index=np.repeat(np.arange(len(examples)), g).astype(np.int32))
    batch = scored(cfg, out, rows_examples, tokenizer, reward_fns, out.prompt_index)
    finished = np.repeat(finished_groups, g)
    return batch._replace(valid=batch.valid & finished, kept=finished,
                          rewards=np.where(finished, batch.rewards, 0.0).astype(np.float32),
                          correct=np.where(finished, batch.correct, 0.0).astype(np.float32))
