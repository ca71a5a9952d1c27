package e2e

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// longestFirst names the parallel tests that take longest, slowest first
// (a make check on a 2-core machine: TestKubeNode ≈ 800 s, TestCritest ≈
// 300 s, then 270 s down to 45 s). They start first, the others after in
// the order they asked: started last, one of them would end the suite
// alone on one core while the other idles (longest-processing-time-first
// scheduling). A test missing here only starts later; a stale order costs
// time, never a result.
var longestFirst = []string{
	"TestKubeNode",
	"TestCritest",
	"TestKubeNodeFailure",
	"TestKubeStatefulVMDrain",
	"TestKubeCluster",
	"TestPersistentRootfs",
	"TestCloudInitInRealGuest",
	"TestReachTheVM",
	"TestKubeVirtletctlThroughTheAPIServer",
	"TestVolumesInRealGuest",
	"TestVMPodsOnThePodNetwork",
	"TestPooledVMSeesTheSameHardware",
	"TestGuestSeesItsSpec",
	"TestVMBootsFromEverySourceKind",
	"TestPoolClaimCrashes",
	"TestDemo",
	"TestNodeInstall",
	"TestRunStrategiesKeepTheVM",
}

// slots lets VIRTLET_E2E_PARALLEL tests (default 3) run at a time, the
// longest first. go test's own -parallel limit cannot order them: make
// sets it above the number of tests, so that every parallel test reaches
// the slots at once when the sequential ones are done.
var slots = harness.NewSlots(e2eParallel(), 500*time.Millisecond, longestFirst)

func e2eParallel() int {
	if n, err := strconv.Atoi(os.Getenv("VIRTLET_E2E_PARALLEL")); err == nil && n > 0 {
		return n
	}
	return 3
}

// slot runs the rest of a parallel test in one of the slots. The wait is
// logged: go test counts it in the test's time, and make check's table
// of the slowest tests (testing/checkreport) takes it out.
func slot(t *testing.T) {
	t.Helper()
	start := time.Now()
	slots.Acquire(t.Name())
	t.Cleanup(slots.Release)
	t.Logf("waited %.3fs for a test slot", time.Since(start).Seconds())
}
