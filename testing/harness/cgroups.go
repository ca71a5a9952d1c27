package harness

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
)

// KubeletCgroupRoot names the cgroup under which a test kubelet keeps its
// pods (its cgroupRoot; kubepods/... below it): one per kubelet, with the
// run's id in it. Two kubelets under the same root (/kubepods) each take
// the other's pod cgroups for orphans and remove them, and each then
// kills and restarts its own pods' containers, whose cgroups went: seen
// with two e2e suites' kubelets at once, and so also between two runs.
func KubeletCgroupRoot(id, kubelet string) string {
	return "vt" + id + "-kubelet-" + kubelet
}

// RunCgroups lists the cgroups of run id's kubelets, in every hierarchy
// (their paths under /sys/fs/cgroup).
func RunCgroups(id string) []string {
	var out []string
	for _, m := range cgroupMounts() {
		found, _ := filepath.Glob(filepath.Join(m.dir, "vt"+id+"-kubelet-*"))
		out = append(out, found...)
	}
	return out
}

// cgroupMount is one mounted cgroup hierarchy.
type cgroupMount struct {
	dir    string
	cpuset bool
}

// cgroupMounts lists the host's cgroup hierarchies (v1 and v2).
func cgroupMounts() []cgroupMount {
	mounts, _ := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	var out []cgroupMount
	for _, m := range mounts {
		out = append(out, cgroupMount{dir: m.Mountpoint, cpuset: slices.Contains(strings.Split(m.VFSOptions, ","), "cpuset")})
	}
	return out
}

// makeCgroupRoot makes the cgroup name in every hierarchy, as kubelet
// wants its cgroupRoot to be; cpuset's gets its parent's CPUs and memory
// nodes (a new cpuset has none, and no process could join it).
func makeCgroupRoot(name string) error {
	for _, m := range cgroupMounts() {
		dir := filepath.Join(m.dir, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if !m.cpuset {
			continue
		}
		for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(m.dir, file))
			if err != nil {
				return fmt.Errorf("cgroup %s: %w", m.dir, err)
			}
			if err := os.WriteFile(filepath.Join(dir, file), v, 0o644); err != nil {
				return fmt.Errorf("cgroup %s: %s: %w", dir, file, err)
			}
		}
	}
	return nil
}

// RemoveCgroupTree removes a cgroup and the cgroups below it, deepest
// first; one still holding a process (exiting) is retried for a few
// seconds.
func RemoveCgroupTree(dir string) error {
	var dirs []string
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	deadline := time.Now().Add(10 * time.Second)
	for i := len(dirs) - 1; i >= 0; i-- {
		for {
			err := syscall.Rmdir(dirs[i])
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("remove cgroup %s: %w", dirs[i], err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}
