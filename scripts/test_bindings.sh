#!/usr/bin/env bash
# Run the language-binding test suites against a built libintentkv.
#   scripts/test_bindings.sh BUILD_DIR      (BUILD_DIR holds libintentkv.so)
# Python: stdlib unittest over ctypes (INTENTKV_LIB=BUILD_DIR/libintentkv.so).
# Rust:   cargo test --offline (no crates needed), when cargo is on PATH.
# Ends with "N passed, M failed" over both suites; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 1 ]; then
    echo "usage: $0 BUILD_DIR" >&2
    exit 2
fi
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "test_bindings: no such build dir: $1" >&2; exit 2; }
LIB="$BUILD_DIR/libintentkv.so"
if [ ! -e "$LIB" ]; then
    echo "test_bindings: $LIB not found (build the library first)" >&2
    exit 2
fi

passed=0
failed=0
status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== Python bindings (unittest) =="
INTENTKV_LIB="$LIB" python3 -m unittest discover -s bindings/python/tests -v 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
ran=$(sed -n 's/^Ran \([0-9]*\) tests\{0,1\} in .*/\1/p' "$log" | tail -1)
bad=$(grep -E '^FAILED \(' "$log" | tail -1 | grep -Eo '(failures|errors)=[0-9]+' | awk -F= '{s+=$2} END {print s+0}')
skipped=$(grep -E '^(OK|FAILED) \(' "$log" | tail -1 | grep -Eo 'skipped=[0-9]+' | cut -d= -f2)
ran=${ran:-0}; bad=${bad:-0}; skipped=${skipped:-0}
if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi   # crashed before its summary
passed=$((passed + ran - bad - skipped))
failed=$((failed + bad))
[ "$rc" -eq 0 ] || status=1

echo "== Rust bindings (cargo test) =="
if command -v cargo >/dev/null 2>&1; then
    INTENTKV_LIB_DIR="$BUILD_DIR" LD_LIBRARY_PATH="$BUILD_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        cargo test --offline --manifest-path bindings/rust/Cargo.toml 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    # "test result: ok. 5 passed; 0 failed; ..." once per test binary (unit, integration, doc tests)
    ok=$(awk '/^test result:/ {for (i = 1; i < NF; i++) if ($(i+1) ~ /^passed/) s += $i} END {print s+0}' "$log")
    bad=$(awk '/^test result:/ {for (i = 1; i < NF; i++) if ($(i+1) ~ /^failed/) s += $i} END {print s+0}' "$log")
    ok=${ok:-0}; bad=${bad:-0}
    if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi   # build failure or crash
    passed=$((passed + ok))
    failed=$((failed + bad))
    [ "$rc" -eq 0 ] || status=1
else
    echo "SKIPPED: Rust bindings (cargo not on PATH)"
fi

echo "$passed passed, $failed failed"
exit $status
