"""Scaffolding for groups that all failed (Scaf-GRPO): in-prompt hints, tier by tier, for one sample of the group.

When every sample of a prompt is wrong, a group-relative advantage is 0 for all of them and the prompt teaches
nothing (the "learning cliff"). Scaf-GRPO (Zhang et al., "Scaf-GRPO: Scaffolded Group Relative Policy
Optimization for Enhancing LLM Reasoning", 2025) then samples the prompt again with a hint in it, from the most
abstract tier to the most concrete (a concept, a plan, the first steps), and puts the first correct hinted
completion, the one that needed the least help, in place of one of the group's failed samples: the group now
carries signal, and the hinted row trains on-policy with its hint in the prompt. Before `after_step` the
policy learns alone.

With `replace="group"` the whole group is sampled again with the hint and, once one of its G samples is right,
trains in place of the failed one: the difficulty-aware prompt refinement of GHPO (Liu et al., "GHPO: Adaptive
Guidance for Stable and Efficient LLM Reinforcement Learning", 2025), the task's tiers standing in for growing
parts of the reference solution.

The hints come from the task: `task.hints(example)`, or the example's "hints" (a list of strings, most
abstract first). `scaffold` runs on one process's scored rollout, before dynamic sampling; the hinted samples'
batch is padded to a power of two of prompts, so a run compiles few sampler shapes.
"""

from __future__ import annotations

import collections
from typing import Callable, Sequence

import jax
import numpy as np

from jaxgrpo.config import Config

HINT_PREFIX = "Hint: "
#: The per-row arrays of a `Trajectories` a replacement row brings along (besides its prompt, rewards and text).
_ROW_FIELDS = ("completion_tokens", "completion_mask", "sampler_logp", "finished", "rewards", "correct", "valid")


def task_hints(task) -> Callable[[dict], Sequence[str]]:
    """`hints(example)`: the task's `hints` method, or each example's "hints" (none when it has no such key)."""
    method = getattr(task, "hints", None)
    if callable(method):
        return method
    return lambda example: list(example.get("hints", ()))


def check(task, examples, num_processes: int) -> None:
    """One-line errors before anything is built: a run of several processes, or a task without hints."""
    from jaxgrpo.errors import ConfigError

    if num_processes > 1:
        raise ConfigError("guidance samples each process's failed groups apart (their numbers differ between hosts), "
                          "in one process for now; set guidance=None for a multi-process run")
    hints = task_hints(task)
    if not any(hints(examples[i]) for i in range(min(16, len(examples)))):
        raise ConfigError(f"guidance needs hints, but task {getattr(task, 'name', type(task).__name__)!r} defines no "
                          "hints(example) and its examples have no 'hints' (a list of strings, most abstract first); "
                          "add them or set guidance=None")


def with_hint(example: dict, hint: str) -> dict:
    """`example` whose question ends with the hint (the task renders its prompt from the question)."""
    return {**example, "question": f"{example['question']}\n{HINT_PREFIX}{hint}"}


def _padded(count: int) -> int:
    return 1 << max(count - 1, 0).bit_length()


def scaffold(cfg: Config, rollout, key: jax.Array, *, generate: Callable, score: Callable, hints: Callable,
             prompt_length: Callable[[dict], int]):
    """`rollout` (one process's scored groups, a `rollout.Trajectories`) with, in each all-wrong group, its first sample
    replaced by the first correct one of `cfg.guidance.attempts` completions sampled per hint tier (`replace="one"`)
    or all its samples by the first hinted group of G with a correct one (`replace="group"`); and the step's counts.

    `generate(examples, num_samples, key, prompt_ids)` samples a `sampler.Generation`; `score(out, examples)` is
    its `Trajectories` (`rollout.scored`); `hints(example)` the tiers; `prompt_length(example)` its prompt's tokens (a
    hinted prompt longer than `sampling.max_prompt_len` is not tried)."""
    g, whole = cfg.group_size, cfg.guidance.replace == "group"
    attempts = g if whole else cfg.guidance.attempts  # samples per hinted prompt
    groups = len(rollout.rewards) // g
    solved = (np.asarray(rollout.correct).reshape(groups, g) > 0).any(-1)
    scored = np.asarray(rollout.valid).reshape(groups, g).any(-1)
    pending = [q for q in range(groups) if scored[q] and not solved[q]]
    stats = collections.Counter(guidance_failed_groups=len(pending))
    found = {}  # group -> (tier, the hinted rollout, the rows of it that replace the group's first, or all)
    tiers = {q: hints(rollout.examples[q * g]) for q in pending}
    tier = 0
    while pending:
        tries = []
        for q in pending:
            if tier < len(tiers[q]):
                hinted = with_hint(rollout.examples[q * g], str(tiers[q][tier]))
                if prompt_length(hinted) <= cfg.sampling.max_prompt_len:
                    tries.append((q, hinted))
                else:
                    stats["guidance_hints_too_long"] += 1
        if not tries:
            break
        padded = tries + [tries[0]] * (_padded(len(tries)) - len(tries))  # few shapes: a power of two of prompts
        out = generate([h for _, h in padded], attempts, jax.random.fold_in(key, tier),
                       np.array([q for q, _ in padded], np.int32))
        # The rewards read the original examples (a hint changes the question, not the answer).
        originals = [rollout.examples[q * g] for q, _ in padded for _ in range(attempts)]
        hinted = score(jax.tree.map(np.asarray, out), originals)
        hit = (hinted.correct > 0) & hinted.valid
        for i, (q, _) in enumerate(tries):
            rows = list(range(i * attempts, (i + 1) * attempts))
            right = [r for r in rows if hit[r]]
            if right:
                found[q] = (tier, hinted, rows if whole else right[:1])
        stats["guidance_hinted_samples"] += len(tries) * attempts
        pending = [q for q in pending if q not in found]
        tier += 1
    stats["guidance_solved_groups"] = len(found)
    stats["guidance_solved_tiers"] = sum(t + 1 for t, _, _ in found.values())  # 1: the most abstract; `summarize`
    if found:
        rollout = replace_rows(rollout, {q * g + k: (hinted, row) for q, (_, hinted, rows) in found.items()
                                         for k, row in enumerate(rows)})
    return rollout, dict(stats)


def summarize(timings: dict) -> dict:
    """A step's timings with its guidance counts (summed over its sampling rounds) read out: the solved groups'
    tiers become `guidance_mean_tier`, present when a group was solved."""
    timings = dict(timings)
    tiers = timings.pop("guidance_solved_tiers", 0)
    if timings.get("guidance_solved_groups"):
        timings["guidance_mean_tier"] = tiers / timings["guidance_solved_groups"]
    return timings


def replace_rows(rollout, rows: dict):
    """`rollout` with row r replaced by row i of rollout `other` for each r -> (other, i) of `rows` (its group
    id and example stay r's); prompts left-padded to the widest, completions as wide as `rollout`'s."""
    width = max([rollout.prompt_tokens.shape[1]] + [other.prompt_tokens.shape[1] for other, _ in rows.values()])

    def pad_left(x):
        return np.pad(x, ((0, 0), (width - x.shape[1], 0)))

    fields = {"prompt_tokens": pad_left(rollout.prompt_tokens), "prompt_mask": pad_left(rollout.prompt_mask),
              **{name: np.array(getattr(rollout, name)) for name in _ROW_FIELDS}}
    per_reward = {name: np.array(values) for name, values in rollout.per_reward.items()}
    texts = list(rollout.texts)
    for r, (other, i) in rows.items():
        if other.completion_tokens.shape[1] != rollout.completion_tokens.shape[1]:
            raise ValueError(f"a replacement's completions are {other.completion_tokens.shape[1]} tokens wide, the "
                             f"rollout's {rollout.completion_tokens.shape[1]}: both come from sampling.max_new_tokens")
        fields["prompt_tokens"][r] = pad_left(other.prompt_tokens[i:i + 1])[0]
        fields["prompt_mask"][r] = pad_left(other.prompt_mask[i:i + 1])[0]
        for name in _ROW_FIELDS:
            fields[name][r] = getattr(other, name)[i]
        for name in per_reward:
            per_reward[name][r] = other.per_reward[name][i]
        texts[r] = other.texts[i]
    return rollout._replace(**fields, per_reward=per_reward, texts=texts)
