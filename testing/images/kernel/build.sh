#!/usr/bin/env bash
# Builds a test guest's own kernel from Debian's linux-source package:
# `make tinyconfig` plus the named configuration fragments of this
# directory (guest.config: what every test guest's devices need, built in;
# systemd.config: what a systemd userland needs on top), and prints the
# path of its bzImage. The kernel is cached in the machine's build cache by
# a hash of this script, the fragments and the source package's version,
# apart from the images (an image change does not rebuild it); a build
# works in a directory of its own and renames its result into place.
#   build.sh FRAGMENT...        (build.sh guest; build.sh guest systemd)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -gt 0 ] || { echo "usage: build.sh FRAGMENT... (fragments: $(cd "$here" && ls *.config | sed 's/\.config$//' | xargs))" >&2; exit 1; }
fragments=()
for f in "$@"; do
  [ -f "$here/$f.config" ] || { echo "no kernel configuration fragment $f ($here/$f.config)" >&2; exit 1; }
  fragments+=("$here/$f.config")
done
. "$here/../../cache.sh"
pkg=linux-source-6.1
ver=$(dpkg-query -W -f '${Version}' "$pkg" 2>/dev/null || true)
[ -n "$ver" ] || { echo "$pkg is not installed (testing/setup.sh installs it)" >&2; exit 1; }
cache=$cache_root/kernels
mkdir -p "$cache"
name=$(IFS=-; echo "$*")
key=$( (echo "$pkg $ver $name"; cat "$here/build.sh" "${fragments[@]}") | sha256sum | cut -c1-16)
out=$cache/$name-$key.bzImage
if [ ! -f "$out" ]; then
  work=$(mktemp -d "$cache/work.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "building the test guests' kernel $name ($pkg $ver) into $out" >&2
  tar -xf "/usr/src/$pkg.tar.xz" -C "$work"
  src=$work/$pkg
  make -s -C "$src" ARCH=x86_64 tinyconfig >/dev/null
  "$src/scripts/kconfig/merge_config.sh" -m -O "$src" "$src/.config" "${fragments[@]}" >/dev/null
  make -s -C "$src" ARCH=x86_64 olddefconfig >/dev/null
  # Kconfig drops an option whose dependencies are unmet without a word,
  # and turns one on that another selects.
  missing=$(cat "${fragments[@]}" | grep -E '^(CONFIG_|# CONFIG_.* is not set$)' | while read -r line; do
    case $line in
      CONFIG_*) grep -qxF "$line" "$src/.config" || echo "$line";;
      *) opt=${line#\# }; opt=${opt% is not set}; grep -q "^$opt=" "$src/.config" && grep "^$opt=" "$src/.config";;
    esac; done || true)
  if [ -n "$missing" ]; then
    echo "the kernel's configuration is not what the fragments $* ask (option as built, or as asked):" >&2
    echo "$missing" >&2
    exit 1
  fi
  make -s -C "$src" ARCH=x86_64 -j"$(nproc)" bzImage >&2
  cp "$src/arch/x86/boot/bzImage" "$work/bzImage"
  mv "$work/bzImage" "$out"
  find "$cache" -maxdepth 1 -name "$name-*.bzImage" ! -path "$out" -atime +7 -delete
fi
echo "$out"
