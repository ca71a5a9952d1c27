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
  # deps (testing/setup.sh) ran as the setup phase: not again, and not
  # twice at once when bench-smoke runs beside another phase.
  *) make --no-print-directory ${setup_done:+-o deps} "$1" ;;
  esac
}

failed=()
# timed PHASE: runs it, notes its start, time and exit code in phases.tsv.
# The lock stays with this script: a process a phase leaves behind must
# not hold it (hostcheck removes such processes).
timed() {
  local start rc
  start=$(date +%s)
  run_phase "$1" 9>&-
  rc=$?
  printf '%s\t%d\t%d\t%d\n' "$1" "$start" $(($(date +%s) - start)) $rc >>"$CHECK_DIR/phases.tsv"
  return $rc
}

# bench-smoke runs beside lint, unit and integration: the benchmarks
# mostly wait for one guest at a time (half of the 2 cores, measured),
# the go test -race phases keep about two thirds of them busy; side by
# side they keep both busy and end about 3 minutes sooner. Its output
# goes to a file, shown when it is waited for (before e2e-all, which
# wants both cores to itself). The host's bridge rules, which every
# suite's TestMain removes if it found them absent, are installed for the
# whole check (hostcheck begin), so that one suite ending does not pull
# them from under the other's VMs.
beside=()
for p in "${phases[@]}"; do
  case $p in lint | unit | integration) beside+=("$p") ;; esac
done
setup_done=
bench_pid=
start_bench() {
  echo "=== make check: bench-smoke, beside ${beside[*]} ($(date -u +%H:%M:%S))"
  timed bench-smoke >"$CHECK_DIR/bench-smoke.log" 2>&1 &
  bench_pid=$!
}
wait_bench() {
  [ -n "$bench_pid" ] || return 0
  wait "$bench_pid"
  local rc=$?
  bench_pid=
  echo "=== make check: bench-smoke's output ($(date -u +%H:%M:%S))"
  cat "$CHECK_DIR/bench-smoke.log"
  [ $rc = 0 ] || failed+=(bench-smoke)
}
bench_beside=
if [[ " ${phases[*]} " == *" bench-smoke "* ]] && [ ${#beside[@]} -gt 0 ]; then
  bench_beside=1
fi

for p in "${phases[@]}"; do
  case $p in
  lint | unit | integration) [ -z "$bench_beside" ] || [ -n "$bench_pid" ] || start_bench ;;
  bench-smoke) [ -z "$bench_beside" ] || continue ;;
  *) wait_bench ;;
  esac
  echo "=== make check: $p ($(date -u +%H:%M:%S))"
  if timed "$p"; then
    [ "$p" != setup ] || setup_done=1
  else
    failed+=("$p")
    # Nothing after a failed set-up can run.
    case $p in setup | images | k8s) break ;; esac
  fi
done
wait_bench

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
