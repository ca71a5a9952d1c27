#!/usr/bin/env bash
# Builds the real CRI clients and the container runtime the tests use, at
# pinned versions, into bin/tools: gotestsum (runs make check's suites);
# crictl and critest (cri-tools v1.34.0);
# containerd 2.2 with its shim and ctr, and runc 1.3 (bin/tools/containerd),
# the runtime container pods are forwarded to. Each is rebuilt only when
# missing or when its module (or this script) changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../bin/tools}
export GONOSUMDB=${GONOSUMDB:-sigs.k8s.io/cri-tools,k8s.io,sigs.k8s.io} GOFLAGS=-mod=mod
# The binaries are built once per content (their module's go.mod and go.sum
# and this script) into a cache shared by every checkout on the machine, as
# Go's own build cache is, and linked into $out.
. "$here/../cache.sh"
cache=$cache_root/tools

# tools NAME MODULE DEST BUILD BIN...: BIN... (the first answers --version),
# built by the function BUILD DIR from MODULE as it is now, linked into DEST.
tools() {
  local name=$1 module=$2 dest=$3 build=$4; shift 4
  local key dir bin tmp missing=0
  key=$(cat "$module/go.mod" "$module/go.sum" "$here/build.sh" | sha256sum | cut -c1-16)
  dir=$cache/$name-$key
  for bin in "$@"; do [ -x "$dir/$bin" ] || missing=1; done
  if [ $missing = 1 ]; then
    mkdir -p "$cache"
    tmp=$(mktemp -d "$dir.XXXXXX")
    (cd "$module" && "$build" "$tmp")
    # A run beside this one may have put the same build in place
    # meanwhile, and link to it: keep that one if it is whole.
    missing=0
    for bin in "$@"; do [ -x "$dir/$bin" ] || missing=1; done
    if [ $missing = 0 ]; then rm -rf "$tmp"; else rm -rf "$dir" && mv "$tmp" "$dir"; fi
    "$dir/$1" --version
  fi
  mkdir -p "$dest"
  for bin in "$@"; do ln -sfn "$dir/$bin" "$dest/$bin"; done
}

build_gotestsum() { go build -o "$1/gotestsum" gotest.tools/gotestsum; }
build_cri_tools() {
  go build -o "$1/crictl" sigs.k8s.io/cri-tools/cmd/crictl &&
    go test -c -o "$1/critest" sigs.k8s.io/cri-tools/cmd/critest
}
build_containerd() {
  go build -o "$1/" -tags "no_btrfs no_devmapper no_zfs" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
}
build_runc() { CGO_ENABLED=1 go build -o "$1/runc" -tags seccomp github.com/opencontainers/runc; }

tools gotestsum "$here/gotestsum" "$out" build_gotestsum gotestsum
tools cri-tools "$here" "$out" build_cri_tools crictl critest
tools containerd "$here/containerd" "$out/containerd" build_containerd containerd containerd-shim-runc-v2 ctr
tools runc "$here/runc" "$out/containerd" build_runc runc
