#!/usr/bin/env bash
# Cross-compile the NEON decode kernels (and the portable ones) for aarch64 and,
# when qemu-aarch64 is installed, run a small check that the NEON kernels and
# the scalar ones agree (attention on random pages of every format, top-k bounds).
# Needs: apt-get install -y g++-aarch64-linux-gnu [qemu-user]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cxx="${CXX_AARCH64:-aarch64-linux-gnu-g++}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
flags=(-std=c++17 -O2 -Wall -Wextra -Wno-unused-parameter -I"$root/include" -I"$root/src")
"$cxx" "${flags[@]}" -c "$root/src/cpu/attn_neon.cpp" -o "$out/attn_neon.o"
"$cxx" "${flags[@]}" -c "$root/src/cpu/attn_scalar.cpp" -o "$out/attn_scalar.o"
"$cxx" "${flags[@]}" "$root/scripts/neon_kernel_check.cpp" "$out/attn_neon.o" "$out/attn_scalar.o" \
    -static -o "$out/neon_check"
echo "NEON kernel compiled for aarch64"
if command -v qemu-aarch64 >/dev/null 2>&1; then
    qemu-aarch64 "$out/neon_check"
else
    echo "qemu-aarch64 not found: compiled only"
fi
