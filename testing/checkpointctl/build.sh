#!/usr/bin/env bash
# Builds checkpointctl, the checkpoint-restore project's tool that reads
# container checkpoint archives, at one pinned version from the Go module
# proxy: the checkpoint tests show Virtlet's VM checkpoints with it.
# Cached in the machine's build cache (testing/cache.sh) under
# checkpointctl/<version>-<hash of this script>. Prints the binary's path.
#   testing/checkpointctl/build.sh
set -euo pipefail
V=1.4.0
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../cache.sh"
cache=$cache_root/checkpointctl
key=$( (echo "$V"; cat "$here/build.sh") | sha256sum | cut -c1-16)
out=$cache/$V-$key
if [ -x "$out/checkpointctl" ]; then echo "$out/checkpointctl"; exit 0; fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/work-$key.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "checkpointctl: building v$V" >&2
GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$work/bin" \
  go install -trimpath -ldflags "-s -w" "github.com/checkpoint-restore/checkpointctl@v$V" >&2
mkdir -p "$out"
mv "$work/bin/checkpointctl" "$out/checkpointctl"
echo "$out/checkpointctl"
