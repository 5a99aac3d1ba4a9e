"""Held-out evaluation during training: greedy accuracy, and pass@1 / pass@k of sampled completions."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import numpy as np

from jaxgrpo import rewards, rng
from jaxgrpo.config import Config
from jaxgrpo.data.evaluate import pass_at_k
from jaxgrpo.distributed import gather_rows, process_block
from jaxgrpo.train.rollout import decode, score


def correct_flags(cfg: Config, tokenizer, reward_fns: list, texts: list[str], examples: list[dict]) -> np.ndarray:
    """Correctness (the `correctness_reward`) f32[N] of N completions; every host holds all N of them.

    In a multi-host run each host scores its `process_block` of the rows and the flags are gathered.
    The evaluation's sizes are user-chosen (`num_eval_examples`, times `eval_pass_k`), so when N does
    not divide by the process count no error is raised: every host scores all N rows itself. Every
    host already holds all N texts (`evaluate` samples the whole evaluation set everywhere), host-side
    scoring is cheap next to that sampling, and the result is the same either way (rewards are per row).
    """
    n, count = len(texts), jax.process_count()
    shared = count > 1 and n >= count and n % count == 0
    rows = process_block(n) if shared else slice(None)
    texts, examples = texts[rows], examples[rows]
    lengths = np.array([len(tokenizer.encode(t)) for t in texts], np.int32)
    correct = score(cfg, reward_fns, texts, examples, lengths).per_reward[cfg.correctness_reward].astype(np.float32)
    return gather_rows(correct) if shared else correct


class QuestionFlags(NamedTuple):
    """Each held-out question's greedy completion and sampled completions, and whether each is correct."""

    greedy: list[str]  # [Q] the greedy completion of each question
    greedy_correct: np.ndarray  # f32[Q]
    samples: list[list[str]]  # [Q][n] the sampled completions of each question
    samples_correct: np.ndarray  # f32[Q, n]


def evaluation_key(cfg: Config, step: int) -> jax.Array:
    """The key of the held-out evaluation after `step`: the run's "evaluate" stream (`jaxgrpo.rng`)."""
    return rng.stream(rng.run_key(cfg.seed), "evaluate", step)


def question_flags(cfg: Config, generate: Callable, tokenizer, reward_fns: list, examples: list[dict], step: int,
                   num_samples: int) -> QuestionFlags:
    """One greedy and `num_samples` sampled completions (none when 0) of each question, scored for correctness.

    `generate(examples, num_samples, key, greedy=...)` samples a `sampler.Generation`. The random key is
    `evaluation_key(cfg, step)`, so the training run's evaluation at `step` and a later evaluation of its
    checkpoint (`jaxgrpo.evaluation.policy_eval`) draw the same samples.
    """
    key = evaluation_key(cfg, step)
    greedy = decode(tokenizer, generate(examples, 1, key, greedy=True))
    greedy_correct = correct_flags(cfg, tokenizer, reward_fns, greedy, examples)
    texts, correct = [], np.zeros((len(examples), 0), np.float32)
    if num_samples:
        texts = decode(tokenizer, generate(examples, num_samples, key))
        rows = [e for e in examples for _ in range(num_samples)]
        correct = correct_flags(cfg, tokenizer, reward_fns, texts, rows).reshape(len(examples), num_samples)
    samples = [texts[i * num_samples:(i + 1) * num_samples] for i in range(len(examples))]
    return QuestionFlags(greedy, greedy_correct, samples, correct)


def well_formed_flags(reward_fns: list, greedy: list[str], examples: list[dict]) -> np.ndarray | None:
    """bool[Q]: whether each greedy answer states a final answer as the task asks (the math tasks' format
    reward is positive), or None when the run has no format reward.

    With the correctness flags this gives the format-only share, the answers well-formed but wrong: how
    much accuracy learning the answer format alone could still gain, so a rise in accuracy can be told
    apart from a model that only learned to finish its reply as asked.
    """
    if not any(fn is rewards.format_reward for fn, _ in reward_fns):
        return None
    return rewards.format_reward(greedy, examples) > 0


def evaluate(cfg: Config, generate: Callable, tokenizer, reward_fns: list, examples: list[dict], step: int) -> dict:
    """Greedy accuracy (with the well-formed and format-only shares when the run rewards the format), and
    pass@1 / pass@k of `cfg.eval_pass_k` samples, on the held-out `examples`.

    `generate(examples, num_samples, key, greedy=...)` samples a `sampler.Generation`.
    """
    if not examples:
        return {}
    k = cfg.eval_pass_k
    flags = question_flags(cfg, generate, tokenizer, reward_fns, list(examples), step, k if k > 1 else 0)
    metrics = {"greedy_accuracy": float(flags.greedy_correct.mean())}
    well_formed = well_formed_flags(reward_fns, flags.greedy, list(examples))
    if well_formed is not None:
        metrics["greedy_well_formed"] = float(well_formed.mean())
        metrics["greedy_format_only"] = float((well_formed & (flags.greedy_correct == 0)).mean())
    if k > 1:
        num_correct = flags.samples_correct.sum(-1).astype(int)
        samples = np.full(len(examples), k)
        metrics["pass@1"] = float(np.mean(pass_at_k(samples, num_correct, 1)))
        metrics[f"pass@{k}"] = float(np.mean(pass_at_k(samples, num_correct, k)))
    return metrics


def evaluate_episodes(cfg: Config, run_episodes: Callable, examples: list[dict], step: int) -> dict:
    """Held-out episodes of `cfg.environment`: one greedy episode per example (its success: a positive reward)
    and, with `eval_pass_k` > 1, pass@1 / pass@k of k sampled ones. `run_episodes(examples, num_samples, key,
    greedy=...)` is `Trainer.run_episodes`; the key is the one `question_flags` uses."""
    if not examples:
        return {}
    key = evaluation_key(cfg, step)
    greedy, stats = run_episodes(list(examples), 1, key, greedy=True)
    rewards = np.array([t.reward for t in greedy], np.float32)
    metrics = {"greedy_accuracy": float((rewards > 0).mean()), "greedy_reward": float(rewards.mean()),
               "greedy_turns": float(stats.get("turns", 0)) / len(greedy)}
    k = cfg.eval_pass_k
    if k > 1:
        sampled, _ = run_episodes(list(examples), k, key)
        num_correct = np.array([t.reward > 0 for t in sampled]).reshape(len(examples), k).sum(-1)
        samples = np.full(len(examples), k)
        metrics["pass@1"] = float(np.mean(pass_at_k(samples, num_correct, 1)))
        metrics[f"pass@{k}"] = float(np.mean(pass_at_k(samples, num_correct, k)))
    return metrics
