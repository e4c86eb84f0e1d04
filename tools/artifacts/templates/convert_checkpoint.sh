#!/usr/bin/env bash
$comments
set -euo pipefail
HF_MODEL="$${1:-$${HF_MODEL:-}}"
if [[ -z "$$HF_MODEL" || ! -f "$$HF_MODEL/config.json" ]]; then
    echo "usage: ./convert_checkpoint.sh HF_MODEL_DIR (or HF_MODEL=HF_MODEL_DIR): a local Hugging Face model folder with config.json" >&2
    exit 2
fi
# Absolute before the cd: a relative folder is the caller's.
HF_MODEL="$$(cd "$$HF_MODEL" && pwd)"
cd "$$(dirname "$$0")"
$commands
