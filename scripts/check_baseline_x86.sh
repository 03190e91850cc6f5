#!/usr/bin/env bash
# The host append path has an AVX2 copy picked at load time on x86-64
# (src/common/target_clones.hpp), and every CI machine has AVX2, so the
# baseline copy would otherwise never run. Run the pool tests again under
# qemu-user emulating a CPU without AVX (Nehalem), where the loader picks
# the baseline copy; both copies must store the same bytes (compared through
# test_pool_tail's digest of everything it stores).
# Usage: bash scripts/check_baseline_x86.sh [build-dir]   (needs qemu-user)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
if [ "$(uname -m)" != x86_64 ] || ! command -v qemu-x86_64 >/dev/null 2>&1; then
    echo "not an x86-64 machine with qemu-x86_64: skipped"
    exit 0
fi
# The two copies store the same bytes: test_pool_tail's digest of everything
# it read back, natively (AVX2 copy where the CPU has AVX2) and emulated.
native=$(IKVT_PRINT_DIGEST=1 "$build/tests/test_pool_tail" | grep "stored-bytes digest")
emulated=$(IKVT_PRINT_DIGEST=1 qemu-x86_64 -cpu Nehalem "$build/tests/test_pool_tail" | grep "stored-bytes digest")
if [ -z "$native" ] || [ "$native" != "$emulated" ]; then
    echo "the baseline copy stored other bytes than the native one: native '$native', no-AVX '$emulated'"
    exit 1
fi
echo "test_pool_tail: $native on both copies"
for t in test_pool_basic test_pool_batch test_pool_fork test_pool_formats test_pool_numerics test_pool_tail \
         test_pool_lifecycle; do
    qemu-x86_64 -cpu Nehalem "$build/tests/$t" > "$build/$t.nehalem.log" 2>&1 ||
        { cat "$build/$t.nehalem.log"; echo "$t failed on the baseline (no AVX) copy"; exit 1; }
    echo "$t: $(tail -1 "$build/$t.nehalem.log")"
done
