#!/usr/bin/env bash
# GPU recipes check (issue 18): pure bf16, 8-bit Adam, gradient accumulation 4, FSDP2 on one GPU
# and LoRA on a ~1.1B llama-style model, each predicted by the memory model before it runs,
# into one JSON file and a log (bench/gpu/gpu_recipes.py says what each case runs and measures).
#
#   bash bench/gpu/gpu_recipes.sh [OUT_DIR [--only LABEL ...]]   (default: bench/gpu_out)
#   DEVICE=cpu TINY=1 bash bench/gpu/gpu_recipes.sh DIR  (the dry run on CPU: the flow, no measurement)
#
# The GPU machine has no network. Wheels in .whl/ at the repository root (ignored by git: the
# device run must carry it) are installed with --no-deps into a private directory first: the
# planner's pydantic (the prediction is made on that machine), DeepSpeed (case 3), bitsandbytes
# or torchao (case 2) and peft (case 5).
# Without them case 3 runs the plain loop instead of DeepSpeed, case 2 is skipped with its
# reason and case 5 uses the script's own LoRA layer. Make .whl/ where pip works, for the GPU
# machine's python3 (3.12, torch 2.11+cu130 when last seen), e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     -d .whl deepspeed==0.19.8 pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 hjson==3.1.0 peft torchao
# (bitsandbytes' wheel is large: add it only while the carry stays under its size limit).
# It finishes in under 7 minutes: the cases share a 5-minute budget, each has a 2-minute
# timeout, and the whole command is stopped at 400 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
out_dir=${1:-bench/gpu_out}
[ $# -gt 0 ] && shift  # the rest goes to gpu_recipes.py, e.g. --only lora fsdp2
mkdir -p "$out_dir"
py=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  site=$(mktemp -d /tmp/trainwright-site.XXXXXX)
  trap 'rm -rf "$site"' EXIT
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$py" -c "import pydantic, yaml" 2>/dev/null; then
  echo "gpu_recipes: the planner needs pydantic and PyYAML (put their wheels in .whl/)" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 ANONYMIZED_TELEMETRY=False
device=${DEVICE:-cuda}
tiny=()
if [ -n "${TINY:-}" ]; then tiny=(--tiny); fi
if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
timeout --kill-after=10 400 "$py" bench/gpu/gpu_recipes.py --device "$device" ${tiny[@]+"${tiny[@]}"} \
  --out "$out_dir/gpu_recipes.json" "$@" 2>&1 | tee "$out_dir/gpu_recipes.log"
