#!/usr/bin/env bash
# Builds a test guest image and prints its path. Images are cached in the
# machine's build cache (testing/cache.sh) by a hash of their build scripts
# and inputs, and rebuilt when those change; a build works in a directory
# of its own and renames its image into place, so runs side by side never
# see a half-built one.
#   testing/images/build.sh tiny|cloud
# VIRTLET_TINY_KERNEL=debian builds the tiny guest to boot Debian's kernel
# by BIOS too, not its own (kernel/build.sh), which takes ≈ 10 minutes to
# build the first time: the demo boots one guest, the suites hundreds. That
# flavour needs 128 MiB (its kernel and modules do not unpack in 96).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kind=${1:?usage: build.sh tiny|cloud}
flavour=
if [ "$kind" = tiny ]; then
  flavour=${VIRTLET_TINY_KERNEL:-own}
  case $flavour in own|debian) ;; *) echo "VIRTLET_TINY_KERNEL=$flavour: want own or debian" >&2; exit 1;; esac
fi
. "$here/../cache.sh"
cache=${VIRTLET_IMAGE_CACHE:-$cache_root/images}
mkdir -p "$cache"
# The kernel Debian's linux-image-amd64 depends on now.
kv=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: linux-image-\([0-9].*-amd64\)$/\1/p' | head -1)
[ -n "$kv" ] || { echo "cannot find the kernel version of linux-image-amd64 (apt-get update?)" >&2; exit 1; }
key=$( (echo "$kind $kv $flavour"; cat "$here/build.sh" "$here/uefi-boot.sh"; find "$here/$kind" "$here/kernel" -type f | sort | xargs cat) | sha256sum | cut -c1-16)
out=$cache/$kind-$key.qcow2
if [ ! -f "$out" ]; then
  work=$(mktemp -d "$cache/work-$kind.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "building the $kind test image (kernel $kv) into $out" >&2
  "$here/$kind/build.sh" "$work/image.qcow2" "$work" "$kv" $flavour >&2
  chmod 0644 "$work/image.qcow2"
  mv "$work/image.qcow2" "$out"
  # Images of other inputs go once unused for a week (a run beside this
  # one may still read one).
  find "$cache" -maxdepth 1 -name "$kind-*.qcow2" ! -path "$out" -atime +7 -delete
fi
echo "$out"
