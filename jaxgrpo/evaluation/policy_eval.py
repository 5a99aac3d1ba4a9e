"""Evaluating a checkpoint or a base model on a task split: greedy accuracy and pass@k with 95% intervals,
and every completion written to a JSONL file (`jaxgrpo-eval`).

The completions are drawn and scored as the trainer's own evaluation draws them (both call
`jaxgrpo.train.evaluation.question_flags`): the same prompts, the same sampling settings and the same
random key for a given step, so evaluating a run's final checkpoint on its evaluation split reproduces
the last line of its eval.jsonl. On top of that:

* greedy accuracy gets a Wilson interval over questions (`intervals.wilson_interval`);
* with the math tasks' format reward, the share of greedy answers that are well-formed ("The answer
  is N.") and the share well-formed but wrong: what learning the format alone could not explain;
* pass@k (unbiased estimator of Chen et al., 2021, from n = max(k) samples per question) gets a
  percentile-bootstrap interval over questions (`intervals.bootstrap_interval`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import numpy as np

from jaxgrpo import intervals
from jaxgrpo.config import Config
from jaxgrpo.errors import UserError


@dataclasses.dataclass
class EvalResult:
    """What `evaluate_policy` measured: summary figures with intervals and the per-question records."""

    metrics: dict[str, intervals.Interval]
    records: list[dict]
    num_questions: int
    samples_per_question: int

    def summary(self) -> dict:
        out = {"num_questions": self.num_questions, "samples_per_question": self.samples_per_question}
        for name, interval in self.metrics.items():
            out[name] = interval.value
            out[f"{name}_ci95"] = [interval.low, interval.high]
        return out


def evaluate_policy(trainer, examples: Sequence[dict], ks: Sequence[int], *, step: int = 0) -> EvalResult:
    """Greedy accuracy and pass@k (k in `ks`) of `trainer`'s policy on `examples`.

    The random key is the trainer's evaluation key of `step` (`train.evaluation.evaluation_key`), so the
    samples are those the training run's evaluation at `step` (`train.evaluation.evaluate`) draws when
    max(ks) equals its `eval_pass_k`.
    """
    from jaxgrpo.data.evaluate import pass_at_k
    from jaxgrpo.train.evaluation import question_flags, well_formed_flags

    examples = list(examples)
    if not examples:
        raise ValueError("no examples to evaluate; choose a split with examples and --num >= 1")
    n = max(ks)
    flags = question_flags(trainer.cfg, trainer.generate, trainer.tokenizer, trainer.reward_fns, examples, step, n)
    greedy, greedy_correct, samples, sample_correct = flags
    metrics = {"greedy_accuracy": intervals.wilson_interval(int(greedy_correct.sum()), len(examples))}
    well_formed = well_formed_flags(trainer.reward_fns, greedy, examples)
    if well_formed is not None:
        metrics["greedy_well_formed"] = intervals.wilson_interval(int(well_formed.sum()), len(examples))
        format_only = well_formed & (greedy_correct == 0)
        metrics["greedy_format_only"] = intervals.wilson_interval(int(format_only.sum()), len(examples))
    counts = sample_correct.sum(-1).astype(int)
    for k in sorted(set(ks)):
        per_question = pass_at_k(np.full(len(examples), n), counts, k)
        metrics[f"pass@{k}"] = intervals.bootstrap_interval(per_question, seed=trainer.cfg.seed)
    records = [
        {"index": i, "question": e.get("question"), "answer": e.get("answer"), "greedy": greedy[i],
         "greedy_correct": bool(greedy_correct[i]),
         **({"greedy_well_formed": bool(well_formed[i])} if well_formed is not None else {}),
         "samples": samples[i],
         "samples_correct": [bool(c) for c in sample_correct[i]]}
        for i, e in enumerate(examples)
    ]
    return EvalResult(metrics, records, len(examples), n)


class EvalSetupError(UserError, ValueError):
    """The evaluation asked for cannot run (a split, a model, a run); the message is one line."""


def check_split(cfg: Config, split: str) -> None:
    """Raises `EvalSetupError` unless `cfg.task` has a split `split` (read before any model is built)."""
    from jaxgrpo import data
    import jaxgrpo.data.toy  # noqa: F401  (registers the offline toy_sum task)

    try:
        task = data.get_task(cfg.task.name, **cfg.task.kwargs)
    except (ValueError, TypeError) as error:
        raise EvalSetupError(f"task {cfg.task.name!r}: {error}") from error
    try:
        examples = task.load(split, data_dir=cfg.task.data_dir, num_examples=1)
        len(examples)
    except Exception as error:  # TFDS and the tasks raise several kinds for an unknown split
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise EvalSetupError(f"task {cfg.task.name!r} has no split {split!r} ({first[:200]}); "
                             "pass --split with one of its splits (train, test)") from error


def write_jsonl(path: str, records: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
