#!/usr/bin/env bash
# Builds the real CRI clients and the container runtime the tests use, at
# pinned versions, into bin/tools: crictl and critest (cri-tools v1.34.0);
# containerd 2.2 with its shim and ctr, and runc 1.3 (bin/tools/containerd),
# the runtime container pods are forwarded to. Each is rebuilt only when
# missing or when its module (or this script) changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../bin/tools}
mkdir -p "$out/containerd"
export GONOSUMDB=${GONOSUMDB:-sigs.k8s.io/cri-tools,k8s.io,sigs.k8s.io} GOFLAGS=-mod=mod

# fresh STAMP MODULE BINARY...: the binaries are there and were built from
# MODULE as it is now.
fresh() {
  local stamp=$1 module=$2; shift 2
  local want bin
  want=$(cat "$module/go.mod" "$module/go.sum" "$here/build.sh" | sha256sum | cut -d' ' -f1)
  for bin in "$@"; do [ -x "$bin" ] || return 1; done
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]
}
stamp() { cat "$2/go.mod" "$2/go.sum" "$here/build.sh" | sha256sum | cut -d' ' -f1 > "$1"; }

if ! fresh "$out/.cri-tools.sum" "$here" "$out/crictl" "$out/critest"; then
  (cd "$here" &&
    go build -o "$out/crictl" sigs.k8s.io/cri-tools/cmd/crictl &&
    go test -c -o "$out/critest" sigs.k8s.io/cri-tools/cmd/critest)
  stamp "$out/.cri-tools.sum" "$here"
  "$out/crictl" --version
fi

ctrd=$out/containerd
if ! fresh "$ctrd/.containerd.sum" "$here/containerd" "$ctrd/containerd" "$ctrd/containerd-shim-runc-v2" "$ctrd/ctr"; then
  (cd "$here/containerd" && go build -o "$ctrd/" -tags "no_btrfs no_devmapper no_zfs" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr)
  stamp "$ctrd/.containerd.sum" "$here/containerd"
  "$ctrd/containerd" --version
fi
if ! fresh "$ctrd/.runc.sum" "$here/runc" "$ctrd/runc"; then
  (cd "$here/runc" && CGO_ENABLED=1 go build -o "$ctrd/runc" -tags seccomp github.com/opencontainers/runc)
  stamp "$ctrd/.runc.sum" "$here/runc"
  "$ctrd/runc" --version
fi
