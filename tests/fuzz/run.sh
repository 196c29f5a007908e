#!/usr/bin/env bash
# One harness's test: replay every input of its corpus (the seeds and every input that ever failed),
# then fuzz for SECONDS from that corpus (0: replay only). New inputs go to a scratch copy, never into
# the kept corpus; a failure leaves its input under the scratch directory and names it.
# usage: run.sh HARNESS CORPUS_DIR SECONDS
set -uo pipefail
bin=$1 corpus=$2 seconds=$3
# -close_fd_mask=3: grpo's own stdout/stderr (warnings of refused inputs) are silenced; the
# fuzzer's and the sanitizers' reports still print.
opts=(-timeout=10 -rss_limit_mb=2048 -close_fd_mask=3 -print_final_stats=1)
name=$(basename "$bin")
dict=$(dirname "$(dirname "$corpus")")/dict/$(basename "$corpus").dict  # corpus/<h> -> dict/<h>.dict
[ -f "$dict" ] && opts+=(-dict="$dict")
if ! "$bin" "${opts[@]}" -runs=0 "$corpus" 2>"$name.replay.log"; then
  cat "$name.replay.log"
  echo "fuzz: replaying $corpus failed"
  exit 1
fi
grep -E "^(INFO: seed corpus|#[0-9]+.*(INITED|DONE))" "$name.replay.log" | head -3
[ "$seconds" -gt 0 ] || exit 0
scratch=$name.scratch
rm -rf "$scratch" && mkdir -p "$scratch/corpus" && cp "$corpus"/* "$scratch/corpus/"
if ! "$bin" "${opts[@]}" -max_total_time="$seconds" -artifact_prefix="$scratch/" "$scratch/corpus" 2>"$name.fuzz.log"; then
  tail -60 "$name.fuzz.log"
  echo "fuzz: $bin found a failure in $seconds s; the input: $(ls "$scratch"/crash-* "$scratch"/leak-* \
    "$scratch"/timeout-* "$scratch"/oom-* 2>/dev/null | head -1)"
  exit 1
fi
grep -E "^#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb" "$name.fuzz.log"
