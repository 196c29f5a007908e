#!/usr/bin/env bash
# The test suite: a release build and an ASan+UBSan build, each running every test under ctest (as many at once as
# there are cores: most tests leave a core idle while their Python peer computes); a ThreadSanitizer
# build of the emulated device's two tests (its threads are TSan fibers: a missing barrier is a race) and of
# grpo serve's threaded tests; then the
# fuzz build (clang, libFuzzer + ASan + UBSan): each harness replays its corpus and fuzzes for 10 s.
# The tests write their runs (checkpoints, models) under BUILD/tests/tmp_*: about 19 GiB for the release
# build, 9 GiB for ASan. A build whose tests all pass has them removed before the next build starts
# (GRPO_KEEP_TEST_TMP=1 keeps them); a failing one keeps them for a look.
set -uo pipefail
cd "$(dirname "$0")/.."
need_gib=24
free_gib=$(df -P -k . | awk 'NR == 2 { print int($4 / 1048576) }')
if [ "${free_gib:-0}" -lt $need_gib ]; then
  echo "grpo: error: $(pwd) has $free_gib GiB free; the tests need $need_gib GiB (their runs, one build's at a time)"
  echo "0 passed, 1 failed"
  exit 1
fi
scripts/deps.sh --test || exit 1
passed=0 failed=0 skipped=0
checks=""  # the failed checks' lines, repeated at the end: a long log's tail is what a reader sees first
for variant in release asan tsan fuzz; do
  dir=build-test-$variant
  args=()
  targets=()
  [ $variant = asan ] && args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRPO_SANITIZE=ON)
  [ $variant = tsan ] && args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRPO_TSAN=ON) && targets=(test_emu test_cuda_ops grpo vl_tool vl_rope_tool)
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
  checks+=$(echo "$out" | grep -E '^FAIL|\*\*\*(Failed|Timeout)' | cut -c1-400 | sed "s/^/[$variant] /")$'\n'
  total=$(echo "$out" | sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p')
  bad=$(echo "$out" | sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1/p')
  skip=$(echo "$out" | grep -c '(Skipped)$')  # GPU tests without a GPU: neither passed nor failed
  if [ -z "$total" ]; then
    failed=$((failed + 1))
  else
    passed=$((passed + total - bad - skip))
    failed=$((failed + bad))
    skipped=$((skipped + skip))
    [ "$bad" -eq 0 ] && [ "${GRPO_KEEP_TEST_TMP:-0}" != 1 ] && rm -rf "$dir"/tests/tmp_*
  fi
done
lost=$(echo "$checks" | grep .)
[ -n "$lost" ] && printf 'the failed checks, again:\n%s\n' "$lost"
[ "$skipped" -gt 0 ] && echo "$skipped skipped (they need a GPU: see the lines marked Skipped above)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
