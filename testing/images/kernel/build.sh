#!/usr/bin/env bash
# Builds the tiny guest's kernel from Debian's linux-source package
# (tinyconfig plus kernel.config) and prints the path of its bzImage. The
# kernel is cached in the machine's build cache by a hash of this script,
# kernel.config and the source package's version, apart from the image (an
# image change does not rebuild it); a build works in a directory of its
# own and renames its result into place.
#   kernel.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../cache.sh"
pkg=linux-source-6.1
ver=$(dpkg-query -W -f '${Version}' "$pkg" 2>/dev/null || true)
[ -n "$ver" ] || { echo "$pkg is not installed (testing/setup.sh installs it)" >&2; exit 1; }
cache=$cache_root/kernels
mkdir -p "$cache"
key=$( (echo "$pkg $ver"; cat "$here/kernel.sh" "$here/kernel.config") | sha256sum | cut -c1-16)
out=$cache/tiny-$key.bzImage
if [ ! -f "$out" ]; then
  work=$(mktemp -d "$cache/work.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "building the tiny guest's kernel ($pkg $ver) into $out" >&2
  tar -xf "/usr/src/$pkg.tar.xz" -C "$work"
  src=$work/$pkg
  make -s -C "$src" ARCH=x86_64 tinyconfig >/dev/null
  "$src/scripts/kconfig/merge_config.sh" -m -O "$src" "$src/.config" "$here/kernel.config" >/dev/null
  make -s -C "$src" ARCH=x86_64 olddefconfig >/dev/null
  # Kconfig drops an option whose dependencies are unmet without a word.
  missing=$(grep '^CONFIG_' "$here/kernel.config" | while read -r line; do
    grep -qxF "$line" "$src/.config" || echo "$line"; done)
  if [ -n "$missing" ]; then
    echo "kernel.config asks for options the kernel's configuration does not have:" >&2
    echo "$missing" >&2
    exit 1
  fi
  make -s -C "$src" ARCH=x86_64 -j"$(nproc)" bzImage >&2
  cp "$src/arch/x86/boot/bzImage" "$work/bzImage"
  mv "$work/bzImage" "$out"
  find "$cache" -maxdepth 1 -name "tiny-*.bzImage" ! -path "$out" -atime +7 -delete
fi
echo "$out"
