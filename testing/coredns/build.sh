#!/usr/bin/env bash
# Builds CoreDNS, the cluster DNS of the multi-node tests' mixed node, at
# one pinned version, from the Go module proxy (static: it runs in a
# container image of the tests' own, harness.CoreDNSImage). Cached in the
# machine's build cache (testing/cache.sh) under coredns/<version>-<hash
# of this script>. Prints the binary's path.
#   testing/coredns/build.sh
# A cold build takes about 3 minutes on 2 cores.
set -euo pipefail
V=1.12.4
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../cache.sh"
cache=$cache_root/coredns
key=$( (echo "$V"; cat "$here/build.sh") | sha256sum | cut -c1-16)
out=$cache/$V-$key
if [ -x "$out/coredns" ]; then echo "$out/coredns"; exit 0; fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/work-$key.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "coredns: building v$V" >&2
GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$work/bin" \
  go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@v$V" >&2
mkdir -p "$out"
mv "$work/bin/coredns" "$out/coredns"
echo "$out/coredns"
