"""Signs that a run is going wrong while it still runs: collapse of the sampling policy.

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

from typing import NamedTuple, Sequence

import numpy as np


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
        f"overlong completions (overlong_cache_len) or add a KL term (kl_coef=0.05)"))


def collapse_warnings(records: Sequence[dict], *, entropy_floor: float, window: int,
                      max_new_tokens: int) -> list[CollapseSign]:
    """Every sign of collapse at the last of `records` (the run's step records, oldest first)."""
    if window < 1:
        return []
    signs = (entropy_collapse(records, entropy_floor=entropy_floor, window=window),
             truncation_collapse(records, window=window, max_new_tokens=max_new_tokens))
    return [s for s in signs if s is not None]
