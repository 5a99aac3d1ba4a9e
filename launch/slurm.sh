#!/usr/bin/env bash
# Submits a jaxgrpo experiment file to a SLURM GPU cluster: one process per node, all of the
# node's GPUs per process, node 0 hosting the jax.distributed coordinator (launch/slurm.sbatch).
# Run from the repository root on a login node whose filesystem the compute nodes share.
set -euo pipefail

LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=launch/common.sh
source "$LAUNCH_DIR/common.sh"

usage() {
  cat <<'EOF'
usage: launch/slurm.sh --experiment FILE [options]

Submits `jaxgrpo-train FILE` as one SLURM job with one task per node.

required:
  --experiment FILE      experiment file (a Python file with config())

options:
  --nodes N              nodes (= JAX processes; default 1)
  --gpus-per-node G      GPUs per node (default 8)
  --partition P          SLURM partition
  --account A            SLURM account
  --time T               time limit, e.g. 04:00:00
  --port PORT            coordinator port on the first node (default 12345)
  --set KEY=VALUE ...    config overrides passed to jaxgrpo-train (repeatable)
  --run-dir DIR          run directory on the shared filesystem (default runs/<experiment name>);
                         the job's log goes to DIR/slurm-<jobid>.out
  --resume               continue from the latest checkpoint in the run directory
  --dry-run              print the sbatch command and the per-node commands; submit nothing
  -h, --help             this help
EOF
}

experiment=""
nodes=1
gpus_per_node=8
partition=""
account=""
time_limit=""
port=12345
run_dir=""
resume=0
dry_run=0
overrides=()

while (( $# )); do
  case $1 in
    --experiment) need_value "$1" "$#" "${2-}"; experiment=$2; shift 2 ;;
    --nodes) need_value "$1" "$#" "${2-}"; nodes=$2; shift 2 ;;
    --gpus-per-node) need_value "$1" "$#" "${2-}"; gpus_per_node=$2; shift 2 ;;
    --partition) need_value "$1" "$#" "${2-}"; partition=$2; shift 2 ;;
    --account) need_value "$1" "$#" "${2-}"; account=$2; shift 2 ;;
    --time) need_value "$1" "$#" "${2-}"; time_limit=$2; shift 2 ;;
    --port) need_value "$1" "$#" "${2-}"; port=$2; shift 2 ;;
    --run-dir) need_value "$1" "$#" "${2-}"; run_dir=$2; shift 2 ;;
    --set)
      shift
      while (( $# )) && [[ $1 != --* ]]; do
        [[ $1 == *=* ]] || usage_error "override '$1' must look like KEY=VALUE, e.g. --set optimizer.lr=1e-6"
        overrides+=("$1"); shift
      done ;;
    --resume) resume=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage_error "unknown argument '$1' (see --help)" ;;
  esac
done

[[ -n $experiment ]] || usage_error "no experiment file: pass --experiment FILE, e.g. --experiment experiments/grpo.py"
[[ -f $experiment ]] || usage_error "experiment file '$experiment' not found: pass --experiment with the path of an existing experiment file"
[[ $nodes =~ ^[1-9][0-9]*$ ]] || usage_error "--nodes must be a positive integer, got '$nodes'"
[[ $gpus_per_node =~ ^[0-9]+$ ]] || usage_error "--gpus-per-node must be a non-negative integer, got '$gpus_per_node'"
[[ $port =~ ^[0-9]+$ ]] || usage_error "--port must be a port number, got '$port'"
if (( ! dry_run )) && ! command -v sbatch >/dev/null; then
  usage_error "sbatch not found: run this on a SLURM login node"
fi
[[ -z $run_dir ]] && run_dir="runs/$(basename "$experiment" .py)"

train_args=("$experiment" --run-dir "$run_dir")
(( resume )) && train_args+=(--resume)
(( ${#overrides[@]} )) && train_args+=(--set "${overrides[@]}")

sbatch_cmd=(sbatch --job-name="jaxgrpo-$(basename "$experiment" .py)" --nodes="$nodes" --ntasks-per-node=1)
(( gpus_per_node )) && sbatch_cmd+=(--gpus-per-node="$gpus_per_node")
[[ -n $partition ]] && sbatch_cmd+=(--partition="$partition")
[[ -n $account ]] && sbatch_cmd+=(--account="$account")
[[ -n $time_limit ]] && sbatch_cmd+=(--time="$time_limit")
sbatch_cmd+=(--output="$run_dir/slurm-%j.out"
  --export="ALL,JAXGRPO_LAUNCH_DIR=$LAUNCH_DIR,JAXGRPO_COORDINATOR_PORT=$port,JAXGRPO_GPUS_PER_NODE=$gpus_per_node"
  "$LAUNCH_DIR/slurm.sbatch" "${train_args[@]}")
mkdir_cmd=(mkdir -p "$run_dir")

if (( dry_run )); then
  quote_command "${mkdir_cmd[@]}"
  quote_command "${sbatch_cmd[@]}"
  echo "# on the first node of the job (one task per node):"
  SLURM_NNODES=$nodes JAXGRPO_COORDINATOR_PORT=$port JAXGRPO_GPUS_PER_NODE=$gpus_per_node \
    SLURM_JOB_NODELIST="" bash "$LAUNCH_DIR/slurm.sbatch" --dry-run "${train_args[@]}"
  exit 0
fi

printf '+ %s\n' "$(quote_command "${mkdir_cmd[@]}")" >&2
"${mkdir_cmd[@]}"
printf '+ %s\n' "$(quote_command "${sbatch_cmd[@]}")" >&2
"${sbatch_cmd[@]}"
echo "slurm.sh: follow the job with: tail -f $run_dir/slurm-<jobid>.out (squeue --me lists it)" >&2
