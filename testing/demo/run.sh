#!/usr/bin/env bash
# The main job (`make demo`): the daemon up with its default plugins, a VM
# pod booted through the CRI API with crictl on a CNI pod network, its
# serial console shown, the VM reached at the pod's IP.
# Ctrl-C stops the VM, the pod and the daemon cleanly. With
# VIRTLET_DEMO_ONCE=1 (or without a terminal) it stops by itself once the
# guest is up.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
bin=$repo/bin
crictl_bin=$bin/tools/crictl

say() { printf '\033[1;34m==> %s\033[0m\n' "$*" >&2; }

# libvirtd and virtlogd (no systemd on these machines).
for d in virtlogd libvirtd; do
  pgrep -x $d >/dev/null || { say "starting $d"; $d -d; }
done
for i in $(seq 1 100); do virsh -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; done

# With Debian's kernel: the tiny guest's own boots ≈ 10 s sooner under
# TCG but takes ≈ 10 minutes to build, once; the demo boots one guest.
say "building the tiny guest image (cached)"
image=$(VIRTLET_TINY_KERNEL=debian testing/images/build.sh tiny)
go build -o "$bin/virtlet-test-imageserver" ./testing/imageserver/cmd/virtlet-test-imageserver

work=$(mktemp -d /tmp/virtlet-demo.XXXXXX)
chmod 711 "$work"   # QEMU, running as its own user, reaches the disks below
mkdir -p "$work/www" "$work/images.d"
cp "$image" "$work/www/tiny.qcow2"
sock=$work/virtlet.sock
crictl() { "$crictl_bin" --config /dev/null -r "unix://$sock" -i "unix://$sock" --timeout 3m "$@"; }

pids=()
demo_bridge=virtlet-demo0
fw_rules=()
cleanup() {
  trap - INT TERM EXIT
  say "stopping"
  if [ -n "${ctr:-}" ]; then crictl stop --timeout 20 "$ctr" >/dev/null 2>&1 || true; fi
  if [ -n "${sb:-}" ]; then crictl rmp -f "$sb" >/dev/null 2>&1 || true; fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip link del "$demo_bridge" 2>/dev/null || true
  for r in "${fw_rules[@]}"; do iptables -D FORWARD $r 2>/dev/null || true; done
  # The ninep volume plugin keeps its shares below a private mount of its own.
  for m in $(awk -v w="$work/" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r); do umount -l "$m" || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "serving the image over HTTPS on loopback (a test CA)"
"$bin/virtlet-test-imageserver" --dir "$work/www" --ca-dir "$work" > "$work/imageserver.addr" &
pids+=($!)
for i in $(seq 1 50); do [ -s "$work/imageserver.addr" ] && break; sleep 0.1; done
host=$(cat "$work/imageserver.addr")
{
  echo "translations:"
  echo "- name: tiny"
  echo "  url: https://$host/tiny.qcow2"
  echo "  transport: demo"
  echo "transports:"
  echo "  demo:"
  echo "    tls:"
  echo "      certificates:"
  echo "      - cert: |"
  sed 's/^/          /' "$work/image-server-ca.pem"
} > "$work/images.d/demo.yaml"

# The pod network: Debian's CNI bridge + host-local plugins on a bridge of
# the demo's own, 198.19.0.0/24, never routed off this machine.
for r in "-i $demo_bridge ! -o $demo_bridge -j DROP" "-o $demo_bridge ! -i $demo_bridge -j DROP"; do
  iptables -I FORWARD $r; fw_rules+=("$r")
done
mkdir -p "$work/cni"
cat > "$work/cni/10-demo.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "virtlet-demo", "plugins": [{
  "type": "bridge", "bridge": "$demo_bridge", "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "dataDir": "$work/cni/ipam", "ranges": [[{"subnet": "198.19.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
JSON
# The shipped plugins, as the embedded defaults name them, with the demo's
# CNI config: what an operator writes into /etc/virtlet/plugins.d.
mkdir -p "$work/plugins.d"
for f in plugins/manifest/defaults/*.yaml; do
  name=$(sed -n 's/^name: *//p' "$f"); cmd=$(sed -n 's/^command: *//p' "$f")
  {
    grep -v '^command:' "$f"
    echo "command: $bin/$cmd"
    echo "sha256: $(sha256sum "$bin/$cmd" | cut -d' ' -f1)"
    if [ "$name" = cni ]; then echo "config: {confDir: $work/cni, binDirs: [/usr/lib/cni, /opt/cni/bin]}"; fi
  } > "$work/plugins.d/$(basename "$f")"
done

say "starting virtlet (log: $work/virtlet.log)"
"$bin/virtlet" --listen "unix://$sock" --admin-socket "$work/admin.sock" --state-dir "$work/state" --plugins-dir "$work/plugins.d" \
  --image-translations-dir "$work/images.d" > "$work/virtlet.log" 2>&1 &
pids+=($!)
for i in $(seq 1 1200); do [ -S "$sock" ] && crictl version >/dev/null 2>&1 && break; sleep 0.1; done
crictl version
# The runtime is ready once its records are reconciled with the
# hypervisor (a loaded machine takes a few seconds): its info names the
# hypervisor from then on.
ready=
for i in $(seq 1 600); do crictl info 2>/dev/null | python3 -c 'import json,sys; sys.exit(json.load(sys.stdin).get("hypervisor") is None)' && { ready=1; break; }; sleep 0.2; done
if [ -z "$ready" ]; then
  echo "virtlet did not report its hypervisor within 2 minutes; crictl info and its log say:" >&2
  crictl info >&2 || true
  tail -n 40 "$work/virtlet.log" >&2
  exit 1
fi
crictl info | python3 -c 'import json,sys; h=json.load(sys.stdin).get("hypervisor") or {}; print("hypervisor:", h.get("Version"), "accelerator:", h.get("Accelerator"), "-", (h.get("Details") or {}).get("accelerator", "(no details)"))'

cat > "$work/pod.json" <<JSON
{
  "metadata": {"name": "cirros-vm", "namespace": "default", "uid": "demo-$(date +%s)"},
  "annotations": {
    "kubernetes.io/target-runtime": "virtlet.cloud",
    "VirtletVCPUCount": "1",
    "VirtletDiskDriver": "virtio",
    "VirtletRootVolumeSize": "1Gi"
  },
  "log_directory": "$work/pods/default_cirros-vm"
}
JSON
cat > "$work/container.json" <<JSON
{
  "metadata": {"name": "cirros-vm"},
  "image": {"image": "virtlet.cloud/tiny"},
  "log_path": "cirros-vm/0.log",
  "linux": {"resources": {"memory_limit_in_bytes": 167772160}},
  "tty": true, "stdin": true
}
JSON

say "crictl pull virtlet.cloud/tiny"
crictl pull virtlet.cloud/tiny
say "crictl runp / create / start"
sb=$(crictl runp "$work/pod.json")
ctr=$(crictl create "$sb" "$work/container.json" "$work/pod.json")
crictl start "$ctr"
crictl ps

say "the VM's serial console (crictl logs -f):"
"$crictl_bin" --config /dev/null -r "unix://$sock" -i "unix://$sock" logs -f "$ctr" &
follow=$!
pids+=($follow)
for i in $(seq 1 600); do
  crictl logs "$ctr" 2>/dev/null | grep -q "@@TINY-READY" && break
  sleep 0.5
done
crictl logs "$ctr" | grep -q "@@TINY-READY" || { say "the guest did not come up; see $work/virtlet.log"; exit 1; }
sleep 0.5
say "the VM pod is up: $(crictl inspect -o go-template --template '{{.status.state}}' "$ctr" 2>/dev/null || echo running)"
ip=$(crictl inspectp -o go-template --template '{{.status.network.ip}}' "$sb")
say "the pod's IP (crictl inspectp): $ip; the VM took it by DHCP: $(crictl logs "$ctr" | grep -o '@@DHCP-BOUND.*' | head -1)"
say "ping $ip from the host:"
ping -c 2 -W 3 "$ip"
if [ "${VIRTLET_DEMO_ONCE:-}" = 1 ] || [ ! -t 0 ]; then
  exit 0
fi
say "following the console; Ctrl-C stops the VM, the pod and the daemon"
wait $follow
