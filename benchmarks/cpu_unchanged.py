"""Old against new on this CPU: the main job (accuracy, wall time) or the sampler's throughput, alternating trees.

Checks out two revisions (`--old`, `--new`; the working tree when `--new` is omitted) as detached git
worktrees and runs the same job in each, alternately, in the order old, new, new, old, ... so a drift
in the machine's load falls on both sides alike. Each run is a fresh process with `PYTHONPATH` set to
its tree. The experiment file comes from the new tree, so both sides run the same config; each side runs
its own benchmarks/sampler.py (its imports follow its tree; check that the throughput code is the same).

* `--job quickstart`: `python -m jaxgrpo.tools.cli EXPERIMENT` with its own run directory; each run's wall
  time and its held-out greedy accuracy before and after training (from `eval.jsonl`).
* `--job sampler`: `benchmarks/sampler.py --only throughput --dtype DTYPE`; each run's median
  generated tokens/s and its ratio to transformers' `generate` (alternating inside the run).

Then the medians per side and the median of the per-pair new/old ratios.

    python benchmarks/cpu_unchanged.py --old 7ee1168 --pairs 2 --out benchmarks/results/cpu_unchanged.json
    python benchmarks/cpu_unchanged.py --old 7ee1168 --job sampler --dtype bfloat16 --pairs 2

Two pairs of the main job take about 4 x 12 minutes on an idle 2-core machine; of the sampler, ~4 x 3.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _worktree(rev: str, parent: pathlib.Path) -> pathlib.Path:
    path = parent / f"tree-{rev[:12]}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), rev], check=True)
    return path


def _greedy(run_dir: pathlib.Path) -> tuple[float, float]:
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]
    key = "greedy_accuracy" if "greedy_accuracy" in rows[0] else next(k for k in rows[0] if "greedy" in k)
    return float(rows[0][key]), float(rows[-1][key])


def _sampler(tree: pathlib.Path, script: pathlib.Path, dtype: str, repeats: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), JAX_PLATFORMS="cpu")
    cmd = [sys.executable, str(script), "--only", "throughput", "--dtype", dtype, "--repeats", str(repeats)]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"sampler benchmark in {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    # Its first jaxgrpo row: the fixed batch's (`jaxgrpo.sampler`) in a tree before 2026-12-06, the engine's after.
    ours = re.search(r"\| jaxgrpo\.(?:sampler|engine)[^|]*\| (\d+) \|", proc.stdout)
    ratio = re.search(r"\*\*(\d+\.\d+)x\*\*", proc.stdout)
    if not (ours and ratio):
        raise SystemExit(f"could not read the sampler benchmark's table:\n{proc.stdout[-3000:]}")
    return {"tokens_per_s": float(ours.group(1)), "vs_transformers": float(ratio.group(1))}


def _run(tree: pathlib.Path, experiment: pathlib.Path, run_dir: pathlib.Path, sets: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "jaxgrpo.tools.cli", str(experiment), "--set", f"run_dir={run_dir}", *sets]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"run in {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    before, after = _greedy(run_dir)
    return {"wall_s": wall, "greedy_before": before, "greedy_after": after}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="git revision before the change")
    parser.add_argument("--new", default=None, help="git revision after it (default: this working tree)")
    parser.add_argument("--experiment", default="experiments/quickstart.py", help="path in the new tree")
    parser.add_argument("--job", choices=("quickstart", "sampler"), default="quickstart")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="--job sampler")
    parser.add_argument("--repeats", type=int, default=3, help="--job sampler: alternating pairs inside a run")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--set", nargs="*", default=[], dest="sets", help="extra config overrides, both sides")
    parser.add_argument("--out", default=None, help="write the runs and medians as JSON here")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")

    work = pathlib.Path(tempfile.mkdtemp(prefix="cpu_unchanged-"))
    trees = {"old": _worktree(args.old, work), "new": _worktree(args.new, work) if args.new else ROOT}
    experiment = (trees["new"] / args.experiment).resolve()
    revs = {side: subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], check=True,
                                 capture_output=True, text=True).stdout.strip() for side, tree in trees.items()}
    order = [side for i in range(args.pairs) for side in (("old", "new") if i % 2 == 0 else ("new", "old"))]
    runs = []
    try:
        for i, side in enumerate(order):
            if args.job == "sampler":
                result = _sampler(trees[side], trees[side] / "benchmarks" / "sampler.py", args.dtype, args.repeats)
                shown = f"{result['tokens_per_s']:6.0f} tok/s, {result['vs_transformers']:.2f}x transformers"
            else:
                result = _run(trees[side], experiment, work / f"run{i}-{side}", args.sets)
                shown = (f"{result['wall_s']:7.1f} s  greedy {result['greedy_before']:.3f} -> "
                         f"{result['greedy_after']:.3f}")
            runs.append({"side": side, **result})
            print(f"run {i} {side:>3} ({revs[side]}): {shown}", flush=True)
    finally:
        for side, tree in trees.items():
            if tree != ROOT:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)

    measures = ("tokens_per_s", "vs_transformers") if args.job == "sampler" else ("wall_s", "greedy_before", "greedy_after")
    summary = {}
    for side in ("old", "new"):
        mine = [r for r in runs if r["side"] == side]
        summary[side] = {"rev": revs[side], **{f"median_{m}": statistics.median(r[m] for r in mine) for m in measures}}
    pairs = [{r["side"]: r for r in runs[i:i + 2]} for i in range(0, len(runs), 2)]
    for m in measures:
        summary[f"median_ratio_new_over_old_{m}"] = statistics.median(
            p["new"][m] / p["old"][m] if p["old"][m] else float("nan") for p in pairs)
    print(json.dumps(summary, indent=1))
    if args.out:
        job = {"job": args.job, **({"dtype": args.dtype, "repeats": args.repeats} if args.job == "sampler"
                                   else {"experiment": args.experiment, "sets": args.sets})}
        pathlib.Path(args.out).write_text(json.dumps({**job, "runs": runs, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
