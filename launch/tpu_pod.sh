#!/usr/bin/env bash
# Runs a jaxgrpo experiment file on a Cloud TPU VM slice (a single host such as v4-8, or a pod
# slice such as v4-32): creates or reuses the slice, ships the committed code as a `git archive`
# tarball plus the experiment file to every worker, installs it, trains on all workers at once
# (JAXGRPO_DISTRIBUTED=1: `jax.distributed.initialize()` finds its peers through the TPU
# metadata), streams worker 0's output, copies the run directory back from worker 0, and
# optionally deletes the slice. See launch/README.md for a step-by-step guide.
set -euo pipefail

LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$LAUNCH_DIR/.." && pwd)
# shellcheck source=launch/common.sh
source "$LAUNCH_DIR/common.sh"

usage() {
  cat <<'EOF'
usage: launch/tpu_pod.sh --experiment FILE --name NAME --zone ZONE [options]

Runs `jaxgrpo-train FILE` on every worker of a Cloud TPU VM slice.

required:
  --experiment FILE        experiment file (a Python file with config()); copied as it is locally
  --name NAME              TPU VM name (or set TPU_NAME); reused if it exists, else created
  --zone ZONE              zone of the TPU (or set TPU_ZONE), e.g. us-central2-b

options:
  --accelerator-type TYPE  slice to create, e.g. v4-8, v4-32, v5litepod-16 (default v4-8; TPU_ACCELERATOR_TYPE)
  --version VERSION        TPU VM runtime to create with (default tpu-ubuntu2204-base; TPU_VERSION)
  --project PROJECT        Google Cloud project (default: gcloud's configured project; TPU_PROJECT)
  --set KEY=VALUE ...      config overrides passed to jaxgrpo-train (repeatable)
  --run-dir DIR            run directory on the workers, relative to the home directory
                           (default runs/<experiment name>)
  --fetch-to DIR           local directory the run directory is copied into (default runs)
  --resume                 continue from the latest checkpoint in the run directory
  --ref REF                git commit to ship (default HEAD; uncommitted changes are not shipped)
  --delete-after           delete the TPU VM when the run ends (after fetching the results)
  --dry-run                print the commands, one per line, and run nothing
  -h, --help               this help
EOF
}

name=${TPU_NAME:-}
zone=${TPU_ZONE:-}
accelerator_type=${TPU_ACCELERATOR_TYPE:-v4-8}
version=${TPU_VERSION:-tpu-ubuntu2204-base}
project=${TPU_PROJECT:-}
experiment=""
run_dir=""
fetch_to="runs"
ref="HEAD"
resume=0
dry_run=0
delete_after=0
overrides=()

while (( $# )); do
  case $1 in
    --experiment) need_value "$1" "$#" "${2-}"; experiment=$2; shift 2 ;;
    --name) need_value "$1" "$#" "${2-}"; name=$2; shift 2 ;;
    --zone) need_value "$1" "$#" "${2-}"; zone=$2; shift 2 ;;
    --accelerator-type) need_value "$1" "$#" "${2-}"; accelerator_type=$2; shift 2 ;;
    --version) need_value "$1" "$#" "${2-}"; version=$2; shift 2 ;;
    --project) need_value "$1" "$#" "${2-}"; project=$2; shift 2 ;;
    --run-dir) need_value "$1" "$#" "${2-}"; run_dir=$2; shift 2 ;;
    --fetch-to) need_value "$1" "$#" "${2-}"; fetch_to=$2; shift 2 ;;
    --ref) need_value "$1" "$#" "${2-}"; ref=$2; shift 2 ;;
    --set)
      shift
      # Like jaxgrpo-train: every following KEY=VALUE up to the next option.
      while (( $# )) && [[ $1 != --* ]]; do
        [[ $1 == *=* ]] || usage_error "override '$1' must look like KEY=VALUE, e.g. --set optimizer.lr=1e-6"
        overrides+=("$1"); shift
      done ;;
    --resume) resume=1; shift ;;
    --delete-after) delete_after=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage_error "unknown argument '$1' (see --help)" ;;
  esac
done

# -- checks that need nothing remote ---------------------------------------------------
[[ -n $experiment ]] || usage_error "no experiment file: pass --experiment FILE, e.g. --experiment experiments/grpo.py"
[[ -f $experiment ]] || usage_error "experiment file '$experiment' not found: pass --experiment with the path of an existing experiment file"
[[ -n $name ]] || usage_error "no TPU name: pass --name NAME or set TPU_NAME"
[[ $name =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] || usage_error "TPU name '$name' is invalid: use lowercase letters, digits and hyphens, starting with a letter"
[[ -n $zone ]] || usage_error "no zone: pass --zone ZONE or set TPU_ZONE (e.g. us-central2-b for v4)"
[[ $experiment == *.py ]] || usage_error "experiment file '$experiment' must be a Python file (*.py) defining config()"
[[ -z $run_dir ]] && run_dir="runs/$(basename "$experiment" .py)"
[[ $run_dir != *..* ]] || usage_error "--run-dir '$run_dir' must not contain '..'"
git -C "$REPO_DIR" rev-parse --verify --quiet "$ref^{commit}" >/dev/null \
  || usage_error "--ref '$ref' is not a commit of $REPO_DIR"
if (( ! dry_run )) && ! command -v gcloud >/dev/null; then
  usage_error "gcloud not found: install the Google Cloud SDK (https://cloud.google.com/sdk/docs/install)"
fi
if [[ -n $(git -C "$REPO_DIR" status --porcelain --untracked-files=no) ]]; then
  echo "tpu_pod.sh: note: uncommitted changes to tracked files are not shipped (the workers run $ref);" \
    "the experiment file is copied as it is now" >&2
fi

# -- the commands ----------------------------------------------------------------------
gcloud_scope=(--zone="$zone")
[[ -n $project ]] && gcloud_scope+=(--project="$project")
tarball_name="jaxgrpo-code-$name.tar.gz"
tarball="${TMPDIR:-/tmp}/$tarball_name"
experiment_name=$(basename "$experiment")
# A relative run directory lives in the workers' home directory; the remote shell expands `~`.
# shellcheck disable=SC2088
if [[ $run_dir == /* ]]; then remote_run_dir=$run_dir; else remote_run_dir="~/$run_dir"; fi

archive_cmd=(git -C "$REPO_DIR" archive --format=tar.gz --prefix=jaxgrpo/ -o "$tarball" "$ref")
describe_cmd=(gcloud compute tpus tpu-vm describe "$name" "${gcloud_scope[@]}" --format="value(state)")
create_cmd=(gcloud compute tpus tpu-vm create "$name" "${gcloud_scope[@]}"
  --accelerator-type="$accelerator_type" --version="$version")
copy_cmd=(gcloud compute tpus tpu-vm scp "$tarball" "$experiment" "$name:~/" --worker=all "${gcloud_scope[@]}")
install_cmd=(gcloud compute tpus tpu-vm ssh "$name" --worker=all "${gcloud_scope[@]}"
  --command="rm -rf ~/jaxgrpo && tar -xzf ~/$tarball_name -C ~ && bash ~/jaxgrpo/launch/tpu_worker.sh install")
train_rest=()
(( resume )) && train_rest+=(--resume)
(( ${#overrides[@]} )) && train_rest+=(--set "${overrides[@]}")
# The remote shell expands the `~`s; every other word reaches jaxgrpo-train verbatim.
train_command="bash ~/jaxgrpo/launch/tpu_worker.sh train $(quote_arg "$run_dir") ~/$(quote_arg "$experiment_name")"
(( ${#train_rest[@]} )) && train_command+=" $(quote_command "${train_rest[@]}")"
train_cmd=(gcloud compute tpus tpu-vm ssh "$name" --worker=all "${gcloud_scope[@]}" --command="$train_command")
mkdir_cmd=(mkdir -p "$fetch_to")
fetch_cmd=(gcloud compute tpus tpu-vm scp --recurse "$name:$remote_run_dir" "$fetch_to/" --worker=0 "${gcloud_scope[@]}")
delete_cmd=(gcloud compute tpus tpu-vm delete "$name" "${gcloud_scope[@]}" --quiet)

if (( dry_run )); then
  quote_command "${archive_cmd[@]}"
  printf '%s || %s\n' "$(quote_command "${describe_cmd[@]}")" "$(quote_command "${create_cmd[@]}")"
  quote_command "${copy_cmd[@]}"
  quote_command "${install_cmd[@]}"
  quote_command "${train_cmd[@]}"
  quote_command "${mkdir_cmd[@]}"
  quote_command "${fetch_cmd[@]}"
  (( delete_after )) && quote_command "${delete_cmd[@]}"
  exit 0
fi

run() {
  printf '+ %s\n' "$(quote_command "$@")" >&2
  "$@"
}

run "${archive_cmd[@]}"
printf '+ %s\n' "$(quote_command "${describe_cmd[@]}")" >&2
if state=$("${describe_cmd[@]}" 2>/dev/null); then
  [[ $state == READY ]] || {
    echo "tpu_pod.sh: error: TPU '$name' exists but is in state $state; wait until it is READY," \
      "or delete it ($(quote_command "${delete_cmd[@]}")) and run again" >&2
    exit 1
  }
  echo "tpu_pod.sh: reusing TPU '$name' (READY)" >&2
else
  run "${create_cmd[@]}"
fi
run "${copy_cmd[@]}"
run "${install_cmd[@]}"
# Worker 0 streams its output here; the other workers write only their own log file
# (RUN_DIR/launch-logs/worker-N.log on that worker).
status=0
run "${train_cmd[@]}" || status=$?
if (( status )); then
  echo "tpu_pod.sh: training failed (exit $status); fetching what the run wrote so far" >&2
fi
run "${mkdir_cmd[@]}"
run "${fetch_cmd[@]}" || echo "tpu_pod.sh: could not fetch $remote_run_dir from worker 0" >&2
echo "tpu_pod.sh: results in $fetch_to/$(basename "$run_dir")" >&2
if (( delete_after )); then
  run "${delete_cmd[@]}"
fi
exit "$status"
