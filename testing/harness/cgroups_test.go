package harness

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

// A kubelet's cgroup root is made in every hierarchy (cpuset's with its
// parent's CPUs), found by the run's tag, and removed with what a kubelet
// makes below it.
func TestKubeletCgroupRootIsMadeAndRemoved(t *testing.T) {
	// A tag of its own: the benchmarks beside the unit tests run
	// kubelets with the run's.
	var b [3]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	name := KubeletCgroupRoot(id, "unit")
	if err := makeCgroupRoot(name); err != nil {
		t.Fatal(err)
	}
	mounts := cgroupMounts()
	if len(RunCgroups(id)) != len(mounts) || len(mounts) == 0 {
		t.Errorf("the root in %d hierarchies, want every one of %d", len(RunCgroups(id)), len(mounts))
	}
	for _, m := range mounts {
		dir := filepath.Join(m.dir, name)
		if m.cpuset {
			if cpus, _ := os.ReadFile(filepath.Join(dir, "cpuset.cpus")); len(cpus) < 2 {
				t.Errorf("%s has no CPUs: %q", dir, cpus)
			}
		}
		if err := os.MkdirAll(filepath.Join(dir, "kubepods", "besteffort"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := RemoveCgroupTree(dir); err != nil {
			t.Error(err)
		}
	}
	if left := RunCgroups(id); len(left) > 0 {
		t.Errorf("left: %v", left)
	}
}
