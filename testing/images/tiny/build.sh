#!/usr/bin/env bash
# Builds the tiny test guest: a whole-disk image (MBR, FAT16 boot partition,
# a busybox initramfs running ./init), from Debian packages only and without
# loop devices or mounts. BIOS boots it by syslinux with its own kernel
# (../kernel: every driver built in, nothing to load), or with Debian's
# when the fourth argument is debian; UEFI boots it through Debian's
# signed shim, GRUB and kernel (Secure Boot too). Debian's kernel loads the
# initramfs plus a second one holding its modules.
#   build.sh OUT.qcow2 WORKDIR KERNEL_VERSION [own|debian]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1 work=$2 kv=$3 flavour=${4:-own}
mkdir -p "$work/debs"
kpkg=$work/kpkg
if [ ! -f "$kpkg/lib/modules/$kv/modules.dep" ]; then
  rm -rf "$kpkg"; mkdir -p "$kpkg"
  (cd "$work/debs" && ls linux-image-${kv}_*.deb >/dev/null 2>&1 || apt-get download -q "linux-image-$kv")
  dpkg-deb -x "$work"/debs/linux-image-${kv}_*.deb "$kpkg"
  depmod -b "$kpkg" "$kv"
fi
MODS="virtio_pci virtio_blk virtio_scsi virtio_net virtio_console sd_mod sr_mod ata_piix ahci isofs vfat nls_cp437 nls_ascii nls_utf8 9p 9pnet_virtio evdev button i6300esb virtio-rng virtio_balloon"
root=$work/initramfs mods=$work/modules
rm -rf "$root" "$mods"; mkdir -p "$root"/{bin,proc,sys,dev,ci,mnt} "$mods/lib/modules/$kv/kernel"
cp /bin/busybox "$root/bin/busybox"
cp "$here/init" "$root/init"; chmod 755 "$root/init"
cp "$here/pgrep" "$root/bin/pgrep"; chmod 755 "$root/bin/pgrep"
# bundle PACKAGE PROGRAM [LIBRARY-PACKAGE...]: a program of a Debian
# package, with the libraries it links, into the initramfs's /bin: this
# host's (the same Debian release), or those of the library packages.
bundle() {
  local pkg=$1 prog=$2 x=$work/pkg-$1 p lib
  shift 2
  rm -rf "$x"; mkdir -p "$x"
  for p in "$pkg" "$@"; do
    (cd "$work/debs" && ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download -q "$p")
    dpkg-deb -x "$(ls "$work"/debs/"${p}"_*.deb | tail -1)" "$x"
  done
  cp "$x$prog" "$root/bin/$(basename "$prog")"
  local libs="$x/usr/lib/x86_64-linux-gnu:$x/lib/x86_64-linux-gnu"
  if LD_LIBRARY_PATH=$libs ldd "$x$prog" | grep -q "not found"; then
    echo "$prog needs libraries this host lacks:" >&2; LD_LIBRARY_PATH=$libs ldd "$x$prog" >&2; exit 1
  fi
  for lib in $(LD_LIBRARY_PATH=$libs ldd "$x$prog" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    p=${lib#"$x"}
    mkdir -p "$root$(dirname "$p")"; cp -L "$lib" "$root$p"
  done
}
# The guest agent (exec reaches this guest too) and an SSH server
# (virtletctl ssh: dropbear, root's keys from the pod's VirtletSSHKeys).
bundle qemu-guest-agent /usr/sbin/qemu-ga
bundle dropbear-bin /usr/sbin/dropbear libtomcrypt1 libtommath1
mkdir -p "$root/etc"
echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
echo "/bin/sh" > "$root/etc/shells"
# Debian's kernel's modules, in the order they load, for the UEFI path.
: > "$mods/modules.list"
for m in $MODS; do modprobe -d "$kpkg" -S "$kv" --show-depends "$m" | awk '$1=="insmod"{print $2}'; done | awk '!seen[$0]++' |
while read -r p; do
  rel=${p#$kpkg/lib/modules/$kv/kernel/}
  mkdir -p "$mods/lib/modules/$kv/kernel/$(dirname "$rel")"
  cp "$p" "$mods/lib/modules/$kv/kernel/$rel"
  echo "$rel" >> "$mods/modules.list"
done
# gzip, not lz4: the kernel unpacks lz4 sooner (about 1.4 s under TCG)
# but runs out of memory doing it in a 96 MiB guest.
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -9) > "$work/initrd.img"
(cd "$mods" && find . | cpio -o -H newc --quiet | gzip -9) > "$work/modules.img"
# What syslinux (BIOS) boots.
if [ "$flavour" = own ]; then
  own_kernel=$("$here/../kernel/build.sh" guest) bios_kernel=/tinylinux bios_initrd=/initrd.img
else
  own_kernel= bios_kernel=/vmlinuz bios_initrd=/initrd.img,/modules.img
fi

SIZE_MB=32 PSTART=2048
# The kernel command line of both boot paths. cryptomgr.notests skips the
# kernel's self-tests of its crypto algorithms, which run at every boot.
# no_timer_check skips the IO-APIC timer's check, as a KVM guest's kernel
# does by itself: a TCG guest starved of CPU (make check's suites side by
# side, a hundred VMs on 2 cores) misses the ticks it counts and hangs or
# panics ("MP-BIOS bug: 8254 timer not connected to IO-APIC").
cmdline="console=ttyS0,115200 panic=-1 quiet loglevel=4 cryptomgr.notests no_timer_check"
rm -f "$work/part.img" "$work/disk.raw"
truncate -s $((SIZE_MB - 1))M "$work/part.img"
mkfs.vfat -F 16 -n TINYBOOT -h $PSTART "$work/part.img" >/dev/null
cat > "$work/syslinux.cfg" <<CFG
SERIAL 0 115200
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL $bios_kernel
  INITRD $bios_initrd
  APPEND $cmdline
CFG
[ -z "$own_kernel" ] || mcopy -i "$work/part.img" "$own_kernel" ::/tinylinux
mcopy -i "$work/part.img" "$kpkg/boot/vmlinuz-$kv" ::/vmlinuz
mcopy -i "$work/part.img" "$work/initrd.img" ::/initrd.img
mcopy -i "$work/part.img" "$work/modules.img" ::/modules.img
mcopy -i "$work/part.img" "$work/syslinux.cfg" ::/syslinux.cfg
syslinux --install "$work/part.img"
# UEFI boots the same partition (Secure Boot too) with Debian's kernel.
"$here/../uefi-boot.sh" "$work/part.img" "$work" /vmlinuz "/initrd.img /modules.img" "$cmdline"
truncate -s ${SIZE_MB}M "$work/disk.raw"
echo "start=$PSTART, type=e, bootable" | sfdisk -q "$work/disk.raw"
dd if="$work/part.img" of="$work/disk.raw" bs=512 seek=$PSTART conv=notrunc status=none
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$work/disk.raw" bs=440 count=1 conv=notrunc status=none
qemu-img convert -c -O qcow2 "$work/disk.raw" "$out.tmp"
mv "$out.tmp" "$out"
rm -f "$work/part.img" "$work/disk.raw"
