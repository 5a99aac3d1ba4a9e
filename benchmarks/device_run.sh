#!/usr/bin/env bash
# One call of a lent GPU machine (docs/gpu.md): the carried wheels installed, then one half of the device check,
# its JSON and log into $OUT (what the device tool brings back).
#
#   bash benchmarks/device_run.sh decode    # the sampler, the decode variants, a profile; transformers' generate
#   bash benchmarks/device_run.sh train     # attention, the train runs; a transformers + torch training step
#   bash benchmarks/device_run.sh train --micro-batch 32     # more device_check.py options after the part
#
# Here, first: python benchmarks/device_wheels.py (the wheels the machine's image lacks, into .whl/), and name
# .whl in the call's carry. Without .whl/ nothing is installed (a machine that has jaxgrpo's requirements). The
# train runs go in order of what they decide: the GPU default, then the layers one after another keeping every
# projection (a candidate default), then the products in float32 (the form before 2026-12-07), each written to the
# JSON as it ends, so a call cut short keeps the first ones.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-}
if [[ $part != decode && $part != train ]]; then
  echo "device_run.sh: say which half of the device check to run: decode or train (got '${part}')" >&2
  exit 2
fi
shift
out=${OUT:-}
if [[ -z $out ]]; then
  echo "device_run.sh: OUT is unset: the device tool sets it to the folder it brings back; here, OUT=DIR bash $0 $part" >&2
  exit 2
fi
python=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:.${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
if [[ $part == decode ]]; then
  args=(--sections "env,matmul,sampler,decode_loop,torch" --trace-dir "$out/trace")
else
  args=(--sections "env,matmul,attention,train,torch"
        --train-runs "packing_off,packing_off_save_projections_unrolled,packing_off_float32_products")
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
"$python" benchmarks/device_check.py "${args[@]}" --out "$out/device_check_$part.json" "$@" 2>&1 |
  tee "$out/device_check_$part.log"
