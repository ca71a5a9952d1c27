#!/usr/bin/env bash
# Builds the real CRI clients the tests use, at pinned versions, into
# bin/tools: crictl and critest (cri-tools v1.34.0). Rebuilt only when
# missing or when this module changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../bin/tools}
mkdir -p "$out"
stamp="$out/.cri-tools.sum"
want=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -d' ' -f1)
if [ -x "$out/crictl" ] && [ -x "$out/critest" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
cd "$here"
export GONOSUMDB=${GONOSUMDB:-sigs.k8s.io/cri-tools,k8s.io,sigs.k8s.io} GOFLAGS=-mod=mod
go build -o "$out/crictl" sigs.k8s.io/cri-tools/cmd/crictl
go test -c -o "$out/critest" sigs.k8s.io/cri-tools/cmd/critest
echo "$want" > "$stamp"
"$out/crictl" --version
