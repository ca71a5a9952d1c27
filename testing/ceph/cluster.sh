#!/usr/bin/env bash
# A one-monitor, one-OSD Ceph cluster (Debian's Ceph 16) on loopback, for
# tests: cephx authentication, an in-memory object store, a pool "rbd".
# CEPH_ADDR (default 127.0.0.1) is the address its daemons listen on: a
# harness NodeNet's host address lets nodes in their own network
# namespaces reach it.
#   cluster.sh start DIR   writes DIR/ceph.conf, DIR/keyring (client.admin), DIR/ready
#   cluster.sh stop DIR    stops the daemons (by their pid files) and removes DIR
# The monitor's ports are fixed (3300, 6789): one cluster at a time (the Go
# helper testing/cephcluster takes a lock).
set -euo pipefail
cmd=${1:?usage: cluster.sh start|stop DIR}
dir=${2:?usage: cluster.sh start|stop DIR}
export CEPH_CONF=$dir/ceph.conf
addr=${CEPH_ADDR:-127.0.0.1}
[[ $addr =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "CEPH_ADDR $addr: not an IPv4 address" >&2; exit 2; }

stop() {
  local p pid
  for p in "$dir"/run/osd.*.pid "$dir"/run/mon.*.pid; do
    [ -e "$p" ] || continue
    pid=$(cat "$p")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "${dir:?}"
}
if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "unknown command $cmd" >&2; exit 2; }

[ -e "$dir/run" ] && stop
mkdir -p "$dir"/{log,run,mon,osd}
fsid=$(cat /proc/sys/kernel/random/uuid)
cat > "$CEPH_CONF" <<CONF
[global]
fsid = $fsid
mon host = [v2:$addr:3300,v1:$addr:6789]
public addr = $addr
cluster addr = $addr
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $dir/keyring
run dir = $dir/run
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 1
mon data avail crit = 0
ms bind ipv6 = false
[mon.a]
mon data = $dir/mon
[osd]
keyring = $dir/osd/keyring
osd data = $dir/osd
osd objectstore = memstore
memstore device bytes = 1073741824
osd max object name len = 256
osd max object namespace len = 64
CONF
ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
monmaptool --create --fsid "$fsid" --addv a "[v2:$addr:3300,v1:$addr:6789]" "$dir/monmap" >/dev/null
ceph-mon -i a --mkfs --monmap "$dir/monmap" --keyring "$dir/keyring"
ceph-mon -i a
timeout 60 sh -c "until ceph -s >/dev/null 2>&1; do sleep 0.3; done"
uuid=$(cat /proc/sys/kernel/random/uuid)
id=$(ceph osd new "$uuid")
ceph-osd -i "$id" --mkfs --mkkey --no-mon-config --osd-uuid "$uuid" >/dev/null 2>&1
ceph auth add "osd.$id" osd 'allow *' mon 'allow profile osd' -i "$dir/osd/keyring" >/dev/null
ceph-osd -i "$id"
timeout 120 sh -c "until ceph osd stat 2>/dev/null | grep -q '1 up'; do sleep 0.3; done"
ceph osd pool create rbd 8 8 >/dev/null 2>&1
ceph osd pool application enable rbd rbd >/dev/null 2>&1
timeout 120 rbd pool init rbd
touch "$dir/ready"
