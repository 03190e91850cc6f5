#!/usr/bin/env bash
# The README's first command: install dependencies, build, run the demo
# (on the GPU when one is present, else on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh -DIKV_BUILD_TESTS=OFF -DIKV_BUILD_BENCH=OFF
./build/examples/intentkv-demo "$@"
