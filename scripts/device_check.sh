#!/usr/bin/env bash
# The GPU checks and benchmarks on the device machine, as two calls: a device command may run 10 minutes
# and a task has 15 minutes of device time, the machine's start included, so each half's step limits sum
# to at most 440 s (correct 380, perf 440; the device tool's timeout_s: 420 and 480, room for the unpack and each
# step's 10 s kill grace):
#   bash scripts/device_check.sh correct [hf shapes...]   ops, errors, hf, vl, vl-device, generate, train
#   bash scripts/device_check.sh perf                      hf-7b, bench, train-bench
# scripts/device_pack.sh made the pack here; the device tool carries .devpack. Steps, most important first:
#   ops       tests/cuda/test_cuda_ops: every CUDA op against the CPU op
#   errors    --device cuda:64 (past the GPUs), cuda:x and cuda with --dtype f32: exit 1 with one
#             `grpo: error:` line each; then plain --device cuda must score
#   hf        tests/cuda/hf_parity.py (default: tiny qwen3-tiny qwen2.5-0.5b qwen3-0.6b): score against
#             transformers and against --device cpu, greedy against transformers' greedy
#   vl        tests/cuda/hf_vl_parity.py: the CPU's Qwen2.5-VL and Qwen2-VL forward (vl_tool) against
#             transformers' own models and image processor (installed only on the device machine)
#   vl-device tests/model/vision_test.py --only vl_device --vl-device cuda: a Qwen2.5-VL model's generate, score
#             and serve on the GPU against the float64 reference with bf16's rounding points
#   generate  tests/rollout/generate_test.py --device cuda: logprobs, sampler statistics, seeding
#   train     tests/train/device_train_test.py --device cuda: SFT and GRPO (full bf16, LoRA) against the CPU's bf16
#             runs, recompute / resume / offload bytes, the device's peak memory within the plan
#   hf-7b     hf_parity.py on the qwen2.5-7b shape (its model is the bench's next)
#   bench     bench/cuda.py: prefill and decode against transformers, ceilings of this run
#   train-bench  bench/train_cuda.py: a full fine-tuning step (MFU, against transformers + torch AdamW), the
#             7B-shaped LoRA GRPO step (phases, tokens/s, peak memory against the plan) and the 7B-shaped full
#             fine-tuning GRPO step with the moments in pinned host memory (the same figures)
# Each step writes $OUT/STEP.log and one line to $OUT/summary-MODE.txt: PASSED, FAILED (with the log's
# first FAIL line, or its last line), or SKIPPED (no GPU visible: the step did not run; or the step said
# SKIPPED itself, exit 77). The report ends with the steps' last log lines and one summary line.
# Exit: 1 if any step failed or timed out, 77 if no step ran, else 0.
set -u
cd "$(dirname "$0")/.." || exit 1
mode=${1:-}
case $mode in
  correct | perf) shift ;;
  *) echo "usage: scripts/device_check.sh correct [hf shapes...] | perf" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/grpo-device-out}
mkdir -p "$OUT"
report=$OUT/summary-$mode.txt
R=/tmp/grpo-dev               # the unpacked pack
W=/tmp/grpo-dev-work/$mode    # models and data of this half
start=$(date +%s)
passed=0 failed=0 skipped=0 failures="" ran=""
say() { echo "$*" | tee -a "$report"; }

: > "$report"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
nvidia-smi > "$OUT/nvidia-smi.log" 2>&1
say "device_check $mode: $gpus GPU(s) visible (nvidia-smi -L)"
rm -rf "$R" "$W"
mkdir -p "$R" "$W"
if ! tar -xJf .devpack/grpo-device.tar.xz -C "$R"; then
  say "device_check $mode: FAILED: no .devpack/grpo-device.tar.xz (run scripts/device_pack.sh here, carry .devpack)"
  exit 1
fi

# cuBLASLt and the CUDA runtime of the image: the toolkit's, else the pip wheels' that PyTorch uses.
cudalib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -f "$d/libcublasLt.so.13" ] && cudalib="$d" && break
done
if [ -z "$cudalib" ]; then
  cudalib=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = {os.path.dirname(p) for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/**/libcu*.so.13", recursive=True)}
print(":".join(sorted(dirs)))
PY
)
fi
# Wrappers: only grpo's processes see the carried libraries (python3 keeps its own).
# shellcheck disable=SC2016  # $LD_LIBRARY_PATH and $@ are the wrapper's, expanded when it runs
for exe in grpo test_cuda_ops vl_tool; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s/bin/%s "$@"\n' \
    "$R" "${cudalib:+:$cudalib}" "$R" "$exe" > "$R/$exe"
  chmod +x "$R/$exe"
done
say "cuda libraries: ${cudalib:-none found}"

step() {  # step NAME SECONDS COMMAND...: COMMAND within SECONDS, its log $OUT/NAME.log, one report line
  local name=$1 secs=$2 log=$OUT/$1.log t0 rc t
  shift 2
  if [ "$gpus" -eq 0 ]; then
    echo "SKIPPED: no GPU visible: not run" > "$log"
    say "$name: SKIPPED (no GPU visible: not run)"
    skipped=$((skipped + 1))
    return 77
  fi
  ran="$ran $name"
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout -k 10 "$secs" "$@" > "$log" 2>&1
  rc=$?
  t=$(($(date +%s) - t0))
  case $rc in
    0) say "$name: PASSED in $t s"; passed=$((passed + 1)) ;;
    77)  # nvidia-smi sees a GPU: a step that skips itself (no driver for the runtime, no torch.cuda) failed
      say "$name: FAILED: skipped itself although nvidia-smi lists a GPU: $(grep -m1 SKIPPED "$log")"
      rc=1 ;;
    124 | 137) say "$name: FAILED: timed out at its limit of $secs s; last line: $(tail -n 1 "$log")" ;;
    *) say "$name: FAILED (exit $rc) in $t s: $(grep -m1 '^FAIL' "$log" || tail -n 1 "$log")" ;;
  esac
  case $rc in 0 | 77) ;; *) failed=$((failed + 1)) failures="$failures $name" ;; esac
  return "$rc"
}

# shellcheck disable=SC2317  # run by step through bash -c (export -f)
errors() {  # each bad --device exits 1 with one `grpo: error:` line; then the control run must score
  local bad=0 args err rc
  "$R/grpo" init --preset tiny --out "$W/tiny" --force > /dev/null || return 1
  echo '{"tokens": [1, 2, 3]}' > "$W/t.jsonl"
  for args in "--device cuda:64" "--device cuda --dtype f32" "--device cuda:x"; do
    # shellcheck disable=SC2086  # args holds several words
    err=$("$R/grpo" score --model "$W/tiny" $args < "$W/t.jsonl" 2>&1 > /dev/null)
    rc=$?
    if [ "$rc" -eq 1 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && [[ $err == "grpo: error: "* ]]; then
      echo "PASS  [$args]: $err"
    else
      echo "FAIL  [$args]: exit $rc, want 1 and one 'grpo: error:' line; stderr: $err"
      bad=1
    fi
  done
  if "$R/grpo" score --model "$W/tiny" --device cuda < "$W/t.jsonl" | grep -q '^{"logprobs": \[-\?[0-9][0-9.eE+-]*, -\?[0-9][0-9.eE+-]*\]}$'; then
    echo "PASS  [--device cuda]: scored"
  else
    echo "FAIL  [--device cuda]: no record with 2 finite log-probs (exit ${PIPESTATUS[0]})"
    bad=1
  fi
  return "$bad"
}
export -f errors
export R W

if [ "$mode" = correct ]; then
  shapes=${*:-tiny qwen3-tiny qwen2.5-0.5b qwen3-0.6b}
  step ops 60 env CUDA_LAUNCH_BLOCKING=1 "$R/test_cuda_ops"  # a kernel fault named at its launch
  step errors 30 bash -c errors
  # shellcheck disable=SC2086  # shapes: several words
  step hf 100 python3 tests/cuda/hf_parity.py --grpo "$R/grpo" --tmp "$W/hf" --shapes $shapes
  step vl 30 python3 tests/cuda/hf_vl_parity.py --vl-tool "$R/vl_tool" --tmp "$W/vl"
  step vl-device 20 python3 tests/model/vision_test.py --tool "$R/vl_tool" --rope-tool "$R/vl_tool" \
    --grpo "$R/grpo" --tmp "$W/vld" --only vl_device --vl-device cuda --qwen-tok "$R/tok"
  # bf16: the decode and score log-probs against the float64 reference with bf16 rounding points (mean
  # yardsticks); sampler: the sampling statistics. (greedy, score and repro hold fp32 to 1e-4 or to
  # batch invariance, which a bf16 device does not promise.)
  step generate 90 python3 tests/rollout/generate_test.py --grpo "$R/grpo" --tmp "$W/gen" --device cuda \
    --only bf16 sampler
  step train 50 python3 tests/train/device_train_test.py --grpo "$R/grpo" --tmp "$W/train" --device cuda \
    --tokenizer "$R/tok/tokenizer.json"
else
  # The 7B model hf-7b makes is the bench's; one it left half-written is not.
  step hf-7b 150 python3 tests/cuda/hf_parity.py --grpo "$R/grpo" --tmp "$W/hf" --shapes qwen2.5-7b
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then rm -rf "$W/hf/qwen2.5-7b"; fi
  step bench 130 python3 bench/cuda.py --grpo "$R/grpo" --tmp "$W/hf"
  step train-bench 160 python3 bench/train_cuda.py --grpo "$R/grpo" --tmp "$W/hf" --tokenizer "$R/tok/tokenizer.json"
fi

for f in $ran; do
  echo "== $f: last lines of $f.log"
  tail -n 15 "$OUT/$f.log"
done | tee -a "$report"
say "device_check $mode: $passed passed, $failed failed${failures:+ (${failures# })}, $skipped skipped, $(($(date +%s) - start)) s"
[ "$failed" -gt 0 ] && exit 1
[ "$passed" -eq 0 ] && exit 77
exit 0
