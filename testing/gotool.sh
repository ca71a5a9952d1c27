#!/usr/bin/env bash
# Builds a Go tool the tests run, at one pinned version from the Go module
# proxy, static, and prints its path. Cached in the machine's build cache
# (testing/cache.sh) under <name>/<version>-<hash of this script and the
# caller's>, so that a change to either rebuilds it.
#   testing/gotool.sh NAME MODULE VERSION CALLER
# (CALLER: the script that pins the tool, part of the cache key.)
set -euo pipefail
name=$1 module=$2 version=$3 caller=$4
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cache.sh"
cache=$cache_root/$name
key=$( (echo "$module@$version"; cat "$here/gotool.sh" "$caller") | sha256sum | cut -c1-16)
out=$cache/$version-$key
if [ -x "$out/$name" ]; then echo "$out/$name"; exit 0; fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/work-$key.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "$name: building $module@v$version" >&2
GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$work/bin" \
  go install -trimpath -ldflags "-s -w" "$module@v$version" >&2
mkdir -p "$out"
mv "$work/bin/$name" "$out/$name"
echo "$out/$name"
