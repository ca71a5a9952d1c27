#!/usr/bin/env bash
# make check: every suite CI runs, each phase timed. A failed phase does
# not stop the ones after it (their figures and failures are worth as
# much), but fails the check. It ends with a table of each phase's wall
# time and the slowest tests (testing/checkreport), and the total.
#   testing/check.sh [PHASE...]     (default: all, in order)
set -uo pipefail
cd "$(dirname "$0")/.."

# One check at a time on a machine: a second waits for the first. Each
# run has an id, which every name it makes on the host carries (its
# TMPDIR, below which are all its tests' directories; its bridges): the
# first phase removes what earlier runs left by that tag, the last fails
# if this one left anything (testing/hostcheck).
exec 9>/run/virtlet-check.lock
if ! flock -n 9; then
  echo "make check: waiting for the check already running on this machine"
  flock 9
fi
VIRTLET_RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
TMPDIR=/tmp/vt-$VIRTLET_RUN
export VIRTLET_RUN TMPDIR
mkdir -p -m 0711 "$TMPDIR"
echo "make check: run $VIRTLET_RUN (TMPDIR $TMPDIR)"
# Only once the lock is held: a check waiting for another must not empty
# its directory.
export CHECK_DIR=${CHECK_DIR:-$PWD/.cache/check}
rm -rf "$CHECK_DIR" && mkdir -p "$CHECK_DIR"

# e2e-all: make e2e, e2e-k8s and critest in one run. The go test timeouts
# of the phases add up to 80 minutes (unit 5, integration 5, e2e-all 55,
# bench-smoke 15): each is over twice the phase's longest test binary on
# an ordinary day (unit 38 s, integration 113 s, e2e-all ≈ 28 min,
# bench-smoke ≈ 4 min), and e2e-all's and bench-smoke's leave room for a
# day when this nested machine runs TCG guests at half speed (e2e-all
# passed 50 minutes and bench-smoke 10 on 2026-11-28).
all=(setup images k8s lint unit integration e2e-all bench-smoke host)
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=("${all[@]}")

run_phase() {
  case $1 in
  setup) testing/setup.sh && go run ./testing/hostcheck begin "$VIRTLET_RUN" "$CHECK_DIR/host-modes.json" ;;
  # What this run left on the host, by its tag, and the host's modes.
  host) go run ./testing/hostcheck end "$VIRTLET_RUN" "$CHECK_DIR/host-modes.json" ;;
  # The guest images and the Kubernetes binaries, built once per content
  # (testing/cache.sh): timed on their own, before the suites that use them.
  images) testing/images/build.sh tiny >/dev/null && testing/images/build.sh cloud >/dev/null ;;
  k8s) testing/k8s/build.sh >/dev/null ;;
  *) make --no-print-directory "$1" ;;
  esac
}

failed=()
for p in "${phases[@]}"; do
  echo "=== make check: $p ($(date -u +%H:%M:%S))"
  start=$(date +%s)
  # The lock stays with this script: a process a phase leaves behind
  # must not hold it (hostcheck removes such processes).
  run_phase "$p" 9>&-
  rc=$?
  printf '%s\t%d\t%d\n' "$p" $(($(date +%s) - start)) $rc >>"$CHECK_DIR/phases.tsv"
  if [ $rc != 0 ]; then
    failed+=("$p")
    # Nothing after a failed set-up can run.
    case $p in setup | images | k8s) break ;; esac
  fi
done

echo
if [ ${#failed[@]} -gt 0 ]; then
  echo "make check: FAILED phases: ${failed[*]}"
else
  echo "make check: every phase passed"
fi
# The table ends with the tests' count, the check's last line.
go run ./testing/checkreport "$CHECK_DIR" 9>&- || failed+=(report)
rm -rf "$TMPDIR"
[ ${#failed[@]} = 0 ]
