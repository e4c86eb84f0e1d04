#!/usr/bin/env bash
$comments
set -euo pipefail
cd "$$(dirname "$$0")"
$commands
