#!/usr/bin/env bash
# intentkv's CPU decode beside ggml's CPU flash attention (the peer a
# llama.cpp user would run), same shape, same threads, runs interleaved.
# ggml comes from a source release fetched now (the llama-cpp-python source
# distribution on PyPI vendors llama.cpp and ggml) and is built in a
# temporary directory: nothing of ggml is committed.
#   bash scripts/bench_ggml_peer.sh [contexts...]     (default: 8192 32768 131072)
# Shape: 32 query heads, 8 kv-heads, head_dim 128, one query token, dense;
# intentkv F16 / INT8 / INT4 pages (bench_decode, all hardware threads)
# against ggml F16 / Q8_0 / Q4_0 caches (as llama.cpp's -ctk/-ctv). Prints
# the mean of two interleaved rounds (each a median of its calls) and the ratios.
# Env: IKV_GGML_WORK (build directory, default a temporary one; reused when
# set), IKV_GGML_SDIST (a llama-cpp-python .tar.gz already downloaded),
# IKV_GGML_VERSION (the release fetched; default 0.3.36, the one bench/RESULTS.md cites).
set -euo pipefail
cd "$(dirname "$0")/.."
CTXS="${*:-8192 32768 131072}"
WORK="${IKV_GGML_WORK:-$(mktemp -d /tmp/ikv-ggml.XXXXXX)}"
mkdir -p "$WORK"
THREADS=$(nproc)

if [ ! -x "$WORK/ggml-flash-attn" ]; then
  SDIST="${IKV_GGML_SDIST:-}"
  if [ -z "$SDIST" ]; then
    python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==${IKV_GGML_VERSION:-0.3.36}" \
      -d "$WORK" >/dev/null
    SDIST=$(ls "$WORK"/llama_cpp_python-*.tar.gz | head -1)
  fi
  tar xzf "$SDIST" -C "$WORK"
  GGML=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp/ggml | head -1)
  touch "$GGML/ggml.pc.in"  # the source distribution leaves out this template, which only installs need
  cmake -S "$GGML" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >"$WORK/ggml_cmake.log" 2>&1
  cmake --build "$WORK/build" -j"$THREADS" --target ggml >"$WORK/ggml_build.log" 2>&1
  cc -O2 -std=c11 -Wall -I"$GGML/include" bench/peers/ggml_flash_attn.c "$WORK/build/src/libggml.a" \
    "$WORK/build/src/libggml-cpu.a" "$WORK/build/src/libggml-base.a" -lstdc++ -lm -lpthread -o "$WORK/ggml-flash-attn"
  echo "ggml from $(basename "$SDIST") built in $WORK"
fi

BUILD_DIR=build-bench bash scripts/build.sh -DIKV_ENABLE_CUDA=OFF -DIKV_BUILD_BENCH=ON -DIKV_BUILD_TESTS=OFF \
  -DIKV_BUILD_EXAMPLES=OFF >"$WORK/intentkv_build.log" 2>&1

declare -A T
for round in 1 2; do
  for ctx in $CTXS; do
    # intentkv: F16 (0), INT8 (3), INT4 (4) dense pages
    ./build-bench/bench/bench_decode --benchmark_filter="BM_Decode/[034]/$ctx/100/" 2>/dev/null |
      awk -v c="$ctx" '/^BM_Decode/ {split($1, a, "/"); print a[2], c, $2}' >"$WORK/ikv.txt"
    while read -r fmt c t; do T["ikv $fmt $c $round"]=$t; done <"$WORK/ikv.txt"
    for g in f16 q8_0 q4_0; do
      t=$("$WORK/ggml-flash-attn" "$g" "$ctx" "$THREADS" 10 | awk '{print $7}')
      T["ggml $g $ctx $round"]=$(awk -v ms="$t" 'BEGIN {printf "%.0f", ms * 1000}')
    done
  done
done

med() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (a + b) / 2000}'; }
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $THREADS threads; $(date -u +%Y-%m-%d)"
echo "| context | intentkv F16 | ggml F16 | ratio | intentkv INT8 | ggml Q8_0 | ratio | intentkv INT4 | ggml Q4_0 | ratio |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for ctx in $CTXS; do
  row="| $ctx"
  for pair in "0 f16" "3 q8_0" "4 q4_0"; do
    set -- $pair
    i=$(med "${T[ikv $1 $ctx 1]}" "${T[ikv $1 $ctx 2]}")
    g=$(med "${T[ggml $2 $ctx 1]}" "${T[ggml $2 $ctx 2]}")
    row="$row | $i ms | $g ms | $(awk -v i="$i" -v g="$g" 'BEGIN {printf "%.2fx", g / i}')"
  done
  echo "$row |"
done
echo "(ms per step, mean of two interleaved rounds; ratio = ggml time / intentkv time)"
