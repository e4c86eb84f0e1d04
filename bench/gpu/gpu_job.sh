#!/usr/bin/env bash
# GPU job check (issue 19): the plan's generated launch.sh fine-tunes a saved ~1.2B llama
# (knowledge/models/llama-3.2-1b.json, random bf16 weights) on a JSONL file, full and LoRA
# rank 16, on one GPU; step time and memory against the plan, into one JSON file and a log
# (bench/gpu/gpu_job.py says what it saves, plans, runs and measures).
#
#   bash bench/gpu/gpu_job.sh [OUT_DIR [--only full|lora ...]]   (default: bench/gpu_out)
#   DEVICE=cpu TINY=1 bash bench/gpu/gpu_job.sh DIR   (the dry run on CPU: the flow, no measurement)
#
# The GPU machine has no network and no project venv. Wheels in .whl/ at the repository root
# (ignored by git: the device run must carry it) are installed with --no-deps into a private
# directory first: the planner's pydantic (the plan is made on that machine), peft (the LoRA
# job), and DeepSpeed where the plan's framework is a DeepSpeed one. See bench/gpu/gpu_recipes.sh
# for the pip download line that makes .whl/.
# It finishes in under 8 minutes: saving the model has 4 minutes, each job 3, all of it
# shares a 7-minute budget, and the whole command is stopped at 470 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
out_dir=${1:-bench/gpu_out}
[ $# -gt 0 ] && shift  # the rest goes to gpu_job.py, e.g. --only lora
mkdir -p "$out_dir"
py=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  site=$(mktemp -d /tmp/trainwright-site.XXXXXX)
  trap 'rm -rf "$site"' EXIT
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
  # The job's ranks are new processes under the launcher: they find the wheels the same way.
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$py" -c "import pydantic, yaml" 2>/dev/null; then
  echo "gpu_job: the planner needs pydantic and PyYAML (put their wheels in .whl/)" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 ANONYMIZED_TELEMETRY=False
device=${DEVICE:-cuda}
tiny=()
if [ -n "${TINY:-}" ]; then tiny=(--tiny); fi
if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
timeout --kill-after=10 470 "$py" bench/gpu/gpu_job.py --device "$device" ${tiny[@]+"${tiny[@]}"} \
  --out "$out_dir/gpu_job.json" "$@" 2>&1 | tee "$out_dir/gpu_job.log"
