package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/testing/harness"
)

// In-place pod resize (crictl update, as kubelet's resize does): the VM's
// memory grows through its balloon up to VirtletMaxMemory and the guest
// sees it within seconds; it shrinks back; beyond the maximum is refused
// naming the annotation.
func TestInPlaceMemoryResize(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "resize", map[string]string{"VirtletMaxMemory": "320Mi"}, 128<<20)
	sb, ctr, _ := bootTiny(t, c, podJSON, ctrJSON)
	memTotal := func() int64 {
		out, _, err := c.Run("exec", "-s", "--timeout", "10", ctr, "grep", "MemTotal", "/proc/meminfo")
		if err != nil {
			return 0
		}
		f := strings.Fields(out)
		if len(f) < 2 {
			return 0
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		return n << 10
	}
	// The balloon holds what lies above the VM's 128 MiB.
	harness.Eventually(t, 2*time.Minute, "the guest sees at most 128 MiB", func() bool { m := memTotal(); return m > 0 && m <= 128<<20 })
	c.Must(t, "update", "--memory", strconv.Itoa(320<<20), ctr)
	harness.Eventually(t, 2*time.Minute, "the guest sees its memory grow past 256 MiB", func() bool { return memTotal() > 256<<20 })
	if got := inspectCtr(t, c, ctr).VM.MemoryBytes; got != 320<<20 {
		t.Errorf("the VM's memory after the resize: %d", got)
	}
	c.Must(t, "update", "--memory", strconv.Itoa(160<<20), ctr)
	harness.Eventually(t, 2*time.Minute, "the guest gives memory back", func() bool { m := memTotal(); return m > 0 && m <= 160<<20 })
	_, errOut, err := c.Run("update", "--memory", strconv.Itoa(512<<20), ctr)
	if err == nil || !strings.Contains(errOut, "resources.limits.memory") || !strings.Contains(errOut, "VirtletMaxMemory") {
		t.Errorf("a resize beyond VirtletMaxMemory: %v %s", err, errOut)
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}

// vCPU hotplug by in-place resize (crictl update --cpu-quota, as kubelet's
// resize of a CPU limit sends): a VM with VirtletMaxVCPUCount boots with
// its CPU limit's vCPUs, and the guest sees vCPUs come online (hot-plugged)
// and go offline (through its agent; unplugged at the next boot) as the
// limit changes; beyond the maximum is refused naming the field.
func TestInPlaceVCPUResize(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "vcpus", map[string]string{"VirtletMaxVCPUCount": "3"}, 256<<20)
	ctrJSON = withResources(t, ctrJSON, func(r *runtimeapi.LinuxContainerResources) { r.CpuQuota, r.CpuPeriod = 100_000, 100_000 })
	sb, ctr, _ := bootTiny(t, c, podJSON, ctrJSON)
	var lastOnline string
	online := func() int {
		out, errOut, err := c.Run("exec", "-s", "--timeout", "10", ctr, "cat", "/sys/devices/system/cpu/online")
		lastOnline = out + errOut
		cpus, perr := core.ParseCPUList(strings.TrimSpace(out))
		if err != nil || perr != nil {
			return 0
		}
		return len(cpus)
	}
	domain := inspectCtr(t, c, ctr).VM.Name
	vcpuCount := func() string {
		out, _ := harness.Virsh("vcpucount", domain, "--live", "--active")
		return out
	}
	harness.Eventually(t, time.Minute, "the guest runs on 1 vCPU", func() bool { return online() == 1 })
	c.Must(t, "update", "--cpu-quota", "250000", "--cpu-period", "100000", ctr)
	// The guest onlines hot-plugged vCPUs itself; two TCG guests beside
	// it on a loaded 2-core machine took over a minute once.
	if !harness.EventuallyOK(3*time.Minute, func() bool { return online() == 3 }) {
		out, _ := harness.Virsh("vcpucount", domain)
		t.Fatalf("the guest does not see 3 vCPUs online after a 2500m limit: online %q; virsh vcpucount:\n%s\ndaemon log tail:\n%s", lastOnline, out, tail(d.Log(), 3000))
	}
	if got := vcpuCount(); got != "3" {
		t.Errorf("virsh vcpucount --live --active: %q", got)
	}
	c.Must(t, "update", "--cpu-quota", "200000", "--cpu-period", "100000", ctr)
	harness.Eventually(t, time.Minute, "the guest is down to 2 vCPUs after a 2000m limit", func() bool { return online() == 2 })
	_, errOut, err := c.Run("update", "--cpu-quota", "400000", "--cpu-period", "100000", ctr)
	if err == nil || !strings.Contains(errOut, "resources.limits.cpu") || !strings.Contains(errOut, "VirtletMaxVCPUCount") {
		t.Errorf("a CPU limit beyond VirtletMaxVCPUCount: %v %s", err, errOut)
	}
	// online() is 0 when an exec fails (a slow one times out): read until
	// it answers.
	var n int
	harness.EventuallyOK(time.Minute, func() bool { n = online(); return n > 0 })
	if n != 2 {
		t.Errorf("a refused resize changed the guest's vCPUs: %d online (%s)", n, strings.TrimSpace(lastOnline))
	}
	// Growing again brings the vCPU taken offline back: nothing new is
	// plugged.
	c.Must(t, "update", "--cpu-quota", "300000", "--cpu-period", "100000", ctr)
	harness.Eventually(t, time.Minute, "the guest sees 3 vCPUs online again", func() bool { return online() == 3 })
	if got := vcpuCount(); got != "3" {
		t.Errorf("virsh vcpucount --live --active after growing back: %q", got)
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}

// Memory a guest frees goes back to the host: every domain's balloon has
// free page reporting on, so QEMU's resident memory grows by what the
// guest touches and shrinks back (≥ 90 % of it) once the guest frees it.
// The guest reports freed pages after 2 s; the bound here is a minute, for
// a loaded machine: how long it takes is a benchmark's figure, not this
// test's.
func TestFreedGuestMemoryGoesBack(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "freepages", nil, 512<<20)
	sb, ctr, _ := bootTiny(t, c, podJSON, ctrJSON)
	domain := inspectCtr(t, c, ctr).VM.Name
	if xml, err := harness.Virsh("dumpxml", domain); err != nil || !strings.Contains(xml, `freePageReporting="on"`) && !strings.Contains(xml, `freePageReporting='on'`) {
		t.Fatalf("the domain's balloon has no free page reporting: %v\n%s", err, xml)
	}
	rss := func() int64 { return harness.QEMURSS(domain) }
	// The guest settles after boot (its agent, page cache) before the
	// baseline is taken.
	time.Sleep(3 * time.Second)
	before := rss()
	if before == 0 {
		t.Fatal("no QEMU resident memory to read")
	}
	const touched = 300 << 20
	var peak atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if r := rss(); r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-time.After(100 * time.Millisecond):
			case <-t.Context().Done():
				return
			}
			if peak.Load() >= before+touched*2/3 {
				return
			}
		}
	}()
	// busybox dd allocates its 300 MiB block, fills it from /dev/zero and
	// frees it when it exits.
	c.Must(t, "exec", "-s", "--timeout", "120", ctr, "dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1")
	<-done
	if peak.Load() < before+touched*2/3 {
		t.Fatalf("QEMU's resident memory went from %d MiB to at most %d MiB while the guest touched %d MiB: the test touched too little", before>>20, peak.Load()>>20, touched>>20)
	}
	freed := time.Now()
	harness.Eventually(t, time.Minute, "QEMU's resident memory back within 10 % of what the guest touched", func() bool {
		return rss() <= before+touched/10
	})
	t.Logf("QEMU RSS %d MiB → peak %d MiB → %d MiB %.1f s after the guest freed it", before>>20, peak.Load()>>20, rss()>>20, time.Since(freed).Seconds())
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}

// A container's CPU limit bounds its VM (the whole VM's CFS quota, as a
// container's bounds it): libvirt holds the limit, a guest burning CPU
// under a 0.5 CPU limit gets 0.5 ± 0.05 of a CPU, and an in-place resize
// to 0.25 CPU takes effect live. The test has the node to itself (it is
// not parallel): a limit is a ceiling, and beside other VMs on two cores
// the guest could get less than its limit for want of CPU, not because
// of it.
func TestCPULimitBoundsTheVM(t *testing.T) {
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "cpulimit", nil, 128<<20)
	ctrJSON = withResources(t, ctrJSON, func(r *runtimeapi.LinuxContainerResources) {
		r.CpuQuota, r.CpuPeriod, r.CpuShares = 50_000, 100_000, 512
	})
	sb, ctr, _ := bootTiny(t, c, podJSON, ctrJSON)
	domain := inspectCtr(t, c, ctr).VM.Name
	schedinfo := func() string {
		out, _ := harness.Virsh("schedinfo", domain, "--live")
		return out
	}
	for _, want := range []string{"cpu_shares     : 512", "global_period  : 100000", "global_quota   : 50000"} {
		if !strings.Contains(schedinfo(), want) {
			t.Fatalf("libvirt's live scheduler parameters lack %q:\n%s", want, schedinfo())
		}
	}
	pid, err := harness.QEMUPID(domain)
	if err != nil {
		t.Fatal(err)
	}
	within := func(limit, used, idle float64) {
		t.Helper()
		msg := fmt.Sprintf("under a %.2f CPU limit the VM used %.3f CPUs (the node idle meanwhile: %.2f CPUs)", limit, used, idle)
		if used < limit-0.05 || used > limit+0.05 {
			t.Errorf("%s, want %.2f ± 0.05", msg, limit)
			return
		}
		t.Log(msg)
	}
	used, idle := burnCPU(t, c, ctr, pid)
	within(0.5, used, idle)
	c.Must(t, "update", "--cpu-quota", "25000", "--cpu-period", "100000", ctr)
	if !strings.Contains(schedinfo(), "global_quota   : 25000") {
		t.Fatalf("after the resize to 0.25 CPU:\n%s", schedinfo())
	}
	used, idle = burnCPU(t, c, ctr, pid)
	within(0.25, used, idle)
	// kubelet's resize to no request and no limit: its least shares and
	// no quota per its period give the VM the default weight and no
	// bound.
	c.Must(t, "update", "--cpu-share", "2", "--cpu-quota", "0", "--cpu-period", "100000", ctr)
	weight := "1024" // cgroup v1's cpu.shares
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		weight = "100" // cgroup v2's cpu.weight
	}
	if out := schedinfo(); !strings.Contains(out, "cpu_shares     : "+weight+"\n") || !strings.Contains(out, "global_quota   : -1\n") &&
		!strings.Contains(out, "global_quota   : 17592186044415\n") {
		t.Errorf("after the resize to no request and no limit:\n%s", out)
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}

// burnCPU burns CPU in a VM's guest for 12 s and returns the CPUs its
// QEMU process (pid) used over 8 s of it, and the CPUs the node left idle
// meanwhile (from /proc/stat).
func burnCPU(t *testing.T, c *harness.Crictl, ctr, pid string) (used, idle float64) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run("exec", "-s", "--timeout", "60", ctr, "timeout", "12", "sh", "-c", "while :; do :; done")
	}()
	time.Sleep(2 * time.Second)
	t0, c0, i0 := time.Now(), processCPUTime(t, pid), nodeIdleTime(t)
	time.Sleep(8 * time.Second)
	took := time.Since(t0)
	used = float64(processCPUTime(t, pid)-c0) / float64(took)
	idle = float64(nodeIdleTime(t)-i0) / float64(took)
	<-done
	return used, idle
}

// processCPUTime is the CPU time a process has used (all its threads).
func processCPUTime(t *testing.T, pid string) time.Duration {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(stat)[strings.LastIndexByte(string(stat), ')')+2:])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// nodeIdleTime is the idle time of all the node's CPUs together.
func nodeIdleTime(t *testing.T) time.Duration {
	t.Helper()
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	// cpu  user nice system idle iowait ...
	f := strings.Fields(strings.SplitN(string(stat), "\n", 2)[0])
	idle, _ := strconv.ParseInt(f[4], 10, 64)
	return time.Duration(idle) * time.Second / 100 // USER_HZ
}

// The libvirt plugin caps a TCG VM's translated code, by default at an
// eighth of its memory (tcgTranslationCacheMiB: 0): libvirt passes it to
// QEMU as tb-size, and QEMU's code buffer mapping is that size instead of
// its default 1 GiB. A 256 MiB VM gets 32 MiB.
func TestTranslationCacheIsCapped(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "tbcache", nil, 256<<20)
	_, ctr, _ := bootTiny(t, c, podJSON, ctrJSON)
	domain := inspectCtr(t, c, ctr).VM.Name
	xml, err := harness.Virsh("dumpxml", domain)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(xml, "<domain type='qemu'") && !strings.Contains(xml, `<domain type="qemu"`) {
		t.Skip("the node's VMs run under KVM: no translation cache to cap")
	}
	// libvirt keeps sizes in KiB.
	if !strings.Contains(xml, "<tb-cache unit='KiB'>32768</tb-cache>") {
		t.Fatalf("the domain has no 32 MiB translation cache:\n%s", xml)
	}
	pid, err := harness.QEMUPID(domain)
	if err != nil {
		t.Fatal(err)
	}
	cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
	if !strings.Contains(string(cmdline), "tb-size=32") {
		t.Errorf("QEMU runs without tb-size=32: %q", strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	smaps, err := os.ReadFile("/proc/" + pid + "/smaps")
	if err != nil {
		t.Fatal(err)
	}
	// The code buffer is QEMU's one mapping both writable and executable
	// (less a guard page at its end).
	var sizesKB []int
	lines := strings.Split(string(smaps), "\n")
	for i, l := range lines {
		if f := strings.Fields(l); len(f) >= 2 && f[1] == "rwxp" && i+1 < len(lines) {
			var kb int
			fmt.Sscanf(strings.TrimSpace(lines[i+1]), "Size: %d kB", &kb)
			sizesKB = append(sizesKB, kb)
		}
	}
	if len(sizesKB) != 1 || sizesKB[0] > 32<<10 || sizesKB[0] < 31<<10 {
		t.Errorf("QEMU's code buffer mappings (kB): %v, want one of 32 MiB", sizesKB)
	}
}
