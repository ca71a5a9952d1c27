// Package cephcluster runs a real, tiny Ceph cluster (one monitor, one
// OSD, on loopback; testing/ceph/cluster.sh) for the tests of the ceph
// volume plugin. Its monitor ports are fixed, so one cluster runs at a
// time on a machine: Start waits for a lock.
package cephcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Monitor is the monitor address (msgr v1) of a cluster Start runs.
const Monitor = "127.0.0.1:6789"

// Cluster is a running test cluster.
type Cluster struct {
	Dir     string
	Conf    string // ceph.conf
	Monitor string // its monitor's address (msgr v1), host:port
	// AdminKey is client.admin's cephx key, base64 as in a keyring.
	AdminKey string
}

func script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "ceph", "cluster.sh")
}

// Start starts a cluster on loopback, stopped and removed when the test
// ends.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartOn(t, "127.0.0.1")
}

// StartOn is Start with the daemons listening on addr, an IPv4 address of
// the host (a NodeNet's HostIP, for nodes to reach).
func StartOn(t testing.TB, addr string) *Cluster {
	t.Helper()
	for _, tool := range []string{"ceph-mon", "ceph-osd", "ceph", "rbd", "ceph-authtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (testing/setup.sh installs Ceph)", tool)
		}
	}
	lock, err := os.OpenFile("/tmp/virtlet-test-ceph.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	dir, err := os.MkdirTemp("", "virtlet-ceph-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "ceph.conf"), Monitor: addr + ":6789"}
	t.Cleanup(func() {
		if out, err := exec.Command(script(), "stop", dir).CombinedOutput(); err != nil {
			t.Errorf("stop the Ceph cluster: %v\n%s", err, out)
		}
	})
	start := time.Now()
	cmd := exec.Command(script(), "start", dir)
	cmd.Env = append(os.Environ(), "CEPH_ADDR="+addr)
	if out, err := cmd.CombinedOutput(); err != nil {
		logs, _ := exec.Command("sh", "-c", "tail -n 30 "+dir+"/log/*.log").CombinedOutput()
		t.Fatalf("start a Ceph cluster: %v\n%s\n%s", err, out, logs)
	}
	key, err := exec.Command("ceph-authtool", "-p", "-n", "client.admin", filepath.Join(dir, "keyring")).Output()
	if err != nil {
		t.Fatal(err)
	}
	c.AdminKey = strings.TrimSpace(string(key))
	t.Logf("Ceph cluster ready in %s", time.Since(start).Round(time.Millisecond))
	return c
}

// Run runs a Ceph command line tool (ceph, rbd, rados) against the
// cluster and returns its output.
func (c *Cluster) Run(t testing.TB, tool string, args ...string) string {
	t.Helper()
	out, err := exec.Command(tool, append([]string{"-c", c.Conf}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Logs returns every log file's content (to look for keys that must not
// be there).
func (c *Cluster) Logs() string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(c.Dir, "log", "*"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "== %s\n%s", f, data)
	}
	return b.String()
}
