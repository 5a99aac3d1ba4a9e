"""`jaxgrpo-study`: a 2 configurations x 2 seeds study of the toy model end to end (table, intervals, plots,
report), killed mid-grid and resumed without running a finished cell again; a bad grid key is refused
before anything runs; and the interval arithmetic against hand-computed values."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import jax
import pytest

from jaxgrpo import intervals
from jaxgrpo.evaluation import study
from jaxgrpo.tools import cli
from tests.support import processes
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT

STUDY_FILE = """
from jaxgrpo.evaluation.study import Study


def study():
    return Study(
        name="tiny",
        experiment={experiment!r},
        claim="RLOO's leave-one-out baseline learns the toy sum as GRPO's group normalization does",
        methods={{"grpo": {{}}, "rloo": {{"advantage": "rloo"}}}},
        seeds=[0, 1],
        metrics=["eval/pass@1", "accuracy"],
        overrides={{{overrides}}},
        grid={{{grid}}},
    )
"""
# As small as a toy run gets: the toy's warm-up, then 2 steps of 4 x 2 samples, an evaluation of 4 questions
# after each.
TINY = ('"steps": 2, "prompts_per_step": 4, "group_size": 2, "task.num_eval_examples": 4, "eval_every": 1, '
        '"eval_pass_k": 2, "checkpoint_every": 1')


def write_study(tmp_path, overrides=TINY, grid="") -> str:
    path = tmp_path / "tiny_study.py"
    path.write_text(STUDY_FILE.format(experiment=os.path.join(ROOT, "experiments", "toy_sum.py"), overrides=overrides,
                                      grid=grid))
    return str(path)


def test_intervals_match_hand_computed_values():
    # Wilson, 8 of 10: center (0.8 + 1.92/10) / 1.384 = 0.7168, half 1.96 sqrt(0.016 + 0.00096) / 1.384 = 0.1844
    interval = intervals.wilson_interval(8, 10)
    assert (interval.low, interval.high) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert intervals.wilson_interval(0, 5).low == 0.0 and intervals.wilson_interval(0, 5).high > 0
    # t-interval of 1, 2, 3: mean 2, s = 1, t(2) = 4.303 -> 2 +- 4.303 / sqrt(3)
    t = intervals.t_interval([1.0, 2.0, 3.0])
    assert (t.value, t.low, t.high) == pytest.approx((2.0, 2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)))
    assert math.isnan(intervals.t_interval([5.0]).low)
    b = intervals.bootstrap_interval([0.0, 1.0] * 50)
    assert b.low < 0.5 < b.high and b.high - b.low == pytest.approx(2 * 1.96 * 0.05, abs=0.03)


def test_bad_grid_key_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    for overrides, grid in ((TINY, '"optimizer.lrr": [1e-3, 3e-3]'), ('"stepz": 2', "")):
        path = write_study(tmp_path, overrides=overrides, grid=grid)
        assert cli.study_main([path, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        wrong = "optimizer.lrr" if grid else "stepz"
        assert len(err.splitlines()) == 1 and f"key '{wrong}' is not a config field" in err, err
        assert not out.exists()


def _runner_command(path, out, *extra):
    """`jaxgrpo-study PATH --out OUT` run from this checkout (the console script's function, no install needed)."""
    return [sys.executable, "-c", "import sys; from jaxgrpo.tools.cli import study_main; sys.exit(study_main())", path,
            "--out", out, *extra]


def test_two_by_two_study_runs_collates_and_resumes_after_a_kill(tmp_path):
    path, out = write_study(tmp_path), str(tmp_path / "study")
    env = processes.child_env()  # the cells run as the command line runs them: one CPU device
    first = subprocess.Popen(_runner_command(path, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    done = os.path.join(out, "done")
    deadline = time.time() + 300
    while not (os.path.isdir(done) and os.listdir(done)):  # kill it once the first cell has finished
        assert first.poll() is None and time.time() < deadline, first.stdout.read().decode()
        time.sleep(0.5)
    time.sleep(3)  # into the second cell
    first.send_signal(signal.SIGKILL)
    first.wait()
    finished = sorted(os.listdir(done))
    assert len(finished) == 1
    marker = os.path.join(done, finished[0])
    stamp = os.stat(marker).st_mtime_ns
    metrics_file = os.path.join(out, "cells", finished[0][:-len(".json")], "metrics.jsonl")
    metrics_stamp = os.stat(metrics_file).st_mtime_ns

    second = subprocess.run(_runner_command(path, out, "--workers", "2"), env=env, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"{finished[0][:-len('.json')]}: finished before, not run again" in second.stdout
    assert os.stat(marker).st_mtime_ns == stamp and os.stat(metrics_file).st_mtime_ns == metrics_stamp
    assert len(os.listdir(done)) == 4

    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    for label in ("method=grpo", "method=rloo"):
        entry = results["final"][f"{label}|eval/pass@1"]
        assert sorted(entry["seeds"]) == ["0", "1"]
        low, high = entry["ci95"]
        values = list(entry["seeds"].values())
        assert entry["mean"] == pytest.approx(sum(values) / 2)
        assert low <= entry["mean"] <= high
        # two seeds: mean +- 12.706 |a - b| / 2
        assert high - entry["mean"] == pytest.approx(12.706 * abs(values[0] - values[1]) / 2, abs=1e-9)
        with open(os.path.join(out, "cells", f"{label},seed=0", "metrics.jsonl")) as f:
            assert [json.loads(line)["step"] for line in f] == [1, 2]
        # The change over each run: its last evaluation minus its first (step 0), one per seed, with their interval.
        change = results["change_over_run"][f"{label}|eval/pass@1"]
        for seed in ("0", "1"):
            with open(os.path.join(out, "cells", f"{label},seed={seed}", "eval.jsonl")) as f:
                evals = [json.loads(line) for line in f]
            assert [e["step"] for e in evals] == [0, 1, 2]
            assert change["seeds"][seed] == pytest.approx(evals[-1]["pass@1"] - evals[0]["pass@1"])
        assert change["mean"] == pytest.approx(sum(change["seeds"].values()) / 2)
    report = open(os.path.join(out, "report.md")).read()
    assert "| method=grpo |" in report and "minus method=grpo" in report and "RLOO" in report
    assert "| change over the run |" in report
    plots = sorted(os.listdir(os.path.join(out, "plots")))
    assert plots == ["accuracy_curves.png", "accuracy_final.png", "eval_pass_1_curves.png", "eval_pass_1_final.png"]


@pytest.mark.parametrize("name", sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "studies")) if f.endswith(".py")))
def test_shipped_study_files_build_and_every_cell_validates(name):
    """Each study file of docs/studies.md still loads, and every cell's config passes the checks the runner makes
    before anything runs: a renamed config field or kernel breaks this test, not a user's rerun of a claim."""
    spec, experiment = study.load_study(os.path.join(ROOT, "studies", name + ".py"))
    assert spec.name == name  # its default output, runs/studies/<name>, is the one docs/studies.md names
    cells = study.check(spec, experiment)
    assert len(cells) == len(spec.methods or {"": {}}) * math.prod(map(len, spec.grid.values())) * len(spec.seeds)
    assert len(spec.seeds) >= 3


def _record(out, cell, config):
    """What a finished cell leaves: its run's config.json and the runner's done marker."""
    run_dir = os.path.join(out, "cells", cell.name)
    os.makedirs(os.path.join(run_dir, "checkpoints", "2"), exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(config, f)
    os.makedirs(os.path.join(out, "done"), exist_ok=True)
    with open(os.path.join(out, "done", cell.name + ".json"), "w") as f:
        json.dump({"seconds": 1.0}, f)


def _effective_config(experiment, cell, run_dir):
    from jaxgrpo.config import apply_override, load_experiment, resolve_packing, to_dict

    cfg = load_experiment(experiment)
    for key, value in cell.overrides:
        apply_override(cfg, key, value if isinstance(value, str) else repr(value))
    apply_override(cfg, "seed", str(cell.seed))
    cfg.run_dir = run_dir
    return to_dict(resolve_packing(cfg, jax.default_backend()))  # as a run's config.json holds it


def test_a_finished_cell_run_with_another_config_is_refused_naming_the_cell_and_keys_or_rerun(tmp_path, capsys):
    """Changing the study's overrides (a learning rate, the steps) leaves the cells' names as they were: the
    recorded config.json of a finished cell then differs from its effective config, and its old results must not
    be reported as the new study's. The runner refuses (one line: the cell, the changed keys, the fix), for a run
    and for --collate-only, runs nothing, and with --rerun-changed restarts exactly the changed cells."""
    path, out = write_study(tmp_path), str(tmp_path / "study")
    loaded, experiment = study.load_study(path)
    first, second = study.cells(loaded)[:2]
    recorded = _effective_config(experiment, first, os.path.join(out, "cells", first.name))
    old = json.loads(json.dumps(recorded))
    old["optimizer"]["lr"], old["steps"] = 3e-3, 40
    _record(out, first, old)
    _record(out, second, _effective_config(experiment, second, "/elsewhere/moved"))  # only run_dir differs

    for extra in ([], ["--collate-only"]):
        assert cli.study_main([path, "--out", out, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("jaxgrpo-study: error: cell "), err
        assert f"cell {first.name} " in err and "optimizer.lr 0.003 -> 0.001" in err and "steps 40 -> 2" in err, err
        assert "--rerun-changed" in err and "new --out" in err and second.name not in err, err
        assert not os.path.exists(os.path.join(out, "logs")) and not os.path.exists(os.path.join(out, "report.md"))

    runner = study.Runner(loaded, experiment, out, rerun_changed=True)
    assert runner.rerun == {first.name}
    assert not runner.is_done(first) and runner.is_done(second)
    command = runner.command(first)
    assert "--overwrite" in command and "--resume" not in command  # from scratch, though checkpoints exist
    with open(os.path.join(out, "cells", first.name, "config.json"), "w") as f:
        json.dump(recorded, f)  # the cell as the study now gives it: accepted
    assert study.Runner(loaded, experiment, out).rerun == set()
