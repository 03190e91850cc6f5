#!/usr/bin/env bash
# Fill build-deps/ (ignored by git) with the files of the Debian packages the
# library's tests and CPU benchmarks need but the GPU machine lacks
# (mimalloc, CMocka, Google Benchmark), so a device run can carry it:
#   device run with carry: ["build-deps"]; then scripts/device_all.sh
# (it passes -DCMAKE_PREFIX_PATH=$PWD/build-deps and sets LD_LIBRARY_PATH).
# Run here, on a Debian 12 x86-64 machine with apt. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="$PWD/build-deps"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download libmimalloc-dev libmimalloc2.0 libcmocka-dev libcmocka0 libbenchmark-dev \
  libbenchmark1debian >/dev/null)
rm -rf "$dest"
mkdir -p "$tmp/root"
for f in "$tmp"/*.deb; do dpkg -x "$f" "$tmp/root"; done
mv "$tmp/root/usr" "$dest"
echo "fetch_device_deps: $(du -sh "$dest" | cut -f1) in $dest"
