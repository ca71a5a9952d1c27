#!/usr/bin/env bash
# Regenerates the Go code of the plugin protocols. The generated code is
# committed, so a plain `go build` needs none of this.
# Needs: protoc (Debian protobuf-compiler); installs the Go generators at
# pinned versions into bin/tools.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=$PWD/bin/tools
mkdir -p "$TOOLS"
[ -x "$TOOLS/protoc-gen-go" ] || GOBIN=$TOOLS go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.6
[ -x "$TOOLS/protoc-gen-go-grpc" ] || GOBIN=$TOOLS go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
command -v protoc >/dev/null || { echo "protoc not found: apt-get install -y protobuf-compiler" >&2; exit 1; }
cd proto
PATH=$TOOLS:$PATH protoc -I . \
  --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  $(find . -name '*.proto' | sort)
