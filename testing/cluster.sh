#!/bin/bash
# make cluster-up / cluster-down: the test cluster of issue 28 (three
# Virtlet nodes on this machine, testing/clusterup) for a person to try.
#   testing/cluster.sh up     start it (or show the one running) and print
#                             its KUBECONFIG
#   testing/cluster.sh down   stop it and remove everything it made
# Its state (run id, pid, log) is in $CLUSTER_STATE (/tmp/virtlet-cluster);
# $CLUSTER_NODES (3) Virtlet nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
state=${CLUSTER_STATE:-/tmp/virtlet-cluster}

running() { [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; }

show() {
  echo "the cluster is up (run $(cat "$state/run"); log $state/log):"
  echo "  export KUBECONFIG=$(cat "$state/kubeconfig.path") PATH=$(testing/k8s/build.sh 2>/dev/null):\$PATH"
  echo "  kubectl get nodes -o wide"
  echo "  kubectl apply -f examples/cluster-vms.yaml   # a VM pod on each node"
  echo "make cluster-down stops it."
}

case "${1:-}" in
up)
  if running; then show; exit 0; fi
  rm -rf "$state"
  mkdir -p "$state"
  VIRTLET_RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
  TMPDIR=/tmp/vt-$VIRTLET_RUN
  export VIRTLET_RUN TMPDIR
  mkdir -p -m 0711 "$TMPDIR"
  echo "$VIRTLET_RUN" >"$state/run"
  go build -o "$TMPDIR/virtlet-cluster-up" ./testing/clusterup
  setsid nohup "$TMPDIR/virtlet-cluster-up" -nodes "${CLUSTER_NODES:-3}" -ready "$state/kubeconfig.path" >"$state/log" 2>&1 </dev/null &
  echo $! >"$state/pid"
  echo "starting the cluster (run $VIRTLET_RUN; log $state/log)…"
  for _ in $(seq 1200); do
    [ -s "$state/kubeconfig.path" ] && { show; exit 0; }
    running || { echo "the cluster did not come up:"; tail -n 40 "$state/log"; exit 1; }
    sleep 0.5
  done
  echo "the cluster is not up after 10 minutes; make cluster-down stops it"
  exit 1
  ;;
down)
  if running; then
    pid=$(cat "$state/pid")
    kill -TERM "$pid"
    for _ in $(seq 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "the cluster did not stop in 2 minutes; killing it (hostcheck begin removes what it left)"
      kill -KILL "$pid"
    fi
    tail -n 5 "$state/log"
  fi
  [ -f "$state/run" ] && rm -rf "/tmp/vt-$(cat "$state/run")"
  rm -rf "$state"
  echo "the cluster is down"
  ;;
*)
  echo "usage: $0 up|down" >&2
  exit 2
  ;;
esac
