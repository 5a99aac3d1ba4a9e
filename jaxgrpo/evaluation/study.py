"""Studies: a claim tested over a grid of configurations and seeds, with intervals (`jaxgrpo-study`).

A study file is Python with a `study()` function returning a `Study`::

    from jaxgrpo.evaluation.study import Study

    def study() -> Study:
        return Study(
            name="dr_grpo_length",
            experiment="../experiments/toy_sum.py",          # relative to the study file
            claim="Dr. GRPO's unbiased aggregation shortens completions at equal accuracy",
            methods={"grpo": {}, "dr_grpo": {"advantage": "dr_grpo", "aggregation": "seq_mean_token_sum_norm"}},
            grid={"optimizer.lr": [1e-3, 3e-3]},            # any config fields; the product is taken
            seeds=[0, 1, 2],
            metrics=["eval/greedy_accuracy", "completion_length"],
            overrides={"steps": 40},                         # applied to every cell first
        )

Every cell (a method x a grid point x a seed) is one `jaxgrpo-train` run in its own run directory,
`STUDY_DIR/cells/<cell>/`, run as a child process. The runner is resumable: a finished cell (its
marker in `STUDY_DIR/done/`) is never run again; an unfinished one resumes from its newest checkpoint,
or restarts when it has none. Cells run one at a time, or `workers` at a time.

A cell's name says only its method, grid point and seed, so the runner also compares each cell's
effective config (the experiment file with the study's overrides, now) with the config.json its run
recorded: a cell run with another config (another learning rate in `overrides`, more steps, an edited
experiment file) is refused before anything runs, naming the cell and the changed keys, since its
results are not this study's. `rerun_changed=True` (`--rerun-changed`) runs those cells again from
scratch instead.

Collation reads each cell's metrics.jsonl (`name`) and eval.jsonl (`eval/name`): per metric and
configuration the final value's mean over seeds with a 95% t-interval, its change over the run (the last
record minus the first, e.g. the evaluation at step 0, paired within each seed's run: whether a method moved the
metric at all), the difference from the first configuration paired by seed, curves with bands, final values with
error bars, and `report.md`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np

from jaxgrpo import intervals
from jaxgrpo.errors import UserError

EVAL_PREFIX = "eval/"


class StudyError(UserError, ValueError):
    """A study file or its grid is wrong; the message (one line) names the problem and the fix."""


@dataclasses.dataclass
class Study:
    """A claim, the experiment it is tested on, the configurations compared and the seeds.

    `methods` maps a name to config overrides (several fields at once, e.g. a method's kernels);
    `grid` maps config fields (dotted, as `--set` takes them) to the values to try. The cells are
    methods x product(grid) x seeds. The first configuration is the baseline of the differences.
    """

    name: str
    experiment: str
    claim: str
    metrics: Sequence[str]
    seeds: Sequence[int] = (0, 1, 2)
    methods: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    grid: dict[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: What the paper reports, for the report (free text); empty when there is no number to compare.
    paper: str = ""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the study: a configuration (its label and overrides) and a seed."""

    label: str
    overrides: tuple[tuple[str, Any], ...]
    seed: int

    @property
    def name(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.=,@+-]", "_", f"{self.label},seed={self.seed}")


def load_study(path: str) -> tuple[Study, str]:
    """(the `Study` of a study file, its experiment file's absolute path)."""
    if not os.path.isfile(path):
        raise StudyError(f"study file {path!r} not found (expected a Python file defining study())")
    spec = importlib.util.spec_from_file_location("jaxgrpo_study_" + os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        build = getattr(module, "study", None)
        if not callable(build):
            raise StudyError(f"{path} must define a function study() -> jaxgrpo.evaluation.study.Study")
        study = build()
    except StudyError:
        raise
    except Exception as error:
        raise StudyError(f"{path}: {type(error).__name__}: {' '.join(str(error).splitlines())}") from error
    if not isinstance(study, Study):
        raise StudyError(f"study() in {path} must return a jaxgrpo.evaluation.study.Study, got {type(study).__name__}")
    experiment = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), study.experiment))
    if not os.path.isfile(experiment):
        raise StudyError(f"{path}: experiment {study.experiment!r} not found (looked for {experiment}; it is "
                         "relative to the study file)")
    return study, experiment


def _format_value(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def cells(study: Study) -> list[Cell]:
    """Every cell: methods x product(grid) x seeds, in that order."""
    methods = study.methods or {"": {}}
    keys = list(study.grid)
    points = list(itertools.product(*(study.grid[k] for k in keys))) if keys else [()]
    out = []
    for method, method_overrides in methods.items():
        for point in points:
            parts = ([f"method={method}"] if method else []) + [f"{k}={_format_value(v)}" for k, v in zip(keys, point)]
            label = ",".join(parts) or "base"
            overrides = tuple({**study.overrides, **method_overrides, **dict(zip(keys, point))}.items())
            out.extend(Cell(label, overrides, int(seed)) for seed in study.seeds)
    return out


def check(study: Study, experiment: str) -> list[Cell]:
    """Every cell's config builds and validates; raises `StudyError` (one line) before anything runs."""
    from jaxgrpo.config import (ExperimentError, apply_override, load_experiment, valid_keys, validate)

    if not study.seeds:
        raise StudyError(f"study {study.name!r} has no seeds; give seeds=[0, 1, 2] (a t-interval needs at least 2)")
    if not study.metrics:
        raise StudyError(f"study {study.name!r} names no metrics; e.g. metrics=['eval/greedy_accuracy', 'reward_mean']")
    if any(len(v) == 0 for v in study.grid.values()):
        raise StudyError(f"study {study.name!r}: grid keys {[k for k, v in study.grid.items() if not v]} have no values")
    try:
        base = load_experiment(experiment)
    except (ExperimentError, FileNotFoundError, AttributeError, TypeError) as error:
        raise StudyError(f"study {study.name!r}: {error}") from error
    keys = set(valid_keys(base))

    def check_key(key: str, where: str) -> None:
        # a dict field (task.kwargs, loss_kwargs, ...) takes any entry: `loss_kwargs.eps_high`
        if key not in keys and not any(key.startswith(k + ".") for k in keys):
            raise StudyError(f"{where} key {key!r} is not a config field; valid fields: {', '.join(sorted(keys))}")

    for key in study.grid:
        check_key(key, "grid")
    for key in study.overrides:
        check_key(key, "overrides")
    for method, overrides in study.methods.items():
        for key in overrides:
            check_key(key, f"method {method!r}:")
    all_cells = cells(study)
    for cell in all_cells:
        cfg = load_experiment(experiment)
        try:
            for key, value in cell.overrides:
                apply_override(cfg, key, _format_value(value))
            apply_override(cfg, "seed", str(cell.seed))
            validate(cfg)
        except (KeyError, ValueError, TypeError) as error:
            message = error.args[0] if isinstance(error, KeyError) and error.args else error
            raise StudyError(f"cell {cell.name}: {message}") from error
    return all_cells


def _die_with_parent() -> None:
    """In the child: be killed when the runner dies (Linux), so a killed runner leaves no orphan holding a run's lock."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Runner:
    """Runs the cells of a study into `out_dir` and collates them.

    A cell whose run recorded another config than the study now gives it (`changed_cells`) is refused
    (`StudyError`) unless `rerun_changed`, which runs it again from scratch.
    """

    def __init__(self, study: Study, experiment: str, out_dir: str, *, log: Callable[[str], None] | None = None,
                 compilation_cache: bool = True, rerun_changed: bool = False):
        self.study, self.experiment, self.out_dir = study, experiment, out_dir
        self.compilation_cache = compilation_cache
        self.log = log or (lambda message: print(message, flush=True))
        self.cells = check(study, experiment)
        changed = self.changed_cells()
        if changed and not rerun_changed:
            name, changes = next(iter(changed.items()))
            more = f" (and {len(changed) - 1} more cells)" if len(changed) > 1 else ""
            raise StudyError(
                f"cell {name}{more} of {out_dir} was run with another config than the study now gives it: "
                f"{'; '.join(changes)}; its results would be reported as this study's. Run the study into a new "
                "--out directory, or pass --rerun-changed to run the changed cells again from scratch")
        #: Cells to run again from scratch (their recorded config differs); emptied as each is rerun.
        self.rerun = set(changed)

    def effective_config(self, cell: Cell) -> dict:
        """The config (as config.json holds it) `jaxgrpo-train` runs `cell` with: the experiment, the cell's
        overrides, its seed and run directory."""
        from jaxgrpo.config import apply_override, load_experiment, to_dict

        cfg = load_experiment(self.experiment)
        for key, value in cell.overrides:
            apply_override(cfg, key, _format_value(value))
        apply_override(cfg, "seed", str(cell.seed))
        cfg.run_dir = self.run_dir(cell)
        import jax

        from jaxgrpo.config import resolve_packing

        return to_dict(resolve_packing(cfg, jax.default_backend()))  # as `Trainer` saves it (packing settled)

    def changed_cells(self) -> dict[str, list[str]]:
        """{cell name: 'key old -> new', ...} for each cell whose run recorded (config.json) another config
        than its effective one; the run directory may differ (a moved study directory)."""
        from jaxgrpo.config import Config, to_dict
        from jaxgrpo.run.rundir import CONFIG_FILE, config_changes

        changed = {}
        for cell in self.cells:
            path = os.path.join(self.run_dir(cell), CONFIG_FILE)
            if not os.path.isfile(path):
                continue
            try:
                with open(path) as f:
                    recorded = json.load(f)
            except (OSError, ValueError) as error:
                changed[cell.name] = [f"{path} does not read ({' '.join(str(error).split())})"]
                continue
            changes = config_changes(recorded, self.effective_config(cell), to_dict(Config()),
                                     ignore=frozenset({"run_dir"}))
            if changes:
                changed[cell.name] = changes
        return changed

    def run_dir(self, cell: Cell) -> str:
        return os.path.join(self.out_dir, "cells", cell.name)

    def done_marker(self, cell: Cell) -> str:
        return os.path.join(self.out_dir, "done", cell.name + ".json")

    def is_done(self, cell: Cell) -> bool:
        return cell.name not in self.rerun and os.path.exists(self.done_marker(cell))

    def command(self, cell: Cell) -> list[str]:
        run_dir = self.run_dir(cell)
        overrides = [f"{k}={_format_value(v)}" for k, v in cell.overrides] + [f"seed={cell.seed}"]
        command = [sys.executable, "-m", "jaxgrpo.tools.cli", self.experiment, "--run-dir", run_dir, "--set", *overrides]
        checkpoints = os.path.join(run_dir, "checkpoints")
        if cell.name in self.rerun:
            command.append("--overwrite")  # run with another config: start it again from scratch
        elif os.path.isdir(checkpoints) and any(n.isdigit() for n in os.listdir(checkpoints)):
            command.append("--resume")  # an unfinished cell continues from its newest checkpoint
        elif os.path.isdir(run_dir) and os.listdir(run_dir):
            command.append("--overwrite")  # it died before its first checkpoint: start it again
        return command

    def environment(self) -> dict[str, str]:
        """The cells' environment: the cells of a study compile the same programs, so they share JAX's persistent
        compilation cache (STUDY_DIR/compilation_cache; a toy cell's CPU time fell from 46 s to 18 s with it),
        unless the caller chose a cache directory of its own or turned the cache off."""
        env = dict(os.environ)
        if self.compilation_cache and "JAX_COMPILATION_CACHE_DIR" not in env:
            env.update(JAX_ENABLE_COMPILATION_CACHE="true",
                       JAX_COMPILATION_CACHE_DIR=os.path.abspath(os.path.join(self.out_dir, "compilation_cache")),
                       JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        return env

    def run_cell(self, cell: Cell) -> bool:
        if self.is_done(cell):
            self.log(f"[study] {cell.name}: finished before, not run again")
            return True
        command = self.command(cell)
        if cell.name in self.rerun and os.path.exists(self.done_marker(cell)):
            os.remove(self.done_marker(cell))  # its results were another config's
        how = "resuming" if "--resume" in command else "restarting" if "--overwrite" in command else "running"
        self.log(f"[study] {cell.name}: {how}")
        os.makedirs(os.path.join(self.out_dir, "logs"), exist_ok=True)
        start = time.time()
        with open(os.path.join(self.out_dir, "logs", cell.name + ".log"), "ab") as log:
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                                   preexec_fn=_die_with_parent)
        if code != 0:
            self.log(f"[study] {cell.name}: failed (exit {code}); see {os.path.join(self.out_dir, 'logs', cell.name + '.log')}")
            return False
        self.rerun.discard(cell.name)
        os.makedirs(os.path.dirname(self.done_marker(cell)), exist_ok=True)
        with open(self.done_marker(cell) + ".tmp", "w") as f:
            json.dump({"seconds": time.time() - start, "command": command}, f)
        os.replace(self.done_marker(cell) + ".tmp", self.done_marker(cell))
        self.log(f"[study] {cell.name}: done in {time.time() - start:.0f} s")
        return True

    def run(self, workers: int = 1) -> bool:
        """Runs every unfinished cell; True when all are finished."""
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, "study.json"), "w") as f:
            json.dump({"study": dataclasses.asdict(self.study), "experiment": self.experiment,
                       "cells": [c.name for c in self.cells]}, f, indent=2, default=repr)
        if workers <= 1:
            results = [self.run_cell(cell) for cell in self.cells]
        else:
            with ThreadPoolExecutor(workers) as pool:
                results = list(pool.map(self.run_cell, self.cells))
        return all(results)


# -- collation ------------------------------------------------------------------------------


def _read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def metric_curve(run_dir: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of `metric` in a run directory: `eval/name` from eval.jsonl, `name` from metrics.jsonl."""
    if metric.startswith(EVAL_PREFIX):
        records, key = _read_jsonl(os.path.join(run_dir, "eval.jsonl")), metric[len(EVAL_PREFIX):]
    else:
        records, key = _read_jsonl(os.path.join(run_dir, "metrics.jsonl")), metric
    by_step = {r["step"]: float(r[key]) for r in records if key in r and r[key] is not None}
    steps = np.array(sorted(by_step), np.int64)
    return steps, np.array([by_step[s] for s in steps], np.float64)


@dataclasses.dataclass
class Collated:
    """Per configuration label and metric: final values by seed, their interval, curves, paired differences, and
    each run's change (last record minus first; runs with a single record have none)."""

    labels: list[str]
    metrics: list[str]
    finals: dict[tuple[str, str], dict[int, float]]
    summary: dict[tuple[str, str], intervals.Interval]
    differences: dict[tuple[str, str], intervals.Interval]
    curves: dict[tuple[str, str], dict[int, tuple[np.ndarray, np.ndarray]]]
    changes: dict[tuple[str, str], dict[int, float]] = dataclasses.field(default_factory=dict)
    #: The mean change over the run per label and metric, with its 95% t-interval over seeds.
    change_summary: dict[tuple[str, str], intervals.Interval] = dataclasses.field(default_factory=dict)


def collate(runner: Runner) -> Collated:
    labels = list(dict.fromkeys(c.label for c in runner.cells))
    finals, curves, summary, differences, changes, change_summary = {}, {}, {}, {}, {}, {}
    for metric in runner.study.metrics:
        for label in labels:
            finals[label, metric], curves[label, metric], changes[label, metric] = {}, {}, {}
            for cell in (c for c in runner.cells if c.label == label and runner.is_done(c)):
                steps, values = metric_curve(runner.run_dir(cell), metric)
                if steps.size:
                    curves[label, metric][cell.seed] = (steps, values)
                    finals[label, metric][cell.seed] = float(values[-1])
                if steps.size > 1:
                    changes[label, metric][cell.seed] = float(values[-1] - values[0])
            summary[label, metric] = intervals.t_interval(list(finals[label, metric].values()))
            change_summary[label, metric] = intervals.t_interval(list(changes[label, metric].values()))
        base = finals[labels[0], metric]
        for label in labels[1:]:
            seeds = sorted(set(base) & set(finals[label, metric]))
            differences[label, metric] = intervals.t_interval([finals[label, metric][s] - base[s] for s in seeds])
    return Collated(labels, list(runner.study.metrics), finals, summary, differences, curves, changes, change_summary)


def _cell(interval: intervals.Interval, n: int) -> str:
    if math.isnan(interval.value):
        return "n/a"
    if math.isnan(interval.low):
        return f"{interval.value:.3f} (n={n})"
    return f"{interval.value:.3f} [{interval.low:.3f}, {interval.high:.3f}] (n={n})"


def _label_table(collated: Collated, corner: str, summary: dict, by_seed: dict) -> str:
    """A Markdown table of one row per configuration and one column per metric: `summary`'s interval over the
    seeds of `by_seed`."""
    head = f"| {corner} | " + " | ".join(collated.metrics) + " |"
    rule = "|---|" + "---|" * len(collated.metrics)
    rows = [f"| {label} | " + " | ".join(_cell(summary[label, m], len(by_seed[label, m])) for m in collated.metrics)
            + " |" for label in collated.labels]
    return "\n".join([head, rule, *rows])


def table(collated: Collated) -> str:
    """A Markdown table: each configuration's final value of each metric, mean [95% t-interval] over seeds."""
    return _label_table(collated, "configuration", collated.summary, collated.finals)


def change_table(collated: Collated) -> str:
    """Each configuration's change of each metric over the run (last record minus first, paired within each
    seed's run): mean [95% t-interval]."""
    return _label_table(collated, "change over the run", collated.change_summary, collated.changes)


def difference_table(collated: Collated) -> str:
    """Each configuration minus the first, paired by seed: mean [95% t-interval]."""
    if len(collated.labels) < 2:
        return ""
    head = f"| minus {collated.labels[0]} | " + " | ".join(collated.metrics) + " |"
    rule = "|---|" + "---|" * len(collated.metrics)
    rows = []
    for label in collated.labels[1:]:
        cells_ = []
        for m in collated.metrics:
            n = len(set(collated.finals[label, m]) & set(collated.finals[collated.labels[0], m]))
            cells_.append(_cell(collated.differences[label, m], n))
        rows.append(f"| {label} | " + " | ".join(cells_) + " |")
    return "\n".join([head, rule, *rows])


def plot(collated: Collated, out_dir: str) -> list[str]:
    """Per metric: curves (mean over seeds, 95% t-band) and final values (mean, 95% t error bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for metric in collated.metrics:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", metric)
        fig, ax = plt.subplots(figsize=(6, 4))
        for label in collated.labels:
            runs = collated.curves[label, metric]
            if not runs:
                continue
            steps = sorted(set.intersection(*(set(s.tolist()) for s, _ in runs.values())))
            rows = np.array([[dict(zip(s.tolist(), v))[t] for t in steps] for s, v in runs.values()])
            bands = [intervals.t_interval(rows[:, j]) for j in range(len(steps))]
            mean = np.array([b.value for b in bands])
            ax.plot(steps, mean, marker="o", markersize=3, label=f"{label} ({len(runs)} seeds)")
            if len(runs) > 1:
                ax.fill_between(steps, [b.low for b in bands], [b.high for b in bands], alpha=0.2)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric}: mean over seeds, 95% t-band")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{safe}_curves.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

        fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(collated.labels) + 2), 4))
        xs = np.arange(len(collated.labels))
        values = [collated.summary[label, metric] for label in collated.labels]
        mean = np.array([v.value for v in values])
        low = np.array([v.value - v.low if not math.isnan(v.low) else 0.0 for v in values])
        high = np.array([v.high - v.value if not math.isnan(v.high) else 0.0 for v in values])
        ax.errorbar(xs, mean, yerr=[low, high], fmt="o", capsize=5)
        for x, label in zip(xs, collated.labels):
            seeds = collated.finals[label, metric]
            ax.scatter([x + 0.08] * len(seeds), list(seeds.values()), s=10, color="gray", zorder=3)
        ax.set_xticks(xs, collated.labels, rotation=20, ha="right", fontsize=7)
        ax.set_ylabel(f"final {metric}")
        ax.set_title(f"final {metric}: mean, 95% t-interval; dots are seeds")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{safe}_final.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def report(runner: Runner, study_file: str, command: str) -> str:
    """Collates the finished cells: writes results.json, the plots and report.md; returns report.md's path."""
    collated = collate(runner)
    plots = plot(collated, os.path.join(runner.out_dir, "plots"))
    study = runner.study
    finished = sum(runner.is_done(c) for c in runner.cells)
    lines = [
        f"# Study: {study.name}", "",
        f"**Claim under test.** {study.claim}", "",
        *([f"**The paper reports.** {study.paper}", ""] if study.paper else []),
        f"Study file `{study_file}` on experiment `{os.path.relpath(runner.experiment)}`; "
        f"seeds {list(study.seeds)}; {finished} of {len(runner.cells)} cells finished.", "",
        f"Command: `{command}`", "",
        "## Final values (mean over seeds, 95% t-interval)", "", table(collated), "",
        "## Change over the run (last record minus first, paired within each seed's run; 95% t-interval)", "",
        change_table(collated), "",
        "A metric evaluated at step 0 changes from the untrained policy's value; a training metric from the "
        "first step's.", "",
    ]
    differences = difference_table(collated)
    if differences:
        lines += ["## Differences from the first configuration (paired by seed, 95% t-interval)", "",
                  differences, "",
                  "An interval that excludes 0 is a difference these seeds resolve; one that contains 0 is not.", ""]
    lines += ["## Plots", ""] + [f"![{os.path.basename(p)}](plots/{os.path.basename(p)})" for p in plots] + [""]
    path = os.path.join(runner.out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    def by_label(by_seed: dict, summary: dict) -> dict:
        return {f"{label}|{m}": {"seeds": by_seed[label, m], "mean": summary[label, m].value,
                                 "ci95": [summary[label, m].low, summary[label, m].high]}
                for label in collated.labels for m in collated.metrics}

    results = {
        "study": study.name, "claim": study.claim,
        "final": by_label(collated.finals, collated.summary),
        "change_over_run": by_label(collated.changes, collated.change_summary),
        "difference_from_first": {f"{label}|{m}": {"mean": v.value, "ci95": [v.low, v.high]}
                                  for (label, m), v in collated.differences.items()},
    }
    with open(os.path.join(runner.out_dir, "results.json"), "w") as f:
        json.dump(_finite_or_none(results), f, indent=2)
    return path


def _finite_or_none(tree: Any) -> Any:
    """`tree` with NaN floats as None, so results.json is standard JSON."""
    if isinstance(tree, dict):
        return {k: _finite_or_none(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_finite_or_none(v) for v in tree]
    return None if isinstance(tree, float) and math.isnan(tree) else tree

