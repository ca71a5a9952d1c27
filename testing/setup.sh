#!/usr/bin/env bash
# Installs everything building and testing Virtlet needs on Debian 12,
# idempotently: Debian packages (only the missing ones, so a ready machine
# needs no network) and the Go test tools at pinned versions. A package
# given as NAME=VERSION is pinned: installed at that version (Debian 12's),
# and installed again when the machine has another.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  pkg-config gcc libc6-dev protobuf-compiler          # build
  librados-dev librbd-dev                             # the ceph volume plugin (go-ceph, Ceph 16)
  qemu-system-x86 qemu-utils libvirt-daemon-system    # real VMs
  ovmf                                                # UEFI firmware (VirtletFirmware uefi, Secure Boot)
  libvirt-clients libvirt-dev
  syslinux syslinux-common mtools dosfstools fdisk     # test guest images
  kmod cpio busybox-static debootstrap e2fsprogs
  linux-source-6.1 make flex bison bc libelf-dev lz4   # the test guests' kernels (testing/images/kernel/build.sh)
  docker-registry curl                                 # registry pulls, benchmarks
  cloud-init                                           # `cloud-init schema` checks generated user-data
  containernetworking-plugins iptables iproute2        # pod networks (CNI bridge + host-local) in test namespaces
  iputils-ping openssh-client                          # reach VM pods from the host in the network e2e
  qemu-block-extra                                    # QEMU's rbd driver (Ceph volumes)
  ceph-mon ceph-osd ceph-common                       # a real one-OSD Ceph cluster for the ceph volume tests
  etcd-server                                          # the API server of the kubelet-driven e2e (virtletctl)
  libseccomp-dev                                      # runc 1.3 for the tests' containerd 2.2 (testing/tools/build.sh)
  nftables                                             # kube-proxy (nftables mode) in the kubelet-driven e2e
  acl xfsprogs                                         # getfacl in the ACL tests; an xfs root FilesFromDataSource refuses
  socat                                                # dials a VM's guest agent socket as another VM's user in the security e2e
  novnc=1:1.3.0-1 chromium                             # virtletctl vnc --web serves noVNC; the e2e opens it in headless Chromium
  tesseract-ocr=5.3.0-2 tesseract-ocr-eng=1:4.1.0-2    # and reads the guest's console in the page's screenshot (OCR)
)
missing=()
for p in "${PKGS[@]}"; do
  have=$(dpkg-query -W -f='${Status} ${Version}' "${p%%=*}" 2>/dev/null || true)
  case "$have" in
    "install ok installed "*) [ "$p" = "${p%%=*}" ] || [ "${have##* }" = "${p#*=}" ] || missing+=("$p") ;;
    *) missing+=("$p") ;;
  esac
done
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
# cloud-init is installed for its schema validator only: keep it from ever
# configuring this host (it honours this file at every boot).
[ -e /etc/cloud/cloud-init.disabled ] || { $SUDO mkdir -p /etc/cloud && $SUDO touch /etc/cloud/cloud-init.disabled; }
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --allow-downgrades "${missing[@]}"
fi
command -v go >/dev/null || { echo "setup: Go is not installed (want go 1.26 at /usr/local/go)" >&2; exit 1; }
testing/tools/build.sh
# hugetlbfs where systemd mounts it (dev-hugepages.mount) on an ordinary
# node: libvirt finds it when libvirtd starts, for hugepage-backed VMs.
if ! mountpoint -q /dev/hugepages; then
  $SUDO mkdir -p /dev/hugepages && $SUDO mount -t hugetlbfs hugetlbfs /dev/hugepages
fi
