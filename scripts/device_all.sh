#!/usr/bin/env bash
# Everything the GPU machine runs in one call (it has CUDA, PyTorch and CMake,
# but not mimalloc, CMocka or Google Benchmark: carry build-deps/, a prefix
# holding copies of those Debian packages' files, made here by
# scripts/fetch_device_deps.sh).
#   1. scripts/gpu_check.sh --sanitize --no-lib: kernel checks vs float64,
#      GPU benchmark, PyTorch SDPA peer, compute-sanitizer memcheck;
#   2. the whole library with CUDA (sm_90) + tests + benchmarks + demo:
#      every CTest test (CPU paths incl. AVX-512 on this host's Xeon, GPU test);
#   3. the demo on the GPU and on the CPU;
#   4. the CPU benchmarks on this idle 16-core host (decode, pool, router).
# Outputs under $OUT. Usage: scripts/device_all.sh [gpu] [lib] [cpu-bench]
# (no argument: all three; one device call is capped at 10 minutes, so run
# `gpu` in one call and `lib cpu-bench` in the next when both are needed).
set -u
STAGES="${*:-gpu lib cpu-bench}"
want() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
JOBS=$(nproc)
DEPS="$PWD/build-deps"
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"

if want gpu; then
  OUT="$OUT" bash scripts/gpu_check.sh --sanitize --no-lib 2>&1 | grep -v '^PASS' | grep -v '^| ' |
    tee "$OUT/gpu_check.log" | tail -25
fi
want lib || want cpu-bench || exit 0

echo "== library + tests + benchmarks (CUDA sm_90) =="
cmake -S . -B build-dev -DIKV_ENABLE_CUDA=ON -DIKV_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$DEPS" >"$OUT/dev_build.log" 2>&1 && cmake --build build-dev -j"$JOBS" >>"$OUT/dev_build.log" 2>&1 \
  || { echo "library build failed"; tail -20 "$OUT/dev_build.log"; exit 1; }
if want lib; then
  (cd build-dev && ctest --no-tests=error -j8 --output-on-failure) >"$OUT/ctest_all.log" 2>&1
  grep -E "tests passed|Failed|Skipped|Not Run" "$OUT/ctest_all.log" | head -20
  echo "== demo =="
  ./build-dev/examples/intentkv-demo >"$OUT/demo_gpu.txt" 2>&1; tail -14 "$OUT/demo_gpu.txt"
  ./build-dev/examples/intentkv-demo --cpu >"$OUT/demo_cpu.txt" 2>&1; tail -9 "$OUT/demo_cpu.txt"
fi
want cpu-bench || exit 0

echo "== CPU benchmarks on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc) =="
timeout 200 ./build-dev/bench/bench_decode --benchmark_min_time=0.3 >"$OUT/bench_decode.txt" 2>&1
timeout 60 ./build-dev/bench/bench_pool --benchmark_min_time=0.2 >"$OUT/bench_pool.txt" 2>&1
timeout 30 ./build-dev/bench/bench_router --benchmark_min_time=0.2 >"$OUT/bench_router.txt" 2>&1
grep -E "ReadBandwidth|32768|131072" "$OUT/bench_decode.txt" | head -30
echo "outputs in $OUT"
