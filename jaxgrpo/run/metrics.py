"""Run metrics: JSONL and TensorBoard files in the run directory, and PNG learning curves.

Only process 0 writes (multi-host runs call `MetricsWriter` everywhere; the
others are no-ops). Each line of `metrics.jsonl` is one step's flat dict, appended
with a single `write` of the whole line, so a crash can at worst cut the last line
short; readers skip such a torn last line with a warning, and a resumed run drops it.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Iterable, Mapping

import jax
import numpy as np

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"


def _scalar(value):
    value = np.asarray(value)
    return float(value) if value.size == 1 else None


class MetricsWriter:
    """Writes step metrics to `run_dir/metrics.jsonl` and TensorBoard event files."""

    def __init__(self, run_dir: str, *, tensorboard: bool = True, enabled: bool | None = None):
        self.run_dir = run_dir
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self._tb = None
        if not self.enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, float], *, file: str = METRICS_FILE, prefix: str = "",
              log: bool = True) -> dict:
        """Appends one record; returns the record as written (floats only). `log=False` returns the record
        without writing it (a step between two of `Config.log_every`)."""
        record = {"step": int(step)}
        for key, value in metrics.items():
            scalar = _scalar(value)
            if scalar is not None:
                record[key] = scalar
        if not self.enabled or not log:
            return record
        self._append(os.path.join(self.run_dir, file), (json.dumps(record) + "\n").encode())
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and math.isfinite(value):
                    self._tb.add_scalar(prefix + key, value, step)
            self._tb.flush()
        return record

    @staticmethod
    def _append(path: str, line: bytes) -> None:
        # One unbuffered write of the whole line (no Python buffer to flush in pieces), appended with
        # O_APPEND: a crash leaves the line whole or cut, never interleaved with another.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            while written < len(line):  # a short write (a signal, a full pipe): finish the line
                written += os.write(fd, line[written:])
        finally:
            os.close(fd)

    def truncate_after(self, step: int) -> None:
        """Drops records of steps > `step` and a torn last line (after resuming from a checkpoint at `step`).

        The files are replaced atomically, so a crash here leaves the old or the new version.
        """
        if not self.enabled:
            return
        for file in (METRICS_FILE, EVAL_FILE):
            path = os.path.join(self.run_dir, file)
            if os.path.exists(path):
                kept = [r for r in read_jsonl(path) if r["step"] <= step]
                with open(path + ".tmp", "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in kept)
                os.replace(path + ".tmp", path)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_jsonl(path: str) -> list[dict]:
    """The records of a JSONL metrics file.

    A last line that does not parse was cut short by a crash during its write: it is skipped with a
    warning. A bad line before the last is damage of another kind and raises ValueError naming it.
    """
    with open(path) as f:
        lines = [(number, line) for number, line in enumerate(f, 1) if line.strip()]
    records = []
    for i, (number, line) in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i < len(lines) - 1:
                from jaxgrpo.errors import DataError

                raise DataError(f"{path}, line {number}, is not a JSON record ({e}); remove or repair that line") from None
            logger.warning("%s: skipped its last line, cut short (a crash while it was written): %.80r",
                           path, line.rstrip("\n"))
    return records


#: Curves drawn by `plot_run`, when present: (title, metric keys).
PLOTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward_mean",)),
    ("accuracy", ("accuracy",)),
    ("groups", ("frac_all_correct", "frac_all_wrong")),
    ("loss", ("loss",)),
    ("KL and entropy", ("kl", "entropy")),
    ("clip fraction", ("clip_fraction",)),
    ("completion length", ("completion_length",)),
    ("throughput (tokens/s)", ("sample_tokens_per_s", "train_tokens_per_s")),
)


def plot_run(run_dir: str, out_dir: str | None = None) -> list[str]:
    """Writes PNG learning curves of a run; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir!r}: is it a jaxgrpo run directory?")
    records = read_jsonl(path)
    evals = read_jsonl(os.path.join(run_dir, EVAL_FILE)) if os.path.exists(os.path.join(run_dir, EVAL_FILE)) else []
    out_dir = out_dir or os.path.join(run_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    panels = [(title, keys, records) for title, keys in PLOTS if any(k in r for r in records for k in keys)]
    eval_keys = sorted({k for r in evals for k in r if k != "step"})
    if eval_keys:
        panels.append(("evaluation (held-out)", tuple(eval_keys), evals))
    for title, keys, source in panels:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key in keys:
            pts = [(r["step"], r[key]) for r in source if key in r and math.isfinite(r[key])]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, label=key)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        name = os.path.join(out_dir, title.split(" (")[0].replace(" ", "_") + ".png")
        fig.savefig(name, dpi=100)
        plt.close(fig)
        written.append(name)
    return written


def summarize(records: Iterable[Mapping[str, float]], key: str) -> tuple[float, float]:
    """(first, last) value of `key` over records that have it."""
    values = [r[key] for r in records if key in r]
    if not values:
        raise KeyError(f"no record has {key!r}")
    return values[0], values[-1]
