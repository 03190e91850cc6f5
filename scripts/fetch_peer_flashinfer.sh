#!/usr/bin/env bash
# Fetches FlashInfer for the GPU peer table (bench/gpu/peer_table.py) from
# PyPI on this machine and trims it to what its JIT-compiled decode kernels
# need, so that it fits a device call's 64 MiB carry: build-peer/ gets
# fi_trim.tar.xz (the Python files, data/include, data/csrc files under
# 300 KB, data/cccl (the toolkit's own CCCL is older), cutlass/include and
# tools/util/include, spdlog: ~14 MB) and the apache-tvm-ffi (cp312) and
# ninja wheels it imports and builds with. Never committed (build-peer/ is
# ignored). scripts/gpu_table.sh unpacks it on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${FLASHINFER_VERSION:-0.7.2.post1}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$work" "flashinfer-python==$VERSION" apache-tvm-ffi ninja >"$work/pip.log" 2>&1 ||
  { tail -5 "$work/pip.log"; exit 1; }
mkdir -p "$work/x" "$work/t/flashinfer/data/cutlass/tools/util" build-peer
python3 -m zipfile -e "$work"/flashinfer_python-*.whl "$work/x"
(
  cd "$work/x"
  { find flashinfer -name '*.py' -not -path 'flashinfer/data/*'
    find flashinfer -maxdepth 1 -type f -not -name '*.py'
    find flashinfer/data/include flashinfer/data/cccl flashinfer/data/spdlog flashinfer/data/cutlass/include \
         flashinfer/data/cutlass/tools/util/include -type f
    find flashinfer/data -maxdepth 1 -name '*.py'
    find flashinfer/data/csrc -type f -size -300k; } | tar -cf - -T - | tar -C "$work/t" -xf -
)
tar -C "$work/t" -cJf build-peer/fi_trim.tar.xz flashinfer
rm -f build-peer/*.whl
cp "$work"/apache_tvm_ffi-*.whl "$work"/ninja-*.whl build-peer/
du -sh build-peer
