#!/usr/bin/env bash
# The GPU checks and benchmarks, in one run on the device machine (scripts/device_pack.sh made the pack
# here; the device tool carries .devpack). Every step runs whatever failed before it and writes its own
# log under $OUT; summary.txt lists each step's exit status and time. Steps, most important first:
#   ops       tests/cuda/test_cuda_ops: every CUDA op against the CPU op
#   errors    --device cuda:N past the GPUs, and --dtype f32 with cuda: one clear error line each
#   hf        tests/cuda/hf_parity.py: score and greedy against transformers' Qwen2ForCausalLM
#   generate  tests/rollout/generate_test.py --device cuda: logprobs, sampler statistics, seeding
#   bench     bench/cuda.py: prefill and decode against transformers, ceilings of this run
# usage (there): bash scripts/device_check.sh [hf shapes...]
#   (default: tiny qwen2.5-0.5b qwen2.5-7b qwen3-tiny qwen3-0.6b)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/grpo-device-out}
mkdir -p "$OUT"
shapes=${*:-tiny qwen2.5-0.5b qwen2.5-7b qwen3-tiny qwen3-0.6b}
R=/tmp/grpo-dev
rm -rf "$R" /tmp/grpo-dev-work
mkdir -p "$R" /tmp/grpo-dev-work
tar -xJf .devpack/grpo-device.tar.xz -C "$R" || { echo "no .devpack/grpo-device.tar.xz: run scripts/device_pack.sh here first" | tee "$OUT/summary.txt"; exit 1; }

# cuBLASLt and the CUDA runtime of the image: the toolkit's, else the pip wheels' that PyTorch uses.
cudalib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -f "$d/libcublasLt.so.13" ] && cudalib="$d" && break
done
if [ -z "$cudalib" ]; then
  cudalib=$(python3 - <<'PY'
import glob, os, site
dirs = {os.path.dirname(p) for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/**/libcu*.so.13", recursive=True)}
print(":".join(sorted(dirs)))
PY
)
fi
# Wrappers: only grpo's processes see the carried libraries (python3 keeps its own).
for exe in grpo test_cuda_ops; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib:%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s/bin/%s "$@"\n' \
    "$R" "$cudalib" "$R" "$exe" > "$R/$exe"
  chmod +x "$R/$exe"
done
echo "cuda libraries: ${cudalib:-none found}" > "$OUT/summary.txt"

step() {  # step NAME SECONDS COMMAND...: log to $OUT/NAME.log, status to summary.txt
  local name=$1 secs=$2 t0
  shift 2
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
}

errors() {
  "$R/grpo" init --preset tiny --out /tmp/grpo-dev-work/tiny --force >/dev/null || return 1
  echo '{"tokens": [1, 2, 3]}' > /tmp/grpo-dev-work/t.jsonl
  for args in "--device cuda:64" "--device cuda --dtype f32" "--device cuda:x"; do
    "$R/grpo" score --model /tmp/grpo-dev-work/tiny $args < /tmp/grpo-dev-work/t.jsonl
    echo "[$args] exit $?"
  done
  "$R/grpo" score --model /tmp/grpo-dev-work/tiny --device cuda < /tmp/grpo-dev-work/t.jsonl
  echo "[--device cuda] exit $?"
}

nvidia-smi > "$OUT/nvidia-smi.log" 2>&1
step ops 90 "$R/test_cuda_ops"
step errors 60 bash -c "R=$R; $(declare -f errors); errors"
step hf 300 python3 tests/cuda/hf_parity.py --grpo "$R/grpo" --tmp /tmp/grpo-dev-work/hf --shapes $shapes
step generate 150 python3 tests/rollout/generate_test.py --grpo "$R/grpo" --tmp /tmp/grpo-dev-work/gen --device cuda \
  --only greedy score sampler repro
step bench 300 python3 bench/cuda.py --grpo "$R/grpo" --tmp /tmp/grpo-dev-work/hf
for f in ops errors hf generate bench; do
  echo "== $f (last lines)"
  tail -n 15 "$OUT/$f.log"
done >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
