"""Kill a training run for real (SIGKILL), resume it, and compare it with the run that was never killed.

The runs are child processes on one CPU device sharing a persistent compilation cache, so the killed and the
resumed run load the programs the uninterrupted run compiled instead of compiling them again: the test's time
is the training, not three compilations. (The in-process tests keep the cache off: see conftest.py.)
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from typing import NamedTuple

import jax
import numpy as np

from jaxgrpo.run.metrics import read_jsonl
from tests.support import processes
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


def child_env(cache_dir: str | os.PathLike) -> dict:
    """The environment of a run under test: one CPU device, the suite's compile settings (tests/conftest.py), a
    compilation cache at `cache_dir` shared by the runs."""
    return processes.child_env(JAX_ENABLE_COMPILATION_CACHE="true", JAX_COMPILATION_CACHE_DIR=str(cache_dir),
                               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


_EXPERIMENT_SCRIPT = """
import os, signal, sys
from jaxgrpo.config import apply_overrides, load_experiment
from jaxgrpo.train import Trainer

run_dir, kill, resume = sys.argv[1], sys.argv[2] == "kill", sys.argv[3] == "resume"
cfg = load_experiment({experiment!r})
apply_overrides(cfg, [*{overrides!r}, "run_dir=" + run_dir])


def on_step(step, record):
    if kill and step == {kill_after}:  # the checkpoint of this step is on disk: die hard
        os.kill(os.getpid(), signal.SIGKILL)


Trainer(cfg).run(resume=resume, progress=False, on_step=on_step)
"""


def experiment_script(experiment: str, overrides: list[str], kill_after: int) -> str:
    """A script for `straight_and_killed` that trains `experiment` with `overrides` and, told to kill, SIGKILLs
    itself once step `kill_after` is recorded (its checkpoint on disk when checkpoint_every divides it)."""
    return _EXPERIMENT_SCRIPT.format(experiment=experiment, overrides=list(overrides), kill_after=int(kill_after))


class Runs(NamedTuple):
    straight: pathlib.Path  # the run that was never killed
    killed: pathlib.Path  # the run killed, then resumed to the end
    steps_at_kill: int  # the metric records the killed run had written when it died


def straight_and_killed(tmp_path: pathlib.Path, script: str) -> Runs:
    """The run directories of `script`, a Python program run as `script RUN_DIR KILL MODE`.

    KILL is "kill" or "run": with "kill" the script SIGKILLs itself where its test wants (after a step's checkpoint,
    inside an environment's turn); MODE is "fresh" or "resume" (`Trainer.run(resume=...)`). The straight run goes
    to the end; the killed run is killed, then resumed to the end. Asserts each run ended as planned.
    """
    path = tmp_path / "run.py"
    path.write_text(script)
    env = child_env(tmp_path / "jax_cache")

    def run(run_dir, kill, mode):
        return subprocess.run([sys.executable, str(path), str(run_dir), kill, mode], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=900)

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    proc = run(straight, "run", "fresh")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run(killed, "kill", "fresh")
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    steps_at_kill = len(read_jsonl(killed / "metrics.jsonl"))
    proc = run(killed, "run", "resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Runs(straight, killed, steps_at_kill)


def comparable(run_dir) -> list[dict]:
    """The run's metric records without the timing fields (which differ between any two runs)."""
    return [{k: v for k, v in r.items() if "time_" not in k and not k.endswith("_per_s")}
            for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))]


def checkpoint(run_dir, step: int) -> dict:
    """Every array of the run's checkpoint at `step` (train state, kernel state, reference policy), as numpy."""
    import orbax.checkpoint as ocp

    restored = ocp.StandardCheckpointer().restore(os.path.join(run_dir, "checkpoints", str(step), "state"))
    return jax.tree.map(np.asarray, restored)
