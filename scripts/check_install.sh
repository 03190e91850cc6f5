#!/usr/bin/env bash
# Install the library from build dir $1 into a temporary prefix, then compile
# and run an outside C program against it using only pkg-config, and again
# through CMake's find_package(intentkv); both again against the static
# library (pkg-config --static, intentkv::intentkv_static). Also checks that the shared library
# exports only ikv_* symbols, and that the Rust crate links it through pkg-config.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PREFIX=$(mktemp -d /tmp/intentkv-prefix.XXXXXX)
WORK=$(mktemp -d /tmp/intentkv-consumer.XXXXXX)
trap 'rm -rf "$PREFIX" "$WORK"' EXIT
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
LIBDIR=$(dirname "$(find "$PREFIX" -name 'libintentkv.so' | head -1)")

bad=$(nm -D --defined-only "$LIBDIR/libintentkv.so" | awk '$2 ~ /[TDBR]/ {print $3}' | grep -v '^ikv_' || true)
if [ -n "$bad" ]; then
  echo "check_install: the shared library exports symbols outside ikv_*:"; echo "$bad" | head -20; exit 1
fi
echo "check_install: exported symbols are all ikv_* ($(nm -D --defined-only "$LIBDIR/libintentkv.so" | grep -c ' ikv_'))"
readelf -d "$LIBDIR/libintentkv.so" | grep -q 'SONAME.*libintentkv.so.0' && echo "check_install: SONAME libintentkv.so.0"

# The C++ runtime ahead of libmimalloc among a binary's NEEDED libraries:
# Debian's libmimalloc overrides operator new with one that abort()s when
# memory runs out, and the first library that defines it serves every caller
# (docs/FORMATS.md, "Memory").
runtime_first() {  # runtime_first FILE WHAT
  local order
  order=$(readelf -d "$1" | awk '/NEEDED/ && /libstdc\+\+|libmimalloc/ {print $NF}' | tr -d '[]' | tr '\n' ' ')
  case "$order" in
    libstdc++*) echo "check_install: $2 loads libstdc++ before libmimalloc" ;;
    *) echo "check_install: $2 loads libmimalloc before libstdc++ (NEEDED: $order)"; exit 1 ;;
  esac
}
runtime_first "$LIBDIR/libintentkv.so" "the shared library"

export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
cc -std=c11 -Wall -Wextra -Werror -pedantic tests/install/consumer.c -o "$WORK/consumer" \
  $(pkg-config --cflags --libs intentkv)
LD_LIBRARY_PATH="$LIBDIR" "$WORK/consumer"
echo "check_install: pkg-config consumer OK"

# Static linking through pkg-config: a prefix holding only the archive (as a
# distribution's -dev package of a static-only build would), so -lintentkv
# can only mean libintentkv.a; Libs.private supplies its dependencies.
STATIC="$WORK/static-prefix"
REL=${LIBDIR#"$PREFIX"/}  # lib, lib64 or lib/<multiarch>: the .pc file finds the prefix relative to itself
mkdir -p "$STATIC/$REL"
cp -r "$PREFIX/include" "$STATIC/"
cp -r "$LIBDIR/pkgconfig" "$LIBDIR/libintentkv.a" "$STATIC/$REL/"
cc -std=c11 -Wall -Wextra -Werror -pedantic tests/install/consumer.c -o "$WORK/consumer_static_pc" \
  $(PKG_CONFIG_PATH="$STATIC/$REL/pkgconfig" pkg-config --static --cflags --libs intentkv)
if ldd "$WORK/consumer_static_pc" | grep -q libintentkv; then
  echo "check_install: the pkg-config --static consumer still loads libintentkv.so"; exit 1
fi
"$WORK/consumer_static_pc"
runtime_first "$WORK/consumer_static_pc" "the pkg-config --static consumer"
echo "check_install: pkg-config --static consumer OK (libintentkv.a linked in)"

mkdir -p "$WORK/cm"
cmake -S tests/install -B "$WORK/cm" -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$WORK/cm" >/dev/null
LD_LIBRARY_PATH="$LIBDIR" "$WORK/cm/consumer"
echo "check_install: find_package consumer OK"
if ldd "$WORK/cm/consumer_static" | grep -q libintentkv; then
  echo "check_install: the intentkv::intentkv_static consumer loads libintentkv.so"; exit 1
fi
"$WORK/cm/consumer_static"
runtime_first "$WORK/cm/consumer_static" "the intentkv::intentkv_static consumer"
echo "check_install: find_package static consumer OK (intentkv::intentkv_static from a C project)"

# The Rust crate finds the installed library through the pkg-config program
# (bindings/rust/build.rs), with no INTENTKV_LIB_DIR override.
if command -v cargo >/dev/null 2>&1; then
  (cd bindings/rust && env -u INTENTKV_LIB_DIR PKG_CONFIG_PATH="$LIBDIR/pkgconfig" CARGO_TARGET_DIR="$WORK/cargo" \
    cargo test --offline --quiet --test roundtrip >"$WORK/cargo.log" 2>&1) ||
    { tail -20 "$WORK/cargo.log"; echo "check_install: the Rust crate did not link through pkg-config"; exit 1; }
  echo "check_install: Rust crate linked through pkg-config OK"
fi
