"""Signs that a run is going wrong while it still runs: no learning signal, updates not applied, collapse of the
sampling policy. `RunWatch` checks each step's record (`Trainer.run`): a streak of steps without a learning
signal stops the run with `NoLearningSignal`, a streak of updates not applied with `NonFiniteUpdates`, each after
a warning per step; each sign of collapse below is warned of once.

A GRPO run can collapse without any error: the policy's entropy falls towards zero, the G samples of
a group become the same text, their advantages are zero, and the run stops learning while every
number stays finite. Two signs are checked, each a pure function of the step records:

* **entropy collapse**: the mean token entropy of the last `window` steps is below `entropy_floor`
  while their accuracy is no better than the run's first `window` steps (a policy that has become
  certain of answers that are not more often right);
* **every completion truncated**: every completion of each of the last `window` steps ran to
  `sampling.max_new_tokens`, so the rewards judge cut-off text.

The loop warns once per sign, in one line naming the step and what to try (`Trainer.run`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from jaxgrpo.errors import UserError

if TYPE_CHECKING:  # a type only
    from jaxgrpo.config import Config

logger = logging.getLogger(__name__)


class CollapseSign(NamedTuple):
    """One sign of collapse: `kind` ("entropy" or "truncation") and the one-line message."""

    kind: str
    message: str


def entropy_collapse(records: Sequence[dict], *, entropy_floor: float, window: int) -> CollapseSign | None:
    """The entropy sign at the last record, or None.

    Needs `2 * window` records: the last `window` steps are compared with the first `window`.
    """
    if entropy_floor <= 0 or len(records) < 2 * window:
        return None
    last, first = records[-window:], records[:window]
    entropy = float(np.mean([r["entropy"] for r in last]))
    accuracy_now = float(np.mean([r["accuracy"] for r in last]))
    accuracy_start = float(np.mean([r["accuracy"] for r in first]))
    if entropy >= entropy_floor or accuracy_now > accuracy_start:
        return None
    step = int(records[-1]["step"])
    return CollapseSign("entropy", (
        f"step {step}: the policy may have collapsed: mean token entropy {entropy:.3f} over the last {window} steps "
        f"(collapse_entropy={entropy_floor}) while training accuracy is {accuracy_now:.3f}, no better than "
        f"{accuracy_start:.3f} over the first {window}; try a lower optimizer.lr, a KL term (kl_coef=0.05) or "
        f"advantage=dr_grpo with aggregation=seq_mean_token_sum_norm"))


def truncation_collapse(records: Sequence[dict], *, window: int, max_new_tokens: int) -> CollapseSign | None:
    """The truncation sign at the last record, or None: every completion of the last `window` steps was cut off."""
    if len(records) < window or any(r["frac_truncated"] < 1.0 for r in records[-window:]):
        return None
    step = int(records[-1]["step"])
    return CollapseSign("truncation", (
        f"step {step}: every completion of the last {window} steps ran to sampling.max_new_tokens={max_new_tokens} "
        f"without a stop token, so the rewards judge cut-off text; raise sampling.max_new_tokens, penalize "
        f"overlong completions (reward_penalty='overlong_penalty') or add a KL term (kl_coef=0.05)"))


def collapse_warnings(records: Sequence[dict], *, entropy_floor: float, window: int,
                      max_new_tokens: int) -> list[CollapseSign]:
    """Every sign of collapse at the last of `records` (the run's step records, oldest first)."""
    if window < 1:
        return []
    signs = (entropy_collapse(records, entropy_floor=entropy_floor, window=window),
             truncation_collapse(records, window=window, max_new_tokens=max_new_tokens))
    return [s for s in signs if s is not None]


class NoLearningSignal(UserError, RuntimeError):
    """Consecutive steps trained no row (`Config.max_steps_without_signal`); the message says what to check."""


class NonFiniteUpdates(UserError, RuntimeError):
    """Consecutive steps had updates not applied for a non-finite loss, gradient or result
    (`Config.max_nonfinite_steps`); the message says what to change."""


#: Why a step has no learning signal: (what the step did, the metric that shows it, the cause and fix an error names).
NO_SIGNAL = {
    "no_row": (
        "trained no row", "frac_trained_rows=0: every reward invalid or every group filtered out",
        "every reward was invalid (NaN: check the reward functions and that the task's examples have answers) or "
        "dynamic sampling found no group with differing rewards",
    ),
    "zero_advantage": (
        "trained only rows whose advantage is zero",
        "frac_signal_rows=0: within every group the rewards were equal, so the update has no learning signal",
        "every row's advantage was zero: the rewards were equal within every group (a reward that is the same "
        "for every completion, groups of one, or a task the policy always or never solves; try "
        "group_filter='dynamic_sampling_filter', more varied rewards or a larger group_size)",
    ),
}


class RunWatch:
    """The run's checks after each step (`Trainer.run`): a streak of steps without a learning signal
    (`check_signal`), a streak of updates not applied (`check_finite`), and each sign of collapse warned of once
    (`collapse_warnings`). `warn`: this process speaks for the run (process 0)."""

    def __init__(self, cfg: Config, *, warn: bool):
        self.cfg, self.warn = cfg, warn
        self.without_signal: list[str] = []  # why each of the consecutive steps without a learning signal had none
        self.nonfinite = 0  # consecutive steps with an update not applied (non-finite)
        self.warned: set[str] = set()  # the kinds of collapse already warned about

    def after(self, step: int, history: list[dict]) -> None:
        """Checks step `step`, whose record is `history[-1]`; raises where a streak reaches its limit."""
        cfg, record = self.cfg, history[-1]
        # Partial rollouts: a step whose groups are all still going is neither a signal nor its absence.
        if record.get("rows_carried", 0) < cfg.batch_size:
            reason = no_signal_reason(record)
            self.without_signal = self.without_signal + [reason] if reason else []
            if self.without_signal:
                check_signal(cfg, step, self.without_signal, warn=self.warn)
        self.nonfinite = self.nonfinite + 1 if record["skipped_nonfinite"] else 0
        if self.nonfinite:
            check_finite(cfg, step, self.nonfinite, record, warn=self.warn)
        for sign in collapse_warnings(history, entropy_floor=cfg.collapse_entropy, window=cfg.collapse_window,
                                             max_new_tokens=cfg.sampling.max_new_tokens):
            if sign.kind not in self.warned and self.warn:
                logger.warning(sign.message)
            self.warned.add(sign.kind)


def no_signal_reason(record: dict) -> str | None:
    """The key of `NO_SIGNAL` for a step's metrics, or None for a step with a learning signal."""
    if record["frac_trained_rows"] == 0:
        return "no_row"
    if record["frac_signal_rows"] == 0:
        return "zero_advantage"
    return None


def check_signal(cfg: Config, step: int, reasons: list[str], *, warn: bool) -> None:
    """Warns of a step without a learning signal (no row trained, or only zero advantages); raises `NoLearningSignal`
    at `max_steps_without_signal` such steps in a row. `reasons`: the `NO_SIGNAL` key of each of those steps."""
    limit, count = cfg.max_steps_without_signal, len(reasons)
    if limit and count >= limit:
        if len(set(reasons)) == 1:
            what, _, cause = NO_SIGNAL[reasons[0]]
        else:
            what = "had no learning signal, training no row or only rows whose advantage is zero"
            cause = "; or ".join(NO_SIGNAL[r][2] for r in sorted(set(reasons)))
        raise NoLearningSignal(
            f"steps {step - count + 1}-{step} {what} ({count} in a row, max_steps_without_signal={limit}): {cause}; "
            "fix that, or set max_steps_without_signal=0 to train on regardless"
        )
    if warn:
        what, shown, _ = NO_SIGNAL[reasons[-1]]
        logger.warning("step %d %s (%s); %d such step(s) in a row%s", step, what, shown, count,
                       f", the run stops at {limit}" if limit else "")


def check_finite(cfg: Config, step: int, count: int, record: dict, *, warn: bool) -> None:
    """Warns of a step with updates not applied (non-finite); raises `NonFiniteUpdates` at `max_nonfinite_steps`
    such steps in a row."""
    limit = cfg.max_nonfinite_steps
    if limit and count >= limit:
        raise NonFiniteUpdates(
            f"steps {step - count + 1}-{step} each had an update with a non-finite loss, gradient or result ({count} "
            f"in a row, max_nonfinite_steps={limit}); those updates were not applied: lower optimizer.lr, check the "
            "rewards for huge values, or train in float32; set max_nonfinite_steps=0 to keep skipping them"
        )
    if warn:
        updates = cfg.num_epochs * cfg.num_minibatches
        logger.warning("step %d: %d of %d update(s) not applied: loss %s, grad_norm %s (a non-finite loss, gradient "
                       "or result; the state is as before them); %d such step(s) in a row%s", step,
                       int(record["skipped_nonfinite"]), updates, record["loss"], record["grad_norm"], count,
                       f", the run stops at {limit}" if limit else "")
