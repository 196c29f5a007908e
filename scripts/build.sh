#!/usr/bin/env bash
# Configures and builds into DIR (default build/); extra arguments go to cmake. GRPO_BUILD_TARGETS (space-separated)
# builds only those targets.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
targets=()
for t in ${GRPO_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$dir" -j "$(nproc)" "${targets[@]}"
