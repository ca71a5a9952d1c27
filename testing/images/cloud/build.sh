#!/usr/bin/env bash
# Builds the cloud test guest: Debian bookworm with real cloud-init,
# openssh-server, qemu-guest-agent and a serial getty; from Debian packages
# only (debootstrap), without loop devices or mounts. BIOS boots it by
# syslinux with its own kernel (../kernel: guest.config and systemd.config,
# every driver built in, so no initramfs); UEFI boots it through Debian's
# signed shim, GRUB and kernel (whatever linux-image-amd64 is in the
# bookworm mirror) with its initramfs (Secure Boot too).
#   build.sh OUT.qcow2 WORKDIR
set -euo pipefail
out=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
mirror=${MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)}
mirror=${mirror:-http://deb.debian.org/debian}
root=$work/rootfs
mkdir -p "$work/debcache"
rm -rf "$root"
# debootstrap does not resolve virtual packages: python3-cffi-backend must be named.
debootstrap --variant=minbase --cache-dir="$work/debcache" \
  --include=systemd-sysv,udev,dbus,linux-image-amd64,initramfs-tools,cloud-init,python3-cffi-backend,openssh-server,ifupdown,isc-dhcp-client,iproute2,netbase,sudo,qemu-guest-agent,iputils-ping \
  bookworm "$root" "$mirror" >&2

kv=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1 | sed 's|.*/vmlinuz-||')
echo "cloud image kernel: $kv" >&2

# Customise for tests.
# No fsck of the root at boot (pass 0): each VM's root is a fresh overlay
# of this image, and the check sat on the boot's critical path (3.5 s of
# TCG).
echo 'LABEL=root  /  ext4  defaults,noatime,errors=remount-ro  0 0' > "$root/etc/fstab"
echo debian-cloud > "$root/etc/hostname"
echo LANG=C.UTF-8 > "$root/etc/default/locale"
printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"
: > "$root/etc/machine-id"        # a fresh machine-id per VM
rm -f "$root/var/lib/dbus/machine-id"
ln -sf /dev/null "$root/etc/systemd/system/systemd-firstboot.service"   # would prompt on the console
# systemd loads configfs, dm_mod, drm, efi_pstore, fuse and loop at every
# boot; no test uses them, and the BIOS path's kernel has no modules.
ln -sf /dev/null "$root/etc/systemd/system/modprobe@.service"
for t in apt-daily apt-daily-upgrade dpkg-db-backup e2scrub_all fstrim; do rm -f "$root/etc/systemd/system/timers.target.wants/$t.timer"; done
rm -f "$root"/etc/systemd/system/*/e2scrub_reap.service "$root"/etc/ssh/ssh_host_*
cat > "$root/etc/cloud/cloud.cfg.d/90-test-image.cfg" <<CFG
datasource_list: [ NoCloud, ConfigDrive, None ]
ssh_genkeytypes: [ ed25519 ]
locale: C.UTF-8
CFG
# Debian's module lists without the modules for package managers, config
# management agents and cloud vendors that no test asks for: each costs
# seconds of TCG (grub-dpkg 1.7 s, apt-configure 0.6 s). Every module of
# what Virtlet generates or a seed's user-data names stays.
cat > "$root/etc/cloud/cloud.cfg.d/91-test-image-modules.cfg" <<CFG
cloud_init_modules: [migrator, seed_random, bootcmd, write-files, growpart, resizefs, disk_setup, mounts,
  set_hostname, update_hostname, update_etc_hosts, users-groups, ssh]
cloud_config_modules: [locale, set-passwords, timezone, runcmd]
cloud_final_modules: [write-files-deferred, scripts-vendor, scripts-per-once, scripts-per-boot,
  scripts-per-instance, scripts-user, ssh-authkey-fingerprints, keys-to-console, final-message, power-state-change]
CFG
echo 'root:*' | chroot "$root" chpasswd -e
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
printf '%s\n' virtio_pci virtio_blk virtio_scsi sd_mod sr_mod ata_piix ahci ext4 > "$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all >&2
rm -rf "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*_* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
find "$root/var/log" -type f -exec truncate -s0 {} +

# Assemble the disk: MBR (syslinux) + FAT16 /boot (with the UEFI chain) +
# ext4 root (mkfs.ext4 -d).
boot_mb=64 pstart=2048
root_mb=$(( $(du -sm "$root" | cut -f1) * 13 / 10 + 200 ))
mkfs.ext4 -q -F -L root -d "$root" -E root_owner=0:0 "$work/root.img" ${root_mb}M
rm -f "$work/boot.img"; truncate -s ${boot_mb}M "$work/boot.img"
mkfs.vfat -F 16 -n BOOT -h $pstart "$work/boot.img" >/dev/null
# The BIOS path names the root by the partition table's id (the kernel
# alone cannot find a file system by its label): every copy of this image,
# on any bus, has it. Under TCG systemd starts 5 s after QEMU instead of
# 24 s (Debian's xz image, initramfs and modules), and cloud-init is done
# at 80 s instead of 115 s (fewer devices for udev, see ../kernel).
disk_id=7e57c10d
own_kernel=$("$here/../kernel/build.sh" guest systemd)
cat > "$work/syslinux.cfg" <<CFG
SERIAL 0 115200
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL /cloudlinux
  APPEND root=PARTUUID=$disk_id-02 rootwait ro console=ttyS0,115200 net.ifnames=0 cryptomgr.notests
CFG
mcopy -i "$work/boot.img" "$own_kernel" ::/cloudlinux
mcopy -i "$work/boot.img" "$root/boot/vmlinuz-$kv" ::/vmlinuz
mcopy -i "$work/boot.img" "$root/boot/initrd.img-$kv" ::/initrd.img
mcopy -i "$work/boot.img" "$work/syslinux.cfg" ::/syslinux.cfg
syslinux --install "$work/boot.img"
# UEFI boots the same partition (Secure Boot too).
"$here/../uefi-boot.sh" "$work/boot.img" "$work" /vmlinuz /initrd.img "root=LABEL=root ro console=ttyS0,115200 net.ifnames=0"
p2start=$(( pstart + boot_mb * 2048 ))
rm -f "$work/disk.raw"; truncate -s $(( 1 + boot_mb + root_mb + 1 ))M "$work/disk.raw"
sfdisk -q "$work/disk.raw" <<PT
label: dos
label-id: 0x$disk_id
start=$pstart, size=$((boot_mb * 2048)), type=e, bootable
start=$p2start, size=$((root_mb * 2048)), type=83
PT
dd if="$work/boot.img" of="$work/disk.raw" bs=1M seek=1 conv=notrunc,sparse status=none
dd if="$work/root.img" of="$work/disk.raw" bs=1M seek=$((1 + boot_mb)) conv=notrunc,sparse status=none
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$work/disk.raw" bs=440 count=1 conv=notrunc status=none
qemu-img convert -c -W -m 4 -O qcow2 -o compression_type=zstd "$work/disk.raw" "$out.tmp"
mv "$out.tmp" "$out"
rm -rf "$work/root.img" "$work/boot.img" "$work/disk.raw" "$root"
