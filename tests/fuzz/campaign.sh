#!/usr/bin/env bash
# A fuzzing campaign: each harness fuzzes for SECONDS from a working copy of its corpus (WORK/<harness>/,
# kept between campaigns so coverage keeps growing; the repository's corpus is not touched), two at a
# time, then one table line per harness: executions, coverage (edges, features), corpus size, peak RSS,
# and when coverage last grew. Failures are left as WORK/<harness>/crash-* (and leak-, timeout-, oom-).
# usage: tests/fuzz/campaign.sh BUILD_DIR WORK SECONDS [HARNESS...]   (SECONDS "table": only the table, from
# the last campaign's logs)
set -uo pipefail
src=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd) work=$2 seconds=$3
shift 3
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=($(ls "$src/corpus"))
mkdir -p "$work"
work=$(cd "$work" && pwd)
one() {
  h=$1
  mkdir -p "$work/$h/corpus"
  cp -n "$src/corpus/$h"/* "$work/$h/corpus/"
  (cd "$work/$h" && "$build/tests/fuzz/fuzz_$h" -dict="$src/dict/$h.dict" -timeout=10 -rss_limit_mb=2048 \
     -close_fd_mask=3 -print_final_stats=1 -max_total_time="$seconds" -artifact_prefix="$work/$h/" corpus >log 2>&1)
  echo "$h exit $?"
}
export -f one
export build work seconds src
[ "$seconds" = table ] || printf '%s\n' "${harnesses[@]}" | xargs -P 2 -I{} bash -c 'one {}'
printf '| harness | seconds | executions | exec/s | edges | features | corpus | peak RSS MB | edges last grew |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for h in "${harnesses[@]}"; do
  log=$work/$h/log
  # the first NEW line that reached the final edge count: after it only features (hit counts) grew
  last=$(grep -E '^#[0-9]+[[:space:]]+(NEW|INITED)' "$log" | sed 's/^#\([0-9]*\).*cov: \([0-9]*\).*/\1 \2/' |
         awk '$2 > best {best = $2; at = $1} END {print at}')
  done_line=$(grep -E '^#[0-9]+.*DONE' "$log" | tail -1)
  cov=$(echo "$done_line" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$done_line" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
  corp=$(echo "$done_line" | sed -n 's/.*corp: \([^ ]*\).*/\1/p')
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log")
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
  at="?"  # as executions and the seconds they took at the average rate
  [ -n "$last" ] && [ "${eps:-0}" -gt 0 ] && at="exec $last (~$((last / eps)) s)"
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$h" "$secs" "$execs" "$eps" "$cov" "$ft" \
    "$corp" "$rss" "$at"
  ls "$work/$h"/crash-* "$work/$h"/leak-* "$work/$h"/timeout-* "$work/$h"/oom-* 2>/dev/null | sed 's/^/  found: /'
done
