#!/usr/bin/env bash
# Static SASS instruction counts of the decode kernel's per-chunk compute (one
# 16-row chunk, D = 128, GQA group 4, one query token), per page format and
# compute path: SIMT (fp32 FMAs) and tensor cores (f16 / bf16 operands). No
# GPU needed: nvcc -cubin for sm_90 + cuobjdump -sass. cuobjdump comes from
# the CUDA toolkit, or from PyPI's nvidia-cuda-cuobjdump wheel when the
# toolkit lacks it. Prints a table; files under build-sass/.
#   scripts/chunk_sass_count.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$PWD/build-sass"
mkdir -p "$dir"
# cuobjdump (and the nvdisasm it runs): the toolkit's, else PyPI's wheels.
cuobjdump=$(command -v cuobjdump || true)
[ -z "$cuobjdump" ] && [ -x /usr/local/cuda/bin/cuobjdump ] && [ -x /usr/local/cuda/bin/nvdisasm ] &&
  cuobjdump=/usr/local/cuda/bin/cuobjdump
if [ -z "$cuobjdump" ]; then
  if ! ls "$dir"/whl/nvidia/cu*/bin/nvdisasm >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps -d "$dir/whl" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    for w in "$dir"/whl/*.whl; do (cd "$dir/whl" && python3 -m zipfile -e "$w" .); done
    chmod +x "$dir"/whl/nvidia/cu*/bin/*
  fi
  bin=$(dirname "$(ls "$dir"/whl/nvidia/cu*/bin/cuobjdump | head -1)")
  export PATH="$bin:$PATH"
  cuobjdump="$bin/cuobjdump"
fi
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
"$nvcc" -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -Isrc -Ikernels -cubin \
  -o "$dir/chunk_probe.cubin" bench/gpu/chunk_sass_probe.cu
"$cuobjdump" -sass "$dir/chunk_probe.cubin" > "$dir/chunk_probe.sass"
python3 - "$dir/chunk_probe.sass" <<'PY'
import collections, re, sys
text = open(sys.argv[1]).read()
fmts = {0: "F16", 1: "BF16", 2: "FP8", 3: "INT8", 4: "INT4"}
rows = []
for f in re.split(r"\n\s*Function : ", text)[1:]:
    m = re.search(r"probe_(simt|tc)ILi128ELi\d+E(?:Lb(\d)E)?Li(\d)E", f.split("\n")[0])
    if not m:
        continue
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", f))
    path = "simt" if m.group(1) == "simt" else ("tc-bf16" if m.group(2) == "1" else "tc-f16")
    total = sum(n for op, n in ops.items() if op != "NOP")
    rows.append((fmts[int(m.group(3))], path, total, ops["HMMA"], ops["FFMA"], ops["LDS"], ops["SHFL"]))
print("| format | path | instructions | HMMA | FFMA | LDS | SHFL |")
print("|---|---|---|---|---|---|---|")
for r in sorted(rows, key=lambda r: (list(fmts.values()).index(r[0]), r[1])):
    print("| %s | %s | %d | %d | %d | %d | %d |" % r)
PY
