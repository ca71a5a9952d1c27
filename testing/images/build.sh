#!/usr/bin/env bash
# Builds a test guest image and prints its path. Images are cached under
# .cache/images by a hash of their build scripts and inputs, and rebuilt
# when those change.
#   testing/images/build.sh tiny|cloud
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
kind=${1:?usage: build.sh tiny|cloud}
cache=${VIRTLET_IMAGE_CACHE:-$repo/.cache/images}
mkdir -p "$cache"
# The kernel Debian's linux-image-amd64 depends on now.
kv=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: linux-image-\([0-9].*-amd64\)$/\1/p' | head -1)
[ -n "$kv" ] || { echo "cannot find the kernel version of linux-image-amd64 (apt-get update?)" >&2; exit 1; }
key=$( (echo "$kind $kv"; cat "$here/build.sh" "$here/uefi-boot.sh"; find "$here/$kind" -type f | sort | xargs cat) | sha256sum | cut -c1-16)
out=$cache/$kind-$key.qcow2
if [ ! -f "$out" ]; then
  work=$cache/work-$kind
  mkdir -p "$work"
  echo "building the $kind test image (kernel $kv) into $out" >&2
  "$here/$kind/build.sh" "$out" "$work" "$kv" >&2
  for old in "$cache/$kind"-*.qcow2; do [ "$old" = "$out" ] || rm -f "$old"; done
fi
echo "$out"
