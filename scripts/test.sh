#!/usr/bin/env bash
# The README's second command: install dependencies, build, run every test.
#   1. the normal build (CUDA kernels compiled when nvcc is present; GPU tests
#      skip visibly without a GPU), all CTest tests; the pool tests again on
#      an emulated CPU without AVX (the append path's baseline copy);
#   2. the pool, layout, router, plan and decode (AVX2 path) tests again under
#      AddressSanitizer + UBSan;
#   3. the threaded tests under ThreadSanitizer; the libFuzzer targets for
#      20 s each (scripts/fuzz.sh; longer: bash scripts/fuzz.sh 3600); the NEON
#      kernel cross-compiled for aarch64 and checked against the scalar kernel
#      under qemu-user;
#   4. the selection-quality harness (bench/quality): its user-format tests and
#      its properties on small real (MiniLM) and synthetic sets;
#   5. the Python (ctypes), Rust and Go (cgo, pkg-config) bindings' tests;
#   6. install into a temporary prefix and build an outside C program against
#      it with pkg-config only, and another with find_package(intentkv).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh g++-aarch64-linux-gnu qemu-user golang-go

echo "== build and test =="
# Every option this pass needs is set here: the build directory's cache may
# hold another script's choices (scripts/demo.sh configures without tests).
bash scripts/build.sh -DIKV_BUILD_TESTS=ON -DIKV_BUILD_EXAMPLES=ON -DIKV_BUILD_BENCH=OFF
(cd build && ctest --no-tests=error --output-on-failure -j"$(nproc)")

echo "== examples on the CPU, small: engine_loop.c (the template an engine copies), tensor_parallel.c =="
./build/examples/engine-loop cpu layers=2 seqs=3 ctx=4096 steps=12 turn=4
./build/examples/tensor-parallel cpu

echo "== baseline x86-64 copies (no AVX), the pool tests under qemu-x86_64 -cpu Nehalem =="
bash scripts/check_baseline_x86.sh build

echo "== AddressSanitizer + UBSan (CPU only) =="
BUILD_DIR=build-asan BUILD_TYPE=Debug bash scripts/build.sh -DIKV_ENABLE_CUDA=OFF -DIKV_SANITIZE=ON \
  -DIKV_BUILD_TESTS=ON -DIKV_BUILD_BENCH=OFF -DIKV_BUILD_EXAMPLES=OFF
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --no-tests=error --output-on-failure -j"$(nproc)" -R "test_(pool|layout|router|plan|synth|common|decode_avx2|decode_avx512)")

echo "== ThreadSanitizer (CPU only): pool threads, decoder worker threads, several decoders on one pool =="
BUILD_DIR=build-tsan BUILD_TYPE=RelWithDebInfo bash scripts/build.sh -DIKV_ENABLE_CUDA=OFF -DIKV_SANITIZE_THREAD=ON \
  -DIKV_BUILD_TESTS=ON -DIKV_BUILD_BENCH=OFF -DIKV_BUILD_EXAMPLES=OFF
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --no-tests=error --output-on-failure -j"$(nproc)" \
  -R "test_(pool_threads|pool_batch|decode_avx2)")

echo "== libFuzzer (clang, ASan + UBSan): layouts, routes, plans, pool edits and decodes, 20 s per target =="
bash scripts/fuzz.sh 20

echo "== NEON kernel: aarch64 cross build, checked under qemu-user =="
bash scripts/check_neon_build.sh

echo "== selection-quality harness: user tensor format, and its properties on small real and synthetic sets =="
bash scripts/install_python_deps.sh
INTENTKV_LIB="$PWD/build/libintentkv.so" python3 -m unittest bench/quality/test_quality.py
OPENBLAS_NUM_THREADS=1 INTENTKV_LIB="$PWD/build/libintentkv.so" python3 bench/quality/run_quality.py --small --check \
  --data real-single,real-multidoc-8k,synth-32k | grep -E "^==|harness properties|VIOLATION"

echo "== bindings: Python (ctypes) and Rust =="
bash scripts/test_bindings.sh build

echo "== Go binding (cgo through pkg-config, against an installed copy) =="
bash scripts/test_go.sh build

echo "== install and use from outside =="
bash scripts/check_install.sh build
