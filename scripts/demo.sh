#!/usr/bin/env bash
# Quick start: install what is missing, build, and run `grpo train` with no arguments: the built-in
# demo (a tiny Qwen2 learns to sort digits: SFT warm-up, then GRPO; held-out accuracy before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build >/dev/null
# libgomp spin-waits between parallel regions by default; on a shared or busy 2-core machine that
# makes the small demo model many times slower. Passive waiting costs nothing measurable when idle.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
exec ./build/grpo train "$@"
