"""Accuracy and pass@k of sampled completions against a task split.

As a function (the trainer's evaluation calls this)::

    evaluate(completions, examples, k_values=(1, 4))
    # completions[i] holds the n sampled completions of examples[i]
    # -> {"accuracy": ..., "pass@1": ..., "pass@4": ..., "num_examples": ..., "samples_per_example": ...}

From the command line, on a jsonl file with one line per example of the split,
``{"completions": ["...", ...]}`` (optionally with ``"index"``, the example's
position in the split; by default line i is example i)::

    python -m jaxgrpo.data.evaluate --task gsm8k --split test --data_dir path/to/gsm8k_jsonl \\
        --completions samples.jsonl --k 1 4
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence

import numpy as np

from jaxgrpo import rewards


def pass_at_k(num_samples: np.ndarray, num_correct: np.ndarray, k: int) -> np.ndarray:
    """Unbiased estimate of pass@k per problem from n samples of which c are correct.

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

    the probability that at least one of k samples drawn without replacement
    from the n is correct ("Evaluating Large Language Models Trained on Code",
    Chen et al., 2021); the product form avoids huge binomials.

    Args:
      num_samples: int[P], n per problem; each must be >= k.
      num_correct: int[P], c per problem.
      k: samples per attempt.

    Returns:
      f64[P] in [0, 1].
    """
    num_samples = np.asarray(num_samples, dtype=np.int64)
    num_correct = np.asarray(num_correct, dtype=np.int64)
    if k < 1 or (num_samples < k).any():
        raise ValueError(f"pass@{k} needs k >= 1 and at least k samples per problem, got n = {num_samples.min()}")
    if ((num_correct < 0) | (num_correct > num_samples)).any():
        raise ValueError("num_correct must be in [0, num_samples] for every problem")
    estimates = np.empty(num_samples.shape, dtype=np.float64)
    for index, (n, c) in enumerate(zip(num_samples, num_correct)):
        # Fewer than k wrong samples: every draw of k contains a correct one.
        estimates[index] = 1.0 if n - c < k else 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))
    return estimates


def evaluate(
    completions: Sequence[Sequence[str]],
    examples: Sequence[dict],
    *,
    k_values: Sequence[int] = (1,),
    reward_fn: Callable[..., np.ndarray] = rewards.correctness_reward,
) -> dict[str, float]:
    """Accuracy and pass@k of ``completions[i]`` (n samples each) against ``examples[i]``.

    Args:
      completions: per example, its sampled completions (the same n for all is
        not required; pass@k needs n >= k everywhere).
      examples: the task examples, aligned with ``completions``.
      k_values: the k of each pass@k reported.
      reward_fn: judges a sample correct where it returns > 0.5; default
        `jaxgrpo.rewards.correctness_reward` (final-answer equivalence).

    Returns:
      ``accuracy`` (mean over examples of the fraction of correct samples, i.e.
      pass@1 estimated from all n samples), ``pass@k`` for each k,
      ``num_examples`` and ``samples_per_example`` (the mean n).
    """
    if len(completions) != len(examples):
        raise ValueError(
            f"completions has {len(completions)} entries but examples has {len(examples)}; "
            "pass one list of sampled completions per example"
        )
    if not examples:
        raise ValueError("nothing to evaluate: examples is empty")
    num_samples = np.array([len(samples) for samples in completions])
    if (num_samples == 0).any():
        raise ValueError(f"example {int(np.argmin(num_samples))} has no completions; give each example at least one")
    flat_completions = [c for samples in completions for c in samples]
    flat_examples = [example for example, n in zip(examples, num_samples) for _ in range(n)]
    correct = np.asarray(reward_fn(flat_completions, flat_examples)) > 0.5
    num_correct = np.add.reduceat(correct.astype(np.int64), np.cumsum(num_samples) - num_samples)
    results = {
        "accuracy": float(np.mean(num_correct / num_samples)),
        "num_examples": float(len(examples)),
        "samples_per_example": float(num_samples.mean()),
    }
    for k in k_values:
        results[f"pass@{k}"] = float(pass_at_k(num_samples, num_correct, k).mean())
    return results


def _parse_completions(record: dict) -> tuple[list[str], int | None]:
    samples = record["completions"]
    if not isinstance(samples, list) or not all(isinstance(s, str) for s in samples):
        raise ValueError("'completions' must be a list of strings")
    return samples, (int(record["index"]) if "index" in record else None)


def _read_completions(path: str, num_examples: int) -> tuple[list[list[str]], list[int]]:
    """The completions of a jsonl file and the split index of each line's example."""
    from jaxgrpo.data import jsonl

    completions, indices = [], []
    lines = jsonl.parse_jsonl(path, _parse_completions, '{"completions": [str, ...], "index": int (optional)}')
    for line_number, (samples, index) in lines:
        index = len(indices) if index is None else index
        if not 0 <= index < num_examples:
            raise ValueError(f"{path}:{line_number}: index {index} is outside the split's {num_examples} examples")
        completions.append(samples)
        indices.append(index)
    return completions, indices


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Command line: evaluate a jsonl file of completions against a task split, print JSON."""
    from jaxgrpo.data import get_task  # The data layer (TFDS) is only needed here.

    parser = argparse.ArgumentParser(description="Accuracy and pass@k of completions against a task split.")
    parser.add_argument("--task", default="arithmetic", help='task name, e.g. "gsm8k" or "arithmetic/digits2_ops2"')
    parser.add_argument("--split", default="test")
    parser.add_argument("--data_dir", default=None, help="the task's local data (GSM8K: the dir with test.jsonl)")
    parser.add_argument("--tfds_data_dir", default=None, help="where prepared datasets live (default: TFDS's)")
    parser.add_argument("--completions", required=True, help='jsonl, one {"completions": [...]} per example')
    parser.add_argument("--k", type=int, nargs="+", default=[1], help="the k of pass@k")
    args = parser.parse_args(argv)
    examples = get_task(args.task, tfds_data_dir=args.tfds_data_dir).load(args.split, data_dir=args.data_dir)
    completions, indices = _read_completions(args.completions, len(examples))
    results = evaluate(completions, [examples[i] for i in indices], k_values=args.k)
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
