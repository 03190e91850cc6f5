#!/usr/bin/env bash
# The Go binding (bindings/go) against the library of build dir $1, installed
# into a temporary prefix and found through pkg-config as an engine would
# (#cgo pkg-config: intentkv): go vet, then go test with cgo's pointer checks on.
# Go comes from Debian's golang-go (scripts/install_deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PREFIX=$(mktemp -d /tmp/intentkv-go-prefix.XXXXXX)
export GOPATH=$(mktemp -d /tmp/intentkv-gopath.XXXXXX) GOCACHE=$(mktemp -d /tmp/intentkv-gocache.XXXXXX)
trap 'rm -rf "$PREFIX" "$GOPATH" "$GOCACHE"' EXIT
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
LIBDIR=$(dirname "$(find "$PREFIX" -name 'libintentkv.so' | head -1)")
export PKG_CONFIG_PATH="$LIBDIR/pkgconfig" LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CGO_ENABLED=1 GODEBUG=cgocheck=1 GOFLAGS=-mod=mod GOPROXY=off
cd bindings/go
go vet ./...
go test -count=1 -v ./... 2>&1 | tee "$GOCACHE/test.log"
grep -q '^ok' "$GOCACHE/test.log"
