#!/usr/bin/env bash
# The one command for a machine with an NVIDIA GPU (sm_90 build, Release):
#   1. builds bench/gpu standalone (kernels + gpu_decode_check; needs only nvcc + CMake) into build-gpu/
#   2. gpu_decode_check --check     decode / quantize / top-k against float64 and host references
#      (again with IKV_CUDA_SCORE=simt: page scores on the SIMT kernel instead of tensor cores)
#   3. gpu_decode_check --bench     the decode benchmark (CSV + markdown)
#   4. bench/gpu/sdpa_peer.py       PyTorch SDPA dense peer + comparison table with the targets
#   4b. gpu_multi_token_check --check [--bench]   cuBLASLt multi-token path vs float64; fused vs GEMM timing
#   5. the library with CUDA + `ctest -R gpu` when its dependencies (mimalloc, cmocka) are found
#      (IKV_DEPS=<prefix> adds a prefix holding them)
#   6. compute-sanitizer memcheck on gpu_decode_check --check --quick (flag --sanitize, or --quick)
# Outputs go to $OUT (default ./gpu-out). Exit status: non-zero if a check failed.
#   scripts/gpu_check.sh [--quick] [--sanitize] [--no-bench] [--no-lib]
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
QUICK=0 SAN=0 BENCH=1 LIB=1
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1; SAN=1 ;;
    --sanitize) SAN=1 ;;
    --no-bench) BENCH=0 ;;
    --no-lib) LIB=0 ;;
    *) echo "unknown flag $a"; exit 2 ;;
  esac
done
JOBS=$(nproc 2>/dev/null || echo 8)
declare -A RESULT
t0=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - t0 ))s] $*"; }

stamp "building bench/gpu (sm_90)"
if cmake -S bench/gpu -B build-gpu -DIKV_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
   cmake --build build-gpu -j"$JOBS" >>"$OUT/build.log" 2>&1; then
  RESULT[build]=ok
else
  RESULT[build]=FAILED; tail -30 "$OUT/build.log"
fi

# run_checks PROGRAM KEY: PROGRAM --check (RESULT[KEY_check]), then --bench (RESULT[KEY_bench]).
run_checks() {
  local prog=$1 key=$2 rc
  stamp "$prog --check"
  ./build-gpu/$prog --check $QF 2>&1 | tee "$OUT/${key}_check.log"
  rc=${PIPESTATUS[0]}
  RESULT[${key}_check]=$([ $rc = 0 ] && echo "ok ($(grep -c ^PASS "$OUT/${key}_check.log") PASS)" ||
    echo "FAILED rc=$rc ($(grep -c ^FAIL "$OUT/${key}_check.log") FAIL)")
  if [ $BENCH = 1 ]; then
    stamp "$prog --bench"
    ./build-gpu/$prog --bench $QF --out "$OUT" 2>&1 | tee "$OUT/${key}_bench.log"
    RESULT[${key}_bench]=$([ ${PIPESTATUS[0]} = 0 ] && echo ok || echo FAILED)
  fi
}

if [ "${RESULT[build]}" = ok ]; then
  QF=""; [ $QUICK = 1 ] && QF="--quick"
  run_checks gpu_decode_check decode
  # The checks again with page scores on the SIMT kernel (the default scores groups of <= 8 rows on tensor cores).
  stamp "gpu_decode_check --check, IKV_CUDA_SCORE=simt"
  IKV_CUDA_SCORE=simt ./build-gpu/gpu_decode_check --check $QF >"$OUT/decode_check_scores_simt.log" 2>&1
  rc=$?
  RESULT[decode_check_scores_simt]=$([ $rc = 0 ] && echo "ok ($(grep -c ^PASS "$OUT/decode_check_scores_simt.log") PASS)" ||
    echo "FAILED rc=$rc ($(grep -c ^FAIL "$OUT/decode_check_scores_simt.log") FAIL)")
  if [ $BENCH = 1 ]; then
    stamp "sdpa_peer.py"
    PYTHONUNBUFFERED=1 python3 bench/gpu/sdpa_peer.py $QF --ours "$OUT/gpu_bench.csv" --out "$OUT" 2>&1 | tee "$OUT/sdpa.log"
    RESULT[sdpa]=$([ ${PIPESTATUS[0]} = 0 ] && echo ok || echo FAILED)
  fi
  run_checks gpu_multi_token_check mt
  if [ $SAN = 1 ] && command -v compute-sanitizer >/dev/null; then
    stamp "compute-sanitizer memcheck (quick check set)"
    compute-sanitizer --tool memcheck --error-exitcode 9 ./build-gpu/gpu_decode_check --check --quick \
      >"$OUT/sanitizer.log" 2>&1
    rc=$?
    tail -5 "$OUT/sanitizer.log"
    RESULT[sanitizer]=$([ $rc = 0 ] && echo "ok (memcheck clean)" || echo "FAILED rc=$rc")
  fi
fi

if [ $LIB = 1 ]; then
  stamp "library with CUDA + ctest -R gpu"
  # mimalloc and cmocka: from the system, or from a prefix (build-deps/ when present, e.g. carried to the device).
  [ -z "${IKV_DEPS:-}" ] && [ -d build-deps ] && IKV_DEPS="$PWD/build-deps"
  PREFIX=""; [ -n "${IKV_DEPS:-}" ] && PREFIX="-DCMAKE_PREFIX_PATH=$IKV_DEPS" && export LD_LIBRARY_PATH="$IKV_DEPS/lib/x86_64-linux-gnu:$IKV_DEPS/lib:${LD_LIBRARY_PATH:-}"
  if cmake -S . -B build-gpu-lib -DIKV_ENABLE_CUDA=ON -DIKV_CUDA_ARCHS=90 -DIKV_BUILD_BENCH=OFF \
       -DIKV_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release $PREFIX >"$OUT/lib_build.log" 2>&1 &&
     cmake --build build-gpu-lib -j"$JOBS" >>"$OUT/lib_build.log" 2>&1; then
    (cd build-gpu-lib && ctest --no-tests=error -R gpu --output-on-failure) 2>&1 | tee "$OUT/ctest_gpu.log"
    RESULT[ctest_gpu]=$([ ${PIPESTATUS[0]} = 0 ] && echo ok || echo FAILED)
  else
    tail -15 "$OUT/lib_build.log"
    RESULT[ctest_gpu]="not run (library did not configure/build here: see lib_build.log)"
  fi
fi

echo
echo "==================== gpu_check summary ===================="
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/device: /'
for k in build decode_check decode_check_scores_simt decode_bench sdpa mt_check mt_bench sanitizer ctest_gpu; do
  [ -n "${RESULT[$k]:-}" ] && printf '%-10s %s\n' "$k" "${RESULT[$k]}"
done
[ -f "$OUT/gpu_vs_sdpa.md" ] && sed -n '/## Targets/,$p' "$OUT/gpu_vs_sdpa.md"
echo "outputs in $OUT; total $(( $(date +%s) - t0 ))s"
case "${RESULT[decode_check]:-}${RESULT[decode_check_scores_simt]:-}${RESULT[mt_check]:-}${RESULT[sanitizer]:-}${RESULT[ctest_gpu]:-}" in *FAILED*) exit 1 ;; esac
[ "${RESULT[build]}" = ok ] || exit 1
exit 0
