#!/usr/bin/env bash
# Quick start: install what is missing, build, and run `grpo train` with no arguments: the built-in
# demo (a tiny Qwen2 learns to sort digits: SFT warm-up, then GRPO; held-out accuracy before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build >/dev/null
exec ./build/grpo train "$@"
