#!/usr/bin/env bash
# On the GPU machine: the opening table of bench/RESULTS.md (issue 18) in one
# run. Builds the library with its tests (build-dev, sm_90) unless built,
# runs tests/bench_gpu_api (intentkv through ikv_decode), tests/bench_gpu_step
# (the engine step of issue 19) and then
# bench/gpu/peer_table.py (SDPA cuDNN and flash, FlashInfer from build-peer/
# when scripts/fetch_peer_flashinfer.sh put it there; carry build-peer and
# build-deps). Writes $OUT/ikv_api.txt, $OUT/ikv_step.txt, $OUT/peers.log and
# $OUT/gpu_table.md.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/build-deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
if [ ! -x build-dev/tests/bench_gpu_api ]; then
  cmake -S . -B build-dev -DIKV_ENABLE_CUDA=ON -DIKV_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release -DIKV_BUILD_BENCH=OFF \
    -DIKV_BUILD_TESTS=ON -DCMAKE_PREFIX_PATH="$PWD/build-deps" >"$OUT/table_build.log" 2>&1 &&
    cmake --build build-dev -j"$(nproc)" >>"$OUT/table_build.log" 2>&1 || { tail -20 "$OUT/table_build.log"; exit 1; }
fi
# The table's columns only (every column, multi-token drafts included, takes
# ~5 minutes more: a device call would pass its 10-minute limit while
# FlashInfer compiles; the graph replays come with their base columns).
# IKV_API_ONLY set by the caller wins; set and empty, every column.
export IKV_API_ONLY="${IKV_API_ONLY-dense-f16,plan25,topk25,hyb25,hyb25-mem,dense-feedback,dense-bf16,dense-fp8,dense-int8,dense-int4}"
./build-dev/tests/bench_gpu_api >"$OUT/ikv_api.txt" 2>&1 || { tail -20 "$OUT/ikv_api.txt"; exit 1; }
./build-dev/tests/bench_gpu_step >"$OUT/ikv_step.txt" 2>&1 || { tail -20 "$OUT/ikv_step.txt"; exit 1; }
if [ -f build-peer/fi_trim.tar.xz ]; then
  site="$PWD/build-peer/site"
  if [ ! -d "$site/flashinfer" ]; then
    mkdir -p "$site"
    python3 -m pip install --no-index --no-deps --target "$site" build-peer/*.whl >"$OUT/peer_install.log" 2>&1
    tar -C "$site" -xJf build-peer/fi_trim.tar.xz
  fi
  export PYTHONPATH="$site:${PYTHONPATH:-}" PATH="$site/bin:$PATH"
  export FLASHINFER_WORKSPACE_BASE="$PWD/build-peer/jit" MAX_JOBS="$(nproc)"
fi
python3 bench/gpu/peer_table.py --ours "$OUT/ikv_api.txt" --steps "$OUT/ikv_step.txt" --out "$OUT" >"$OUT/peers.log" 2>&1
tail -40 "$OUT/peers.log"
