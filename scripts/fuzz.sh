#!/usr/bin/env bash
# libFuzzer over every surface that takes engine input (tests/fuzz/fuzz_*.cpp:
# layout edits, router configs and routes, ikv_plan_from_ranges; pool
# appends, forks, truncates, evictions, format changes, reads and decodes),
# built with clang, ASan and UBSan into build-fuzz/.
#   bash scripts/fuzz.sh            20 s per target (what scripts/test.sh runs)
#   bash scripts/fuzz.sh 3600       an hour per target
# Each target first replays tests/fuzz/regressions/<target>/ (inputs that once
# crashed: every crash found becomes a file there), then fuzzes from a corpus
# kept in build-fuzz/corpus/<target>. A crash stops the run with its input
# saved as build-fuzz/crash-* and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-20}
bash scripts/install_deps.sh clang
CC=clang CXX=clang++ BUILD_DIR=build-fuzz BUILD_TYPE=RelWithDebInfo bash scripts/build.sh -DIKV_ENABLE_CUDA=OFF \
  -DIKV_FUZZ=ON -DIKV_BUILD_TESTS=OFF -DIKV_BUILD_BENCH=OFF -DIKV_BUILD_EXAMPLES=OFF >/dev/null
for bin in build-fuzz/tests/fuzz/fuzz_*; do
  name=$(basename "$bin")
  corpus=build-fuzz/corpus/$name
  regressions=tests/fuzz/regressions/$name
  mkdir -p "$corpus"
  if [ -d "$regressions" ]; then
    "$bin" "$regressions"/* >/dev/null 2>&1 || { echo "fuzz: $name fails on a regression input"; "$bin" "$regressions"/*; exit 1; }
  fi
  echo "fuzz: $name for ${SECS}s"
  log=build-fuzz/$name.log
  (cd build-fuzz && "../$bin" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "../$corpus" >"../$log" 2>&1) || { grep -E "==|SUMMARY|fuzz check|Test unit written" "$log" | head -20;
                                       echo "fuzz: $name found a failing input (build-fuzz/crash-*, log $log)"; exit 1; }
  grep -E "^stat::(number_of_executed_units|new_units_added)" "$log" ||
    { tail -20 "$log"; echo "fuzz: $name did not run"; exit 1; }
done
echo "fuzz: every target ran ${SECS}s with no crash"
