package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/testing/harness"
	"github.com/vishvananda/netlink"
)

// The crash matrix: a daemon built with failpoints kills itself with
// SIGKILL at each step between a VM pod's side effects (core/failpoints.go),
// from pulling its image to removing it. Each time the daemon is started
// again, kubelet's retry of the call that died is replayed, and the pod's
// life goes on to its end. Then nothing the pod had may be left (domain,
// overlay, console log, record, cloud-init medium, netns, host links,
// address, DHCP server (the CNI plugin's sockets), libvirt secret, image
// data or download file), and
// a bystander VM pod that ran through every crash must run still, in the
// same QEMU process. The matrix (step × outcome) is printed.
// TestLibvirtdKilled kills libvirtd itself mid-start and mid-stop.

// crashImage is the image of the pod whose life the matrix interrupts.
const crashImage = "virtlet.cloud/crash-tiny"

// lifeStep is one CRI call of a pod's life, as kubelet makes it.
type lifeStep struct {
	name string
	run  func() (string, error)
}

type matrixRow struct {
	failpoint string
	diedIn    string // the call during which the daemon died ("" if it never did)
	retries   int
	leaks     []string
	bystander string
}

// crashNode is a failpoints daemon on a test network of its own, with a
// bystander VM pod running and the node's state snapshot around it.
type crashNode struct {
	d     *harness.Daemon
	c     *harness.Crictl
	tn    *harness.TestNetwork
	base  nodeSnapshot
	bySB  string
	byCtr string
	byVM  string
	byPID string
}

// startCrashNode starts it; more translations (file → YAML) may name
// the images of the pods the test crashes.
func startCrashNode(t *testing.T, netIndex int, more map[string]string) *crashNode {
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: netIndex})
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet-failpoints"), append(plugins(), tn.Plugin(bins)))
	d.Translate("test-images.yaml", translation)
	for file, tr := range more {
		d.Translate(file, tr)
	}
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	c.Must(t, "pull", tinyRef)
	n := &crashNode{d: d, c: c, tn: tn}
	byPod, byCtrCfg := vmPod(t, d, "bystander", nil, 160<<20)
	n.bySB = c.Must(t, "runp", byPod)
	n.byCtr = c.Must(t, "create", n.bySB, byCtrCfg, byPod)
	c.Must(t, "start", n.byCtr)
	waitLog(t, c, n.byCtr, "@@TINY-READY", 3*time.Minute)
	n.byVM = inspectCtr(t, c, n.byCtr).VM.Name
	n.byPID = qemuPID(t, n.byVM)
	n.base = snapshotNode(t, d, tn)
	return n
}

// check records in row what the node holds beyond its base snapshot and
// whether the bystander still runs in its QEMU.
func (n *crashNode) check(t *testing.T, row *matrixRow, after string) {
	row.leaks = snapshotNode(t, n.d, n.tn).minus(n.base)
	for _, l := range row.leaks {
		t.Errorf("left after %s: %s", after, l)
	}
	row.bystander = checkStillRunning(t, n.c, n.byCtr, n.byVM, n.byPID)
}

// finish removes the bystander and asserts the node is empty.
func (n *crashNode) finish(t *testing.T) {
	for _, args := range [][]string{{"stop", "--timeout", "0", n.byCtr}, {"rm", n.byCtr}, {"stopp", n.bySB}, {"rmp", n.bySB}} {
		retryCrictl(t, n.c, args...)
	}
	assertNothingLeft(t, n.d, n.c)
}

// The crash matrix's daemon rows (see above). The host-wide parts of its
// snapshot (network namespaces, host links, libvirt secrets) are the
// node's: the test runs beside the hypervisor contracts only, which make
// none of them (TestLibvirtdSharedByFew).
func testCrashMatrix(t *testing.T) {
	// The crash pod's image: the tiny guest's content in another file, so
	// that it has its own digest to pull, store and remove.
	crashFile := filepath.Join(imgDir, "crash-tiny.qcow2")
	if out, err := exec.Command("qemu-img", "convert", "-O", "qcow2", tiny, crashFile).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v %s", err, out)
	}
	crashTr, err := images.Translation(map[string]string{"crash-tiny": "crash-tiny.qcow2"})
	if err != nil {
		t.Fatal(err)
	}
	n := startCrashNode(t, 86, map[string]string{"crash.yaml": crashTr})
	d, c := n.d, n.c

	var rows []matrixRow
	for i, fp := range core.Failpoints {
		row := matrixRow{failpoint: fp}
		t.Run(fp, func(t *testing.T) {
			d.Stop()
			d.Env = []string{"VIRTLET_FAILPOINT=" + fp}
			d.Start()
			name := fmt.Sprintf("crash-%d", i)
			podCfg, ctrCfg := vmPod(t, d, name, nil, 160<<20)
			ctrCfg = withImage(t, ctrCfg, crashImage)
			var sb, ctr string
			steps := []lifeStep{
				{"PullImage", func() (string, error) { return crictlRun(c, "pull", crashImage) }},
				{"RunPodSandbox", func() (string, error) { s, err := crictlRun(c, "runp", podCfg); sb = s; return s, err }},
				{"CreateContainer", func() (string, error) { s, err := crictlRun(c, "create", sb, ctrCfg, podCfg); ctr = s; return s, err }},
				{"StartContainer", func() (string, error) { return crictlRun(c, "start", ctr) }},
				{"StopContainer", func() (string, error) { return crictlRun(c, "stop", "--timeout", "0", ctr) }},
				{"RemoveContainer", func() (string, error) { return crictlRun(c, "rm", ctr) }},
				{"StopPodSandbox", func() (string, error) { return crictlRun(c, "stopp", sb) }},
				{"RemovePodSandbox", func() (string, error) { return crictlRun(c, "rmp", sb) }},
				{"RemoveImage", func() (string, error) { return crictlRun(c, "rmi", crashImage) }},
			}
			for _, step := range steps {
				for attempt := 0; ; attempt++ {
					out, err := step.run()
					if err == nil {
						break
					}
					// kubelet lists images before it removes one: an image
					// the crash left unlisted is removed.
					if attempt > 0 && step.name == "RemoveImage" && strings.Contains(err.Error(), "no such image") {
						break
					}
					if !d.Exited(5 * time.Second) {
						t.Fatalf("%s failed with the daemon alive: %v %s", step.name, err, out)
					}
					if attempt > 0 {
						t.Fatalf("%s: the daemon died again on the retry: %v", step.name, err)
					}
					// The crash: start again without the failpoint and retry
					// as kubelet does.
					row.diedIn = step.name
					row.retries++
					d.Env = nil
					d.Start()
				}
			}
			if row.diedIn == "" {
				t.Errorf("the daemon never reached failpoint %s", fp)
			}
			if !d.Exited(0) {
				d.Stop() // a clean start sees the converged state
			}
			d.Env = nil
			d.Start()
			n.check(t, &row, "a crash at "+fp)
		})
		rows = append(rows, row)
	}
	t.Logf("crash matrix:\n%s", matrixTable(rows))
	n.finish(t)
}

// libvirtd killed while a VM starts, and while one stops: its pod's life
// goes on once kubelet retries, nothing leaks, and a bystander VM runs on
// in its QEMU. Alone on the node: the other tests' calls would fail too.
func TestLibvirtdKilled(t *testing.T) {
	n := startCrashNode(t, 88, nil)
	d, c := n.d, n.c
	if out, err := crictlRun(c, "exec", "-s", n.byCtr, "echo", "agent"); err != nil || out != "agent" {
		t.Fatalf("exec in the bystander: %q, %v", out, err)
	}
	var rows []matrixRow
	for _, mid := range []string{"start", "stop"} {
		row := matrixRow{failpoint: "libvirtd SIGKILL mid-" + mid}
		t.Run(row.failpoint, func(t *testing.T) {
			name := "libvirtd-" + mid
			// A guest that ignores the power button: the stop lasts its
			// whole timeout, so libvirtd dies in the middle of it.
			podCfg, ctrCfg := vmPod(t, d, name, map[string]string{"VirtletCloudInitMetaData": "tiny: virtlet-tiny-no-acpi"}, 160<<20)
			sb := c.Must(t, "runp", podCfg)
			ctr := c.Must(t, "create", sb, ctrCfg, podCfg)
			if mid == "stop" {
				c.Must(t, "start", ctr)
				waitLog(t, c, ctr, "@@TINY-READY", 3*time.Minute)
			}
			args := []string{mid, ctr}
			if mid == "stop" {
				args = []string{"stop", "--timeout", "10", ctr}
			}
			done := make(chan error, 1)
			began := time.Now()
			go func() { _, err := crictlRun(c, args...); done <- err }()
			time.Sleep(map[string]time.Duration{"start": 150 * time.Millisecond, "stop": 2 * time.Second}[mid])
			killLibvirtd(t)
			killed := time.Now()
			// Started again at once, as its service manager would.
			if err := harness.EnsureLibvirt(); err != nil {
				t.Fatal(err)
			}
			err := <-done
			row.diedIn = fmt.Sprintf("%s: answered in %.1fs", mid, time.Since(began).Seconds())
			if err != nil {
				row.diedIn = fmt.Sprintf("%s: failed in %.1fs", mid, time.Since(began).Seconds())
			}
			// kubelet's retries, then the rest of the pod's life.
			retry := func(args ...string) { retryCrictl(t, c, args...) }
			retry(args...)
			row.retries++
			row.diedIn += fmt.Sprintf("; retried %.1fs after the kill", time.Since(killed).Seconds())
			want := map[string]string{"start": "CONTAINER_RUNNING", "stop": "CONTAINER_EXITED"}[mid]
			wantDomain := map[string]string{"start": "running", "stop": "shut off"}[mid]
			i := inspectCtr(t, c, ctr)
			if dom, _ := harness.Virsh("domstate", i.VM.Name); i.Status.State != want || dom != wantDomain {
				t.Errorf("after libvirtd's restart and the retried %s: container %s, domain %q; want %s, %q", mid, i.Status.State, dom, want, wantDomain)
			}
			// The plugin's guest-agent connection died with libvirtd too
			// (the bystander's exec opened it): a new one carries execs.
			if out, err := crictlRun(c, "exec", "-s", n.byCtr, "echo", "agent-"+mid); err != nil || out != "agent-"+mid {
				t.Errorf("exec in the bystander after libvirtd's restart: %q, %v", out, err)
			}
			retry("stop", "--timeout", "0", ctr)
			retry("rm", ctr)
			retry("stopp", sb)
			retry("rmp", sb)
			n.check(t, &row, "libvirtd died mid-"+mid)
		})
		rows = append(rows, row)
	}
	t.Logf("libvirtd killed:\n%s", matrixTable(rows))
	n.finish(t)
}

// retryCrictl runs crictl until it succeeds, as kubelet retries, for up to
// a minute.
func retryCrictl(t *testing.T, c *harness.Crictl, args ...string) {
	t.Helper()
	harness.Eventually(t, time.Minute, "crictl "+strings.Join(args, " "), func() bool {
		_, err := crictlRun(c, args...)
		return err == nil
	})
}

// crictlRun is crictl without failing the test.
func crictlRun(c *harness.Crictl, args ...string) (string, error) {
	out, errOut, err := c.Run(args...)
	if err != nil {
		return out, fmt.Errorf("crictl %s: %v: %s", args[0], err, strings.TrimSpace(errOut))
	}
	return strings.TrimSpace(out), nil
}

// withImage rewrites a container config file to use image.
func withImage(t *testing.T, cfgPath, image string) string {
	t.Helper()
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Replace(string(data), `"`+tinyRef+`"`, `"`+image+`"`, 1)
	if out == string(data) {
		t.Fatalf("no image %s in %s", tinyRef, cfgPath)
	}
	if err := os.WriteFile(cfgPath, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfgPath
}

// qemuPID is the pid of the QEMU of a running domain.
func qemuPID(t *testing.T, domain string) string {
	t.Helper()
	pid, err := harness.QEMUPID(domain)
	if err != nil {
		t.Fatalf("QEMU of %s: %v", domain, err)
	}
	return pid
}

// checkStillRunning: a VM (a crash's bystander, a chaos run's VM) runs in
// the QEMU it started in, and its container says so.
func checkStillRunning(t *testing.T, c *harness.Crictl, ctr, domain, pid string) string {
	t.Helper()
	state, _ := harness.Virsh("domstate", domain)
	now, _ := harness.QEMUPID(domain)
	st := inspectCtr(t, c, ctr).Status.State
	if state != "running" || now != pid || st != "CONTAINER_RUNNING" {
		t.Errorf("VM %s: domain %s, QEMU %s (was %s), container %s", domain, state, now, pid, st)
		return "LOST"
	}
	return "running"
}

// killLibvirtd kills the host's libvirtd: the one in this process's mount
// namespace, not a test node's (testing/harness.Node), which runs in a
// namespace of its own.
func killLibvirtd(t *testing.T) {
	t.Helper()
	pids := harness.Running("libvirtd")
	if len(pids) == 0 {
		t.Fatal("kill libvirtd: none runs")
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for i := 0; i < 100 && len(harness.Running("libvirtd")) > 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeSnapshot is what a node holds for VM pods, by kind.
type nodeSnapshot map[string][]string

// snapshotNode lists the daemon's and the host's resources of VM pods.
func snapshotNode(t *testing.T, d *harness.Daemon, tn *harness.TestNetwork) nodeSnapshot {
	t.Helper()
	s := nodeSnapshot{}
	s["domain"] = harness.DomainsUsing(d.Dir)
	s["VM file"] = vmFiles(d)
	s["cloud-init medium"], _ = filepath.Glob(filepath.Join(d.StateDir, "plugins", "*", "media", "*"))
	s["image data"], _ = filepath.Glob(filepath.Join(d.StateDir, "images", "sha256", "*"))
	s["image download"], _ = filepath.Glob(filepath.Join(d.StateDir, "images", "tmp", "*"))
	filepath.WalkDir(filepath.Join(d.StateDir, "plugins", "cni"), func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			s["CNI plugin file"] = append(s["CNI plugin file"], p)
		}
		return nil
	})
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], tn.NetNSPrefix) {
				s["netns"] = append(s["netns"], f[0])
			}
		}
	}
	s["host link"] = nodeLinks(t, tn)
	// The CNI plugin holds a socket per DHCP server it runs.
	for pid, cmdline := range harness.ChildrenOf(d.PID()) {
		if strings.Contains(cmdline, "virtlet-plugin-cni") {
			s["CNI plugin sockets (DHCP servers)"] = []string{fmt.Sprint(sockets(pid))}
		}
	}
	entries, _ := os.ReadDir(filepath.Join(tn.IPAMDir, tn.Name))
	for _, e := range entries {
		if strings.Count(e.Name(), ".") == 3 {
			s["address"] = append(s["address"], e.Name())
		}
	}
	if out, err := harness.Virsh("secret-list"); err == nil {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "virtlet") {
				s["libvirt secret"] = append(s["libvirt secret"], strings.Fields(line)[0])
			}
		}
	}
	for _, kind := range []string{"pod", "container"} {
		args := map[string][]string{"pod": {"pods", "-q"}, "container": {"ps", "-a", "-q"}}[kind]
		if out, err := crictlRun(d.Crictl(crictl), args...); err == nil {
			s[kind] = strings.Fields(out)
		}
	}
	for k := range s {
		sort.Strings(s[k])
	}
	return s
}

// minus lists what s has beyond base, as "kind: name".
func (s nodeSnapshot) minus(base nodeSnapshot) []string {
	var out []string
	for kind, names := range s {
		for _, n := range names {
			if !slices.Contains(base[kind], n) {
				out = append(out, kind+": "+n)
			}
		}
	}
	sort.Strings(out)
	return out
}

func matrixTable(rows []matrixRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-36s | %-28s | %-7s | %-10s | %s\n", "step (failpoint)", "daemon died in", "retries", "bystander", "left behind")
	b.WriteString(strings.Repeat("-", 110) + "\n")
	for _, r := range rows {
		leaks := "nothing"
		if len(r.leaks) > 0 {
			leaks = strings.Join(r.leaks, ", ")
		}
		died := r.diedIn
		if died == "" {
			died = "(never reached)"
		}
		fmt.Fprintf(&b, "%-36s | %-28s | %-7d | %-10s | %s\n", r.failpoint, died, r.retries, r.bystander, leaks)
	}
	return b.String()
}

// qemuUID is the real uid the QEMU of domain runs as.
func qemuUID(t *testing.T, domain string) string {
	t.Helper()
	return procStatus(t, qemuPID(t, domain), "Uid")[0]
}

// qemuGID is the real gid the QEMU of domain runs as.
func qemuGID(t *testing.T, domain string) string {
	t.Helper()
	return procStatus(t, qemuPID(t, domain), "Gid")[0]
}

// procStatus is the fields of a line of /proc/<pid>/status (Uid: real,
// effective, saved, filesystem).
func procStatus(t *testing.T, pid, name string) []string {
	t.Helper()
	f, err := procStatusField(pid, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// procStatusField is procStatus without a test to fail.
func procStatusField(pid, name string) ([]string, error) {
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return nil, err
	}
	m := regexp.MustCompile(`(?m)^` + name + `:\s+(.*)$`).FindSubmatch(status)
	if m == nil {
		return nil, fmt.Errorf("no %s in /proc/%s/status", name, pid)
	}
	return strings.Fields(string(m[1])), nil
}

// domainQEMUUID is the real uid the QEMU of a running domain runs as.
func domainQEMUUID(domain string) (int, error) {
	pid, err := harness.QEMUPID(domain)
	if err != nil {
		return 0, err
	}
	uid, err := procStatusField(pid, "Uid")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(uid[0])
}

// nodeLinks lists the host links of the test network's pods: the VMs'
// host bridges and veths (aliased with their pod's network namespace) and
// the links on the test network's bridge, but not the bridge itself, nor
// the links of other tests and runs.
func nodeLinks(t *testing.T, tn *harness.TestNetwork) []string {
	t.Helper()
	all, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	bridge := -1
	for _, l := range all {
		if l.Attrs().Name == tn.Bridge {
			bridge = l.Attrs().Index
		}
	}
	var out []string
	for _, l := range all {
		a := l.Attrs()
		if strings.HasPrefix(a.Alias, tn.NetNSPrefix) || bridge >= 0 && a.MasterIndex == bridge {
			out = append(out, a.Name)
		}
	}
	sort.Strings(out)
	return out
}
