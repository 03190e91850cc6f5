#!/usr/bin/env bash
# Configure and build intentkv into ${BUILD_DIR:-build}. CUDA is used when nvcc
# is found (/usr/local/cuda/bin/nvcc); pass -DIKV_ENABLE_CUDA=OFF to skip it.
# Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" >"$BUILD_DIR.configure.log" 2>&1 \
  || { cat "$BUILD_DIR.configure.log"; exit 1; }
grep -E "intentkv:" "$BUILD_DIR.configure.log" || true
cmake --build "$BUILD_DIR" -j"$(nproc)"
