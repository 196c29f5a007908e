#!/usr/bin/env bash
# The test suite: a release build and an ASan+UBSan build, each running every test under ctest (as many at once as
# there are cores: most tests leave a core idle while their Python peer computes); a ThreadSanitizer
# build of the emulated device's two tests (its threads are TSan fibers: a missing barrier is a race) and of
# grpo serve's threaded tests; then the
# fuzz build (clang, libFuzzer + ASan + UBSan): each harness replays its corpus and fuzzes for 10 s.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test || exit 1
passed=0 failed=0 skipped=0
for variant in release asan tsan fuzz; do
  dir=build-test-$variant
  args=()
  targets=()
  [ $variant = asan ] && args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRPO_SANITIZE=ON)
  [ $variant = tsan ] && args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRPO_TSAN=ON) && targets=(test_emu test_cuda_ops grpo)
  [ $variant = fuzz ] && args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRPO_FUZZ=ON -DCMAKE_C_COMPILER=clang)
  if ! GRPO_BUILD_TARGETS="${targets[*]}" scripts/build.sh "$dir" "${args[@]}" >"$dir.log" 2>&1; then
    cat "$dir.log"
    echo "build ($variant) failed"
    failed=$((failed + 1))
    continue
  fi
  echo "== $variant"
  out=$(cd "$dir" && ctest --output-on-failure -j "$(nproc)" 2>&1)  # tests/CMakeLists.txt: which run alone
  echo "$out"
  total=$(echo "$out" | sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p')
  bad=$(echo "$out" | sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1/p')
  skip=$(echo "$out" | grep -c '(Skipped)$')  # GPU tests without a GPU: neither passed nor failed
  if [ -z "$total" ]; then
    failed=$((failed + 1))
  else
    passed=$((passed + total - bad - skip))
    failed=$((failed + bad))
    skipped=$((skipped + skip))
  fi
done
[ "$skipped" -gt 0 ] && echo "$skipped skipped (they need a GPU: see the lines marked Skipped above)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
