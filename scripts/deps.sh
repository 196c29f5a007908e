#!/usr/bin/env bash
# Installs the Debian packages grpo.c needs, only those missing. `--test` adds the test peers.
set -euo pipefail
need=(build-essential cmake ninja-build libopenblas-openmp-dev libcjson-dev libpcre2-dev libutf8proc-dev)
if [ "${1:-}" = "--test" ]; then
  need+=(python3 python3-numpy python3-torch)
  command -v npm >/dev/null || need+=(nodejs npm)  # node may come from elsewhere than Debian
fi
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
