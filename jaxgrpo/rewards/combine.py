"""Weighted combination of reward functions, robust to a reward failing on one sample.

`score` runs several reward functions on one batch of completions and returns
their weighted sum. A reward function that raises, or returns NaN, for a sample
marks that sample invalid instead of stopping the run: the sample's rewards are
set to 0, ``valid[i]`` is False and ``num_invalid`` counts it, so the trainer
can mask it out of the loss (kernels take ``valid`` masks) and log the count.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxgrpo.rewards.math import check_batch

RewardFn = Callable[..., np.ndarray]


class RewardResult(NamedTuple):
    """The rewards of one batch of N completions.

    Attributes:
      rewards: f32[N], the weighted sum of the rewards; 0 where not ``valid``.
      per_reward: name -> f32[N], each reward before weighting (0 where it failed).
      valid: bool[N], False where any reward raised or returned NaN for the sample.
      num_invalid: the number of invalid samples, ``(~valid).sum()``.
    """

    rewards: np.ndarray
    per_reward: dict[str, np.ndarray]
    valid: np.ndarray
    num_invalid: int

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """Means over valid samples of the total and of each reward, and the invalid count."""
        def valid_mean(values: np.ndarray) -> float:
            return float(values[self.valid].mean()) if self.valid.any() else float("nan")

        metrics = {f"{prefix}mean": valid_mean(self.rewards), f"{prefix}num_invalid": float(self.num_invalid)}
        metrics.update({f"{prefix}{name}": valid_mean(values) for name, values in self.per_reward.items()})
        return metrics


def reward_name(reward_fn: RewardFn) -> str:
    """The name a reward is reported under: its function name, through `functools.partial`."""
    while isinstance(reward_fn, functools.partial):
        reward_fn = reward_fn.func
    return getattr(reward_fn, "__name__", type(reward_fn).__name__)


def _accepted_context(reward_fn: RewardFn, context: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``context`` that ``reward_fn`` takes as keywords.

    So plain ``(completions, examples)`` functions work beside ones that need,
    e.g., ``completion_lengths``.
    """
    parameters = inspect.signature(reward_fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(context)
    names = {p.name for p in parameters}
    return {key: value for key, value in context.items() if key in names}


def _slice_context(context: Mapping[str, Any], index: int, batch_size: int) -> dict[str, Any]:
    """Per-sample view of the context: arrays of length N are sliced to [index:index+1]."""
    def take(value):
        if isinstance(value, (np.ndarray, list, tuple)) and len(value) == batch_size:
            return value[index : index + 1]
        return value

    return {key: take(value) for key, value in context.items()}


def _as_rewards(values: Any, batch_size: int, name: str) -> np.ndarray:
    values = np.asarray(values, dtype=np.float32)
    if values.shape != (batch_size,):
        raise ValueError(f"reward {name} returned shape {values.shape} for {batch_size} completions; it must return f32[N]")
    return values


def _run_reward(
    reward_fn: RewardFn,
    name: str,
    completions: Sequence[str],
    examples: Sequence[dict],
    context: Mapping[str, Any],
) -> tuple[np.ndarray, np.ndarray]:
    """Runs one reward on the batch; returns (f32[N] with NaN where it failed, bool[N] failed).

    The batch call is tried first; if it raises, each sample is retried alone so
    that only the samples that fail are lost. A wrong output shape is a bug of
    the reward function, not of a sample, and raises.
    """
    batch_size = len(completions)
    try:
        outputs = reward_fn(list(completions), examples, **context)
    except Exception as batch_error:  # noqa: BLE001 -- a reward bug must not stop the run.
        logging.warning("reward %s raised on the batch (%r); retrying sample by sample", name, batch_error)
    else:
        values = _as_rewards(outputs, batch_size, name)
        return values, ~np.isfinite(values)
    values = np.full(batch_size, np.nan, dtype=np.float32)
    for i in range(batch_size):
        try:
            outputs = reward_fn([completions[i]], [examples[i]], **_slice_context(context, i, batch_size))
        except Exception as sample_error:  # noqa: BLE001
            logging.warning("reward %s raised on sample %d: %r", name, i, sample_error)
        else:
            values[i] = _as_rewards(outputs, 1, name)[0]
    return values, ~np.isfinite(values)


def score(
    reward_fns_and_weights: Sequence[tuple[RewardFn, float]],
    completions: Sequence[str],
    examples: Sequence[dict],
    **context: Any,
) -> RewardResult:
    """Scores N completions with several weighted rewards: r_i = sum_j w_j r_j(completion_i).

    Args:
      reward_fns_and_weights: (reward_fn, weight) pairs; each reward_fn has the
        signature ``(completions: list[str], examples: Sequence[dict], **context)
        -> f32[N]``. Bind hyper-parameters with `functools.partial`. A reward is
        reported under its function name (suffixed ``_1``, ``_2``... if repeated).
      completions: N completion texts.
      examples: N task examples, ``examples[i]`` the one completion i answers.
      **context: extra per-batch inputs, passed to each reward that takes the
        keyword; e.g. ``completion_lengths=int[N]`` (tokens per completion) for
        `overlong_penalty` and `length_penalty`.

    Returns:
      A `RewardResult`. A sample is invalid where any reward raised or returned a
      non-finite value for it; its total and per-reward values are then 0.
    """
    check_batch(completions, examples)
    if not reward_fns_and_weights:
        raise ValueError("reward_fns_and_weights is empty; pass at least one (reward_fn, weight) pair")
    invalid = np.zeros(len(completions), dtype=bool)
    per_reward: dict[str, np.ndarray] = {}
    weights: dict[str, np.float32] = {}
    for reward_fn, weight in reward_fns_and_weights:
        name = reward_name(reward_fn)
        base, suffix = name, 1
        while name in per_reward:
            name, suffix = f"{base}_{suffix}", suffix + 1
        values, failed = _run_reward(reward_fn, name, completions, examples, _accepted_context(reward_fn, context))
        invalid |= failed
        per_reward[name], weights[name] = values, np.float32(weight)
    per_reward = {name: np.where(invalid, 0.0, values).astype(np.float32) for name, values in per_reward.items()}
    total = sum(weights[name] * values for name, values in per_reward.items()).astype(np.float32)
    return RewardResult(rewards=total, per_reward=per_reward, valid=~invalid, num_invalid=int(invalid.sum()))
