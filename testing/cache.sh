# Sourced by the build scripts of the test tools, guest images and
# Kubernetes binaries: sets $cache_root, the directory where they keep what
# they build, by a hash of its inputs, for every checkout of the project on
# this machine (CI's fresh clone reuses what an earlier run built, as Go's
# own build cache does). VIRTLET_CACHE overrides it. As root it is under
# /var/cache, traversable, since libvirt's QEMU user reads the guest images
# (test images, no secret) in the benchmarks; otherwise under the user's
# cache directory.
if [ -n "${VIRTLET_CACHE:-}" ]; then
  cache_root=$VIRTLET_CACHE
elif [ "$(id -u)" = 0 ]; then
  cache_root=/var/cache/virtlet-build
else
  cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/virtlet-build
fi
mkdir -p "$cache_root"
