#!/usr/bin/env bash
# Nsight Compute profile of the decode step's kernels next to PyTorch SDPA's,
# and of the copies-only stream kernels, for the benchmark cases whose targets
# are missed (bench/RESULTS.md section 1):
# per kernel its duration, grid, occupancy, DRAM throughput, issue activity and
# warp stall reasons. Run on the GPU machine after scripts/gpu_check.sh has
# built build-gpu/ (or let this script build it).
#   scripts/profile_decode.sh [B ctx fmt]...   (default: 1 32768 f16  1 32768 int8  8 32768 f16)
# Outputs under $OUT: ncu_<B>_<ctx>_<fmt>.csv, ncu_sdpa_<B>_<ctx>.csv, timing_<B>_<ctx>_<fmt>.log
# (the same cases timed without the profiler, to compare with the sum of kernel durations).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/profile-out}"
mkdir -p "$OUT"
if [ ! -x build-gpu/gpu_decode_check ]; then
  cmake -S bench/gpu -B build-gpu -DIKV_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" >>"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
CASES=("$@")
[ ${#CASES[@]} -eq 0 ] && CASES=(1 32768 f16 1 32768 int8 8 32768 f16)
# METHOD.md: leave the clocks alone (--clock-control none).
NCU0=(ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats
      --section WarpStateStats --csv --page details)
# Plus the per-reason warp stalls (if this ncu knows the metric names; else without them).
NCU=("${NCU0[@]}" --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio')
# profile FILE CMD...: ncu CMD into FILE, retried without the stall metrics when nothing was profiled.
profile() {
  local f=$1; shift
  "${NCU[@]}" "$@" >"$f" 2>"${f%.csv}.err"
  grep -q '"Duration"' "$f" || "${NCU0[@]}" "$@" >"$f" 2>>"${f%.csv}.err"
}
for ((i = 0; i + 2 < ${#CASES[@]}; i += 3)); do
  B=${CASES[i]} CTX=${CASES[i+1]} FMT=${CASES[i+2]}
  tag="${B}_${CTX}_${FMT}"
  IKV_BENCH_B=$B IKV_BENCH_CTX=$CTX IKV_BENCH_FMT=$FMT ./build-gpu/gpu_decode_check --bench --quick \
    >"$OUT/timing_$tag.log" 2>&1
  IKV_BENCH_ONCE=1 IKV_BENCH_B=$B IKV_BENCH_CTX=$CTX IKV_BENCH_FMT=$FMT profile "$OUT/ncu_$tag.csv" \
    -k regex:'decode_kernel|merge|score|select|stream_pages' ./build-gpu/gpu_decode_check --bench --quick
  echo "== $tag: $(grep -c '"Duration"' "$OUT/ncu_$tag.csv") kernels profiled"
done
# SDPA's kernels on the same shapes (32 q-heads, 8 kv-heads, head_dim 128, fp16, one query token).
for ((i = 0; i + 2 < ${#CASES[@]}; i += 3)); do
  B=${CASES[i]} CTX=${CASES[i+1]}
  [ -f "$OUT/ncu_sdpa_${B}_${CTX}.csv" ] && continue
  cat >"$OUT/sdpa_once.py" <<EOF
import torch, torch.nn.functional as F
q = torch.randn($B, 32, 1, 128, device="cuda", dtype=torch.float16)
k = torch.randn($B, 8, $CTX, 128, device="cuda", dtype=torch.float16)
v = torch.randn_like(k)
F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
EOF
  profile "$OUT/ncu_sdpa_${B}_${CTX}.csv" python3 "$OUT/sdpa_once.py"
  echo "== sdpa ${B}_${CTX}: $(grep -c '"Duration"' "$OUT/ncu_sdpa_${B}_${CTX}.csv") kernels profiled"
done
python3 scripts/summarize_ncu.py "$OUT"/ncu_*.csv | tee "$OUT/profile_summary.md"
