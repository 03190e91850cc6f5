#!/usr/bin/env bash
# The GPU benchmark of this tree next to an earlier tree, in the same run on
# the same GPU (bench/RESULTS.md "before -> after" figures).
#   scripts/gpu_before_after.sh BASE_DIR [ENV=VALUE ...]
# BASE_DIR holds an earlier commit's kernels/, include/, src/, bench/gpu/
# (e.g. `git archive <commit> kernels include src bench/gpu | tar -x -C DIR`,
# carried to the device machine). Both trees' bench/gpu are built (sm_90);
# gpu_decode_check --bench --quick runs for each with the ENV settings given
# (e.g. IKV_BENCH_B=1); this tree's run repeats with IKV_CUDA_PDL=0 (plain
# launches). Outputs under $OUT: bench_before.log, bench_after.log, bench_after_nopdl.log.
set -u
cd "$(dirname "$0")/.."
BASE=$1; shift
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
build() {  # build SRC_ROOT BUILD_DIR LOG
  cmake -S "$1/bench/gpu" -B "$2" -DIKV_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release >"$3" 2>&1 &&
    cmake --build "$2" -j"$(nproc)" --target gpu_decode_check >>"$3" 2>&1
}
[ -x build-gpu/gpu_decode_check ] || build . build-gpu "$OUT/build_after.log" || { tail -20 "$OUT/build_after.log"; exit 1; }
build "$BASE" build-gpu-before "$OUT/build_before.log" || { tail -20 "$OUT/build_before.log"; exit 1; }
env "$@" ./build-gpu-before/gpu_decode_check --bench --quick >"$OUT/bench_before.log" 2>&1
env "$@" ./build-gpu/gpu_decode_check --bench --quick >"$OUT/bench_after.log" 2>&1
env "$@" IKV_CUDA_PDL=0 ./build-gpu/gpu_decode_check --bench --quick >"$OUT/bench_after_nopdl.log" 2>&1
for f in before after after_nopdl; do
  echo "== $f"; grep -E "^(dense|sel25|topk25|sweep)" "$OUT/bench_$f.log"
done
