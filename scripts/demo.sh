#!/usr/bin/env bash
# Quick start: install what is missing, build, create a small random model and score text with it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build >/dev/null
model=${DEMO_DIR:-demo}/tiny-model
./build/grpo init --out "$model" --preset tiny --seed 1 --force
echo "scoring two token sequences with $model:"
printf '%s\n' '{"tokens": [9707, 11, 1879, 0]}' '{"tokens": [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30]}' |
  ./build/grpo score --model "$model" --stats
