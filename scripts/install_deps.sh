#!/usr/bin/env bash
# Install what intentkv needs to build, test and benchmark, from Debian's
# packages, only where missing. Safe to run again. Needs root (or sudo).
# Extra package names given as arguments are installed too (the test script
# adds the aarch64 cross compiler and qemu-user for the NEON check).
set -euo pipefail
need=()
for pkg in cmake g++ make pkg-config libmimalloc-dev libcmocka-dev libbenchmark-dev "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -eq 0 ]; then
  echo "install_deps: all dependencies present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install_deps: installing ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
