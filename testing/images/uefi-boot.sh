#!/usr/bin/env bash
# Makes a FAT boot partition image UEFI-bootable through Debian's signed
# chain, as a Secure Boot machine with Microsoft's keys accepts it: shim
# (signed by Microsoft's UEFI CA) at the removable-media path, then Debian's
# signed GRUB, which reads the grub.cfg next to itself and boots Debian's
# signed kernel from the partition.
#   uefi-boot.sh PART.IMG WORKDIR KERNEL INITRD CMDLINE
# KERNEL and INITRD are paths inside the partition (/vmlinuz); INITRD may
# name several, separated by spaces (GRUB loads them one after another).
set -euo pipefail
part=$1 work=$2 kernel=$3 initrd=$4 cmdline=$5
mkdir -p "$work/debs"
for pkg in shim-signed grub-efi-amd64-signed; do
  (cd "$work/debs" && ls ${pkg}_*.deb >/dev/null 2>&1 || apt-get download -q "$pkg")
done
efi=$work/efi; rm -rf "$efi"; mkdir -p "$efi"
dpkg-deb -x "$(ls "$work"/debs/shim-signed_*.deb | tail -1)" "$efi"
dpkg-deb -x "$(ls "$work"/debs/grub-efi-amd64-signed_*.deb | tail -1)" "$efi"
cat > "$efi/grub.cfg" <<CFG
serial --unit=0 --speed=115200
terminal_input serial
terminal_output serial
set timeout=0
menuentry linux {
  linux $kernel $cmdline
  initrd $initrd
}
CFG
mmd -i "$part" ::/EFI ::/EFI/BOOT
mcopy -i "$part" "$efi/usr/lib/shim/shimx64.efi.signed" ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$part" "$efi/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed" ::/EFI/BOOT/grubx64.efi
mcopy -i "$part" "$efi/grub.cfg" ::/EFI/BOOT/grub.cfg
rm -rf "$efi"
