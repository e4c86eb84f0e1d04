#!/usr/bin/env bash
# GPU check (issue 5): smoke runs of gpt2-medium and a ~1.1B llama-style model under ZeRO-2 and
# ZeRO-3 in bf16 on one GPU, measured vs predicted peak memory and MFU, into one JSON file.
#
#   bash bench/gpu/gpu_check.sh [OUT_DIR]        (default: bench/gpu_out)
#   CASES=validation bash bench/gpu/gpu_check.sh  (cases the memory model was not fitted on)
#
# For a machine whose python3 has torch and transformers but not DeepSpeed and no network:
# DeepSpeed and its missing pure-Python requirements (pydantic, hjson, ...) are installed from
# the wheels in .whl/ at the repository root into a private directory (nothing system-wide).
# Make .whl/ where pip works with the python3 of the GPU machine in mind, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     -d .whl deepspeed==0.19.8 pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 hjson==3.1.0
# It finishes in under 8 minutes: the cases share a 7-minute budget and each has a timeout.
set -euo pipefail
cd "$(dirname "$0")/../.."
out_dir=${1:-bench/gpu_out}
mkdir -p "$out_dir"
py=${PYTHON:-python3}
if ! "$py" -c "import deepspeed, pydantic, hjson" 2>/dev/null; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "gpu_check: DeepSpeed is not installed and there are no wheels in .whl/" >&2
    exit 2
  fi
  site=$(mktemp -d /tmp/trainwright-site.XXXXXX)
  trap 'rm -rf "$site"' EXIT
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 ANONYMIZED_TELEMETRY=False
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
cases=${CASES:-check}
timeout --kill-after=10 470 "$py" bench/gpu/gpu_check.py --cases "$cases" --out "$out_dir/gpu_check.json" 2>&1 | tee "$out_dir/gpu_check.log"
