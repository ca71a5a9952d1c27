package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/harness"
)

func startDaemon(t *testing.T) (*harness.Daemon, *harness.Crictl) {
	t.Helper()
	return startDaemonWith(t, plugins())
}

// startDaemonWith is startDaemon with these plugins.
func startDaemonWith(t *testing.T, ps []harness.Plugin) (*harness.Daemon, *harness.Crictl) {
	t.Helper()
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), ps)
	d.Translate("test-images.yaml", translation)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	return d, c
}

// vmPod writes the pod and container configs kubelet would send for a VM
// pod with these annotations and memory limit.
func vmPod(t *testing.T, d *harness.Daemon, name string, ann map[string]string, memory int64) (pod, ctr string) {
	t.Helper()
	all := map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud"}
	for k, v := range ann {
		all[k] = v
	}
	pod = harness.WriteJSON(t, d.Dir, name+"-pod.json", map[string]interface{}{
		"metadata":      map[string]interface{}{"name": name, "namespace": "default", "uid": "uid-" + name},
		"annotations":   all,
		"log_directory": filepath.Join(d.Dir, "pods", "default_"+name),
	})
	ctr = harness.WriteJSON(t, d.Dir, name+"-ctr.json", map[string]interface{}{
		"metadata": map[string]interface{}{"name": name},
		"image":    map[string]string{"image": tinyRef},
		"log_path": name + "/0.log",
		"linux":    map[string]interface{}{"resources": map[string]interface{}{"memory_limit_in_bytes": memory}},
		"tty":      true, "stdin": true,
	})
	return pod, ctr
}

// bootTiny runs a tiny-guest VM pod from its CRI configs and waits for
// the guest's ready marker: the sandbox, the container and the console so
// far.
func bootTiny(t *testing.T, c *harness.Crictl, podJSON, ctrJSON string) (sb, ctr, logs string) {
	t.Helper()
	sb = c.Must(t, "runp", podJSON)
	ctr = c.Must(t, "create", sb, ctrJSON, podJSON)
	c.Must(t, "start", ctr)
	return sb, ctr, waitLog(t, c, ctr, "@@TINY-READY", 3*time.Minute)
}

// waitLog waits until the container's log (crictl logs) holds marker.
func waitLog(t *testing.T, c *harness.Crictl, ctr, marker string, timeout time.Duration) string {
	t.Helper()
	var logs, errOut string
	var err error
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		logs, errOut, err = c.Run("logs", ctr)
		if strings.Contains(logs, marker) {
			return logs
		}
		time.Sleep(500 * time.Millisecond)
	}
	var raw string
	var st struct {
		Status struct {
			LogPath string `json:"logPath"`
		} `json:"status"`
	}
	if c.JSON(t, &st, "inspect", ctr); st.Status.LogPath != "" {
		b, _ := os.ReadFile(st.Status.LogPath)
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		raw = string(b)
	}
	t.Fatalf("no %q in the VM's console after %s; crictl logs (%v, %s):\n%s\nCRI log file tail:\n%s\n%s", marker, timeout, err, errOut, logs, raw, vmDiagnosis(t, c, ctr))
	return ""
}

// vmDiagnosis tells a paused or dead VM from a starved one: its domain's
// state and reason, its QEMU's CPU time, its console file's tail and the
// host's load.
func vmDiagnosis(t *testing.T, c *harness.Crictl, ctr string) string {
	var b strings.Builder
	dom := inspectCtr(t, c, ctr).VM.Name
	state, _ := harness.Virsh("domstate", "--reason", dom)
	fmt.Fprintf(&b, "domain %s: %s\n", dom, state)
	if pid, err := harness.QEMUPID(dom); err == nil {
		if stat, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil {
			if f := strings.Fields(string(stat)); len(f) > 14 {
				fmt.Fprintf(&b, "QEMU %s: utime %s stime %s ticks\n", pid, f[13], f[14])
			}
		}
	}
	if cons, err := filepath.Glob(filepath.Join("/var/log/libvirt/qemu", dom+".log")); err == nil && len(cons) == 1 {
		data, _ := os.ReadFile(cons[0])
		if len(data) > 1500 {
			data = data[len(data)-1500:]
		}
		fmt.Fprintf(&b, "libvirt's QEMU log tail:\n%s\n", data)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "host load: %s", load)
	return b.String()
}

func marker(t *testing.T, logs, name string) string {
	t.Helper()
	m := regexp.MustCompile(`@@` + name + `=(\S*)`).FindStringSubmatch(logs)
	if m == nil {
		t.Fatalf("no @@%s= in the console:\n%s", name, logs)
	}
	return m[1]
}

type inspect struct {
	Status struct {
		State    string `json:"state"`
		ExitCode int    `json:"exitCode"`
		Reason   string `json:"reason"`
		Message  string `json:"message"`
	} `json:"status"`
	VM struct {
		Name        string `json:"name"`
		MemoryBytes int64  `json:"memoryBytes"`
	} `json:"vm"`
}

func inspectCtr(t *testing.T, c *harness.Crictl, id string) inspect {
	t.Helper()
	var i inspect
	c.JSON(t, &i, "inspect", id)
	return i
}

// vmFiles lists what the libvirt plugin keeps for VMs: overlays, console
// logs, records.
func vmFiles(d *harness.Daemon) []string {
	var out []string
	for _, dir := range []string{"vms", "records"} {
		entries, _ := os.ReadDir(filepath.Join(d.StateDir, "plugins", "libvirt", dir))
		for _, e := range entries {
			out = append(out, dir+"/"+e.Name())
		}
	}
	return out
}

func assertNothingLeft(t *testing.T, d *harness.Daemon, c *harness.Crictl) {
	t.Helper()
	if doms := harness.DomainsUsing(d.Dir); len(doms) != 0 {
		t.Errorf("domains left: %v", doms)
	}
	if files := vmFiles(d); len(files) != 0 {
		t.Errorf("VM files left: %v", files)
	}
	if ctrs := c.Must(t, "ps", "-a", "-q"); ctrs != "" {
		t.Errorf("containers left: %s", ctrs)
	}
	if media, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "*", "media", "*")); len(media) != 0 {
		t.Errorf("cloud-init media left: %v", media)
	}
}

// The story of issue 3: a VM pod defined as in the Virtlet docs boots,
// shows its console in crictl logs, shuts down through ACPI when stopped,
// and leaves nothing behind when removed.
func TestVMPodLifecycle(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "cirros-vm", map[string]string{
		"VirtletVCPUCount": "1", "VirtletDiskDriver": "virtio", "VirtletRootVolumeSize": "1Gi",
		"VirtletSSHKeys": "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCaJEcFDXEK2ZbX0ZLS1EIYFZRbDAcRfuVjpstSc0De8+sV1aiu+dePxdkuDRwqFtCyk6dEZkssjOkBXtri00MECLkir6FcH3kKOJtbJ6vy3uaJc9w1ERo me@localhost\n",
	}, 160<<20)
	sb, ctr, logs := bootTiny(t, c, podJSON, ctrJSON)
	if !strings.Contains(logs, "SYSLINUX") || !strings.Contains(logs, "@@TINY-INIT-START") {
		t.Errorf("the boot messages are not in crictl logs:\n%s", logs)
	}
	if i := inspectCtr(t, c, ctr); i.Status.State != "CONTAINER_RUNNING" {
		t.Fatalf("inspect: %+v", i.Status)
	}
	if state, _ := harness.Virsh("domstate", inspectCtr(t, c, ctr).VM.Name); state != "running" {
		t.Fatalf("domain state %q", state)
	}
	// A graceful stop: the guest sees the power button and powers off.
	begin := time.Now()
	c.Must(t, "stop", "--timeout", "60", ctr)
	took := time.Since(begin)
	i := inspectCtr(t, c, ctr)
	if i.Status.State != "CONTAINER_EXITED" || i.Status.ExitCode != 0 || i.Status.Reason != "Completed" || took > 60*time.Second {
		t.Fatalf("after stop (%s): %+v", took, i.Status)
	}
	waitLog(t, c, ctr, "@@ACPI-POWER-BUTTON", time.Minute)
	c.Must(t, "rm", ctr)
	c.Must(t, "stopp", sb)
	c.Must(t, "rmp", sb)
	assertNothingLeft(t, d, c)
	t.Logf("graceful stop took %s", took.Round(time.Millisecond))
}

// The guest sees what the annotations ask for.
func TestGuestSeesItsSpec(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	const uuid = "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d"
	const i440fx, q35 = "HOSTBRIDGE=0x1237", "HOSTBRIDGE=0x29c0"
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		memory  int64
		cpus    string
		disk    string
		size    int64
		uuid    string
		maxMemK int64
		ciMedia string // what the guest's /init reports for the cloud-init media
		ciFile  string
		bridge  string        // the PCI host bridge: the chipset of the machine type
		clock   time.Duration // the guest's hardware clock ahead of UTC
		hpet    bool
	}{
		{"two-vcpus-virtio-1gi", map[string]string{"VirtletVCPUCount": "2", "VirtletDiskDriver": "virtio", "VirtletRootVolumeSize": "1Gi", "VirtletSystemUUID": uuid},
			256 << 20, "2", "vda", 1 << 30, uuid, 256 << 10, "dev=/dev/vdb label=cidata", "/ci/meta-data", i440fx, 0, true},
		{"defaults-scsi", nil, 128 << 20, "1", "sda", 32 << 20, "", 128 << 10, "dev=/dev/sr0 label=cidata", "/ci/meta-data", i440fx, 0, true},
		{"configdrive", map[string]string{"VirtletCloudInitImageType": "configdrive"}, 128 << 20, "1", "sda", 32 << 20, "", 128 << 10,
			"dev=/dev/sr0 label=config-2", "/ci/openstack/latest/meta_data.json", i440fx, 0, true},
		// UEFI boots through Debian's signed shim, GRUB and kernel (the
		// kernel's EFI stub wants more than 256 MiB to unpack itself).
		{"uefi", map[string]string{"VirtletFirmware": "uefi"},
			512 << 20, "1", "sda", 32 << 20, "", 512 << 10, "dev=/dev/sr0 label=cidata", "/ci/meta-data", i440fx, 0, true},
		{"uefi-secure-boot-q35", map[string]string{"VirtletFirmware": "uefi", "VirtletSecureBoot": "true", "VirtletMachineType": "q35"},
			512 << 20, "1", "sda", 32 << 20, "", 512 << 10, "dev=/dev/sr0 label=cidata", "/ci/meta-data", q35, 0, true},
		// On q35 each virtio device sits behind a PCIe root port of its own.
		{"q35-clock-timers-topology", map[string]string{"VirtletMachineType": "q35", "VirtletClock": "+7200", "VirtletClockTimers": "hpet:no,rtc:catchup",
			"VirtletVCPUCount": "2", "VirtletCPUTopology": "sockets=1,cores=2", "VirtletDiskDriver": "virtio"},
			128 << 20, "2", "vda", 32 << 20, "", 128 << 10, "dev=/dev/vdb label=cidata", "/ci/meta-data", q35, 2 * time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			podJSON, ctrJSON := vmPod(t, d, tc.name, tc.ann, tc.memory)
			sb, ctr, logs := bootTiny(t, c, podJSON, ctrJSON)
			if got := marker(t, logs, "WATCHDOG"); got != "" {
				t.Errorf("guest has a watchdog %q it did not ask for", got)
			}
			wantFirmware := "bios SECUREBOOT="
			if tc.ann["VirtletFirmware"] == "uefi" {
				wantFirmware = map[bool]string{true: "uefi SECUREBOOT=enabled", false: "uefi SECUREBOOT=disabled"}[tc.ann["VirtletSecureBoot"] == "true"]
				checkNVRAM(t, c, ctr)
			}
			if got := markerLine(t, logs, "FIRMWARE"); got != wantFirmware {
				t.Errorf("guest's firmware %q, want %q", got, wantFirmware)
			}
			// Every VM has a virtio RNG fed by the host's /dev/urandom.
			if got := marker(t, logs, "RNG"); !strings.HasPrefix(got, "virtio_rng.") {
				t.Errorf("guest's hardware RNG %q, want the virtio RNG", got)
			}
			if got := markerLine(t, logs, "MACHINE"); !strings.Contains(got, tc.bridge) {
				t.Errorf("guest's machine: %q, want %s", got, tc.bridge)
			}
			rtc, err := time.Parse("2006-01-02T15:04:05Z", marker(t, logs, "RTC"))
			if ahead := rtc.Sub(time.Now().UTC()); err != nil || ahead < tc.clock-3*time.Minute || ahead > tc.clock+time.Minute {
				t.Errorf("guest's hardware clock %s (%v): %s ahead of UTC, want %s", rtc, err, ahead.Round(time.Second), tc.clock)
			}
			if got := strings.Contains(marker(t, logs, "CLOCKSOURCES"), "hpet"); got != tc.hpet {
				t.Errorf("guest's clock sources %q: hpet %v, want %v", marker(t, logs, "CLOCKSOURCES"), got, tc.hpet)
			}
			if tc.ann["VirtletCPUTopology"] == "sockets=1,cores=2" {
				if got := markerLine(t, logs, "TOPOLOGY"); got != "sockets=1 cores=2 siblings=2" {
					t.Errorf("guest's CPU topology %q, want one socket of two cores", got)
				}
			}
			if got := marker(t, logs, "CPUS"); got != tc.cpus {
				t.Errorf("guest sees %s CPUs, want %s", got, tc.cpus)
			}
			memK, _ := strconv.ParseInt(marker(t, logs, "MEMTOTAL_KB"), 10, 64)
			if memK > tc.maxMemK || memK < tc.maxMemK*6/10 {
				t.Errorf("guest MemTotal %d KiB, want a little under %d KiB", memK, tc.maxMemK)
			}
			wantDisk := fmt.Sprintf("@@DISK %s SIZE_BYTES=%d ", tc.disk, tc.size)
			if !strings.Contains(logs, wantDisk) {
				t.Errorf("console lacks %q:\n%s", wantDisk, logs)
			}
			// The guest kernel reads the cloud-init ISO with its exact names.
			if want := "@@CIDATA-MOUNTED " + tc.ciMedia; !strings.Contains(logs, want) {
				t.Errorf("console lacks %q:\n%s", want, logs)
			}
			if want := "----- " + tc.ciFile + "\n{"; !strings.Contains(logs, want) {
				t.Errorf("console lacks the meta-data file %s", tc.ciFile)
			}
			if got := marker(t, logs, "HOSTNAME"); got != tc.name {
				t.Errorf("meta-data hostname %q, want the pod name %q", got, tc.name)
			}
			if got := marker(t, logs, "SMBIOS_UUID"); tc.uuid != "" && !strings.EqualFold(got, tc.uuid) {
				t.Errorf("guest SMBIOS UUID %q, want %q", got, tc.uuid)
			} else if got == "" {
				t.Error("the guest sees no SMBIOS UUID")
			}
			c.Must(t, "stop", ctr) // no grace period: forced off
			if i := inspectCtr(t, c, ctr); i.Status.ExitCode != 137 || i.Status.Reason != "Killed" {
				t.Errorf("forced stop: %+v", i.Status)
			}
			c.Must(t, "rmp", "-f", sb)
		})
	}
	assertNothingLeft(t, d, c)
}

// checkNVRAM: a UEFI VM has a variable store of its own, which goes with
// the VM.
func checkNVRAM(t *testing.T, c *harness.Crictl, ctr string) {
	t.Helper()
	xml, err := harness.Virsh("dumpxml", inspectCtr(t, c, ctr).VM.Name)
	m := regexp.MustCompile(`<nvram[^>]*>([^<]+)</nvram>`).FindStringSubmatch(xml)
	if err != nil || m == nil {
		t.Errorf("a UEFI VM without its NVRAM (%v):\n%s", err, xml)
		return
	}
	if _, err := os.Stat(m[1]); err != nil {
		t.Errorf("the VM's NVRAM: %v", err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
			t.Errorf("the NVRAM %s outlives its VM (%v)", m[1], err)
		}
	})
}

// A guest that stops petting its watchdog is powered off by it, and the
// container says why.
func TestWatchdogStopsAStuckGuest(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "stuck", map[string]string{
		"VirtletWatchdog": "i6300esb", "VirtletWatchdogAction": "poweroff",
		// busybox's watchdog sets a 2 s timeout, pets once and then only
		// every 10 minutes.
		"VirtletCloudInitUserDataScript": "#!/bin/sh\nwatchdog -T 2 -t 600 /dev/watchdog && echo @@WATCHDOG-ARMED\n",
	}, 128<<20)
	sb := c.Must(t, "runp", podJSON)
	ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
	c.Must(t, "start", ctr)
	logs := waitLog(t, c, ctr, "@@WATCHDOG-ARMED", 3*time.Minute)
	if got := marker(t, logs, "WATCHDOG"); got != "i6300ESB_timer" {
		t.Errorf("the guest's watchdog: %q, want the i6300ESB timer", got)
	}
	var i inspect
	harness.Eventually(t, time.Minute, "the watchdog powers the VM off", func() bool {
		i = inspectCtr(t, c, ctr)
		return i.Status.State == "CONTAINER_EXITED"
	})
	if i.Status.ExitCode != 1 || i.Status.Reason != "Watchdog" || !strings.Contains(i.Status.Message, "i6300esb watchdog, which did poweroff") {
		t.Errorf("container after the watchdog fired: exit %d, reason %q, message %q", i.Status.ExitCode, i.Status.Reason, i.Status.Message)
	}
	c.Must(t, "rmp", "-f", sb)

	// The dump action, once the operator allows it: libvirtd writes the
	// guest's memory to its dump directory and the VM runs on; the VM
	// keeps its newest dump only and takes it along when it goes.
	d.Stop()
	d.Start("--allow-watchdog-dump")
	podJSON, ctrJSON = vmPod(t, d, "dumped", map[string]string{
		"VirtletWatchdog": "i6300esb", "VirtletWatchdogAction": "dump",
		"VirtletCloudInitUserDataScript": "#!/bin/sh\nwatchdog -T 2 -t 600 /dev/watchdog && echo @@WATCHDOG-ARMED\n",
	}, 128<<20)
	sb = c.Must(t, "runp", podJSON)
	ctr = c.Must(t, "create", sb, ctrJSON, podJSON)
	c.Must(t, "start", ctr)
	waitLog(t, c, ctr, "@@WATCHDOG-ARMED", 3*time.Minute)
	domain := inspectCtr(t, c, ctr).VM.Name
	dumps := func() []string {
		// libvirt.DefaultAutoDumpDir, libvirtd's auto_dump_path.
		// "<domain id>-<domain[:20]>-<time>".
		m, _ := filepath.Glob(filepath.Join("/var/lib/libvirt/qemu/dump", "*-"+domain[:min(20, len(domain))]+"-*"))
		return m
	}
	// Written while the guest is paused: most of its 128 MiB. Should the
	// watchdog fire again, a dump made, the older ones go (TestPruneDumps).
	harness.Eventually(t, 2*time.Minute, "the VM's memory dump, its newest alone", func() bool {
		d := dumps()
		if len(d) != 1 {
			return false
		}
		st, err := os.Stat(d[0])
		return err == nil && st.Size() >= 64<<20
	})
	if state := inspectCtr(t, c, ctr).Status.State; state != "CONTAINER_RUNNING" {
		t.Errorf("the VM after its dumps: %s", state)
	}
	c.Must(t, "rmp", "-f", sb)
	if left := dumps(); len(left) > 0 {
		t.Errorf("the VM's dumps outlive it: %v", left)
	}
	assertNothingLeft(t, d, c)
}

// A container given exclusive CPUs (kubelet's static CPU manager writes
// them into cpuset_cpus) gets its vCPU pinned to them and QEMU's emulator
// threads kept on the other CPUs; a CPU the node lacks is refused.
func TestVMPinnedToItsCPUs(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "pinned", nil, 128<<20)
	sb, ctr, _ := bootTiny(t, c, podJSON, withCPUSet(t, ctrJSON, "1"))
	domain := inspectCtr(t, c, ctr).VM.Name
	if out, err := harness.Virsh("vcpupin", domain); err != nil || !regexp.MustCompile(`(?m)^\s*0\s+1\s*$`).MatchString(out) {
		t.Errorf("vCPU 0's affinity (%v):\n%s", err, out)
	}
	if out, err := harness.Virsh("emulatorpin", domain); err != nil || !regexp.MustCompile(`(?m)^\s*\*:\s+0\s*$`).MatchString(out) {
		t.Errorf("the emulator threads' affinity (%v):\n%s", err, out)
	}
	c.Must(t, "rmp", "-f", sb)

	podJSON, ctrJSON = vmPod(t, d, "pinned-nowhere", nil, 128<<20)
	sb = c.Must(t, "runp", podJSON)
	defer c.Run("rmp", "-f", sb)
	_, errOut, err := c.Run("create", sb, withCPUSet(t, ctrJSON, "4095"), podJSON)
	if err == nil || !strings.Contains(errOut, "resources cpuset_cpus") || !strings.Contains(errOut, "CPU 4095 is not online on this node") {
		t.Errorf("a CPU the node lacks: %v %s", err, errOut)
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}

// A pod with a hugepages-2Mi limit gets its VM's memory backed by the
// host's 2 MiB pages, and gives them back when it goes; a VM the node has
// too few free pages for is refused, naming them.
func TestVMBackedByHugepages(t *testing.T) {
	parallel(t)
	if !mounted(t, "/dev/hugepages", "hugetlbfs") {
		t.Fatal("hugetlbfs is not mounted at /dev/hugepages (testing/setup.sh mounts it; libvirtd must start after)")
	}
	const nr = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
	before := hugepages(t)
	const vmPages = 64 // 128 MiB
	setHugepages(t, nr, before.total+vmPages)
	t.Cleanup(func() { setHugepages(t, nr, before.total) })
	ready := hugepages(t)
	if ready.free < before.free+vmPages {
		t.Fatalf("the host reserved %d of the %d 2 MiB pages asked for", ready.free-before.free, vmPages)
	}
	limit := func(bytes int64) func(*runtimeapi.LinuxContainerResources) {
		return func(r *runtimeapi.LinuxContainerResources) {
			r.HugepageLimits = []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: uint64(bytes)}, {PageSize: "1GB"}}
		}
	}
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)

	// One page more than the node has free.
	tooBig := int64(ready.free + 1)
	podJSON, ctrJSON := vmPod(t, d, "huge-too-big", nil, tooBig<<21)
	sb := c.Must(t, "runp", podJSON)
	_, errOut, err := c.Run("create", sb, withResources(t, ctrJSON, limit(tooBig<<21)), podJSON)
	if want := fmt.Sprintf("needs %d hugepages of 2048 KiB, the node has %d free", tooBig, ready.free); err == nil || !strings.Contains(errOut, want) {
		t.Errorf("a VM bigger than the free hugepages: %v %s (want %q)", err, errOut, want)
	}
	c.Must(t, "rmp", "-f", sb)

	podJSON, ctrJSON = vmPod(t, d, "huge", nil, vmPages<<21)
	sb = c.Must(t, "runp", podJSON)
	ctr := c.Must(t, "create", sb, withResources(t, ctrJSON, limit(vmPages<<21)), podJSON)
	c.Must(t, "start", ctr)
	logs := waitLog(t, c, ctr, "@@TINY-READY", 3*time.Minute)
	if memK, _ := strconv.ParseInt(marker(t, logs, "MEMTOTAL_KB"), 10, 64); memK < (128<<10)*6/10 || memK > 128<<10 {
		t.Errorf("guest MemTotal %d KiB, want a little under 128 MiB", memK)
	}
	xml, err := harness.Virsh("dumpxml", inspectCtr(t, c, ctr).VM.Name)
	if err != nil || !regexp.MustCompile(`<hugepages>\s*<page size='2048' unit='KiB'/>`).MatchString(xml) {
		t.Errorf("the running domain's memory backing (%v):\n%s", err, xml)
	}
	// QEMU maps the guest's memory from hugetlbfs: those pages are in use
	// or reserved for it.
	if got := hugepages(t); (ready.free-got.free)+(got.reserved-ready.reserved) < vmPages {
		t.Errorf("hugepages while the VM runs: %+v (before it %+v), want %d more of them used or reserved", got, ready, vmPages)
	}
	c.Must(t, "rmp", "-f", sb)
	harness.Eventually(t, 30*time.Second, "the VM's hugepages back to the host", func() bool { return hugepages(t) == ready })
	assertNothingLeft(t, d, c)
}

// hugepageCounts are /proc/meminfo's counts of default-size hugepages.
type hugepageCounts struct{ total, free, reserved int }

func hugepages(t *testing.T) hugepageCounts {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var h hugepageCounts
	for _, f := range []struct {
		name string
		to   *int
	}{{"HugePages_Total:", &h.total}, {"HugePages_Free:", &h.free}, {"HugePages_Rsvd:", &h.reserved}} {
		m := regexp.MustCompile(`(?m)^` + f.name + `\s+(\d+)`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("/proc/meminfo has no %s", f.name)
		}
		*f.to, _ = strconv.Atoi(string(m[1]))
	}
	return h
}

func setHugepages(t *testing.T, path string, n int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strconv.Itoa(n)), 0o644); err != nil {
		t.Fatalf("reserve %d hugepages: %v", n, err)
	}
}

// mounted tells whether a file system of type fstype is mounted at dir.
func mounted(t *testing.T, dir, fstype string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[1] == dir && f[2] == fstype {
			return true
		}
	}
	return false
}

// withCPUSet gives a container config file's resources a cpuset.
func withCPUSet(t *testing.T, cfgPath, cpus string) string {
	t.Helper()
	return withResources(t, cfgPath, func(r *runtimeapi.LinuxContainerResources) { r.CpusetCpus = cpus })
}

// withResources edits a container config file's resources.
func withResources(t *testing.T, cfgPath string, edit func(*runtimeapi.LinuxContainerResources)) string {
	t.Helper()
	return editJSON(t, cfgPath, func(cfg *runtimeapi.ContainerConfig) {
		if cfg.Linux == nil {
			cfg.Linux = &runtimeapi.LinuxContainerConfig{}
		}
		if cfg.Linux.Resources == nil {
			cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{}
		}
		edit(cfg.Linux.Resources)
	})
}

// withDNS rewrites the pod config at cfgPath with kubelet's resolver
// configuration.
func withDNS(t *testing.T, cfgPath string, dns *runtimeapi.DNSConfig) string {
	t.Helper()
	return editJSON(t, cfgPath, func(cfg *runtimeapi.PodSandboxConfig) { cfg.DnsConfig = dns })
}

// editJSON rewrites the JSON file at path (a CRI config) through edit.
func editJSON[T any](t *testing.T, path string, edit func(*T)) string {
	t.Helper()
	var v T
	readJSONFile(t, path, &v)
	edit(&v)
	return harness.WriteJSON(t, filepath.Dir(path), filepath.Base(path), &v)
}

// Two VMs from one image share its file: each root disk is a small overlay
// made in milliseconds.
func TestTwoVMsShareTheBase(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	imageID := strings.TrimPrefix(c.Must(t, "pull", tinyRef), "Image is up to date for ")
	base := filepath.Join(d.StateDir, "images", "sha256", strings.TrimPrefix(imageID, "sha256:"))
	var overlays []string
	for _, name := range []string{"vm-one", "vm-two"} {
		podJSON, ctrJSON := vmPod(t, d, name, nil, 128<<20)
		sb := c.Must(t, "runp", podJSON)
		ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
		overlay := filepath.Join(d.StateDir, "plugins", "libvirt", "vms", ctr+"-root.qcow2")
		out, err := exec.Command("qemu-img", "info", "--output=json", "-U", overlay).Output()
		if err != nil {
			t.Fatalf("qemu-img info %s: %v", overlay, err)
		}
		var info struct {
			Backing string `json:"full-backing-filename"`
			Actual  int64  `json:"actual-size"`
		}
		json.Unmarshal(out, &info)
		if info.Backing != base || info.Actual > 1<<20 {
			t.Fatalf("overlay %s: backing %q (want %q), %d bytes on disk", overlay, info.Backing, base, info.Actual)
		}
		overlays = append(overlays, overlay)
	}
	var millis []float64
	for _, e := range d.LogEntries() {
		if e["msg"] == "root disk overlay created" {
			if ms, ok := e["millis"].(float64); ok {
				millis = append(millis, ms)
			}
		}
	}
	if len(millis) != 2 || millis[1] > 1000 {
		t.Fatalf("overlay creation times (ms): %v", millis)
	}
	t.Logf("root disks created in %v ms; both back onto %s", millis, base)
	c.Must(t, append([]string{"rmp", "-f"}, strings.Fields(c.Must(t, "pods", "-q"))...)...)
	assertNothingLeft(t, d, c)
}

// Bad input fails CreateContainer with a clear error and leaves nothing.
func TestBadInputLeavesNothing(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	imageID := strings.TrimPrefix(c.Must(t, "pull", tinyRef), "Image is up to date for ")
	data := filepath.Join(d.StateDir, "images", "sha256", strings.TrimPrefix(imageID, "sha256:"))
	original, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		ann    map[string]string
		memory int64
		spoil  func()
		want   []string
	}{
		{"missing image file", nil, 128 << 20, func() { os.Remove(data) }, []string{"NotFound", "is missing from the image store"}},
		{"image file is not a disk", nil, 128 << 20, func() { os.WriteFile(data, []byte("<html>oops</html>"), 0o644) },
			[]string{"not a VM disk image"}},
		{"memory below the minimum", nil, 16 << 20, nil, []string{"resources.limits.memory", "at least 32Mi"}},
		{"cpu setting with an unknown key", map[string]string{"VirtletLibvirtCPUSetting": "Match: exact\nModle: {Value: core2duo}\n"}, 128 << 20, nil,
			[]string{"annotation VirtletLibvirtCPUSetting", `unknown field \"Modle\"`}},
		{"root volume smaller than the image", map[string]string{"VirtletRootVolumeSize": "1Mi"}, 128 << 20, nil,
			[]string{"annotation VirtletRootVolumeSize", "smaller than the image's virtual size"}},
		{"machine type the node's QEMU lacks", map[string]string{"VirtletMachineType": "pc-q35-1.0"}, 128 << 20, nil,
			[]string{"annotation VirtletMachineType", `invalid value \"pc-q35-1.0\"`, "no such machine type", "allowed: pc, pc-i440fx-"}},
		// Debian 12's libvirt 9.0 has no iTCO watchdog (9.1 has).
		{"itco watchdog on libvirt 9.0", map[string]string{"VirtletMachineType": "q35", "VirtletWatchdog": "itco"}, 128 << 20, nil,
			[]string{"annotation VirtletWatchdog", `invalid value \"itco\"`, "libvirt 9.0.0 has no iTCO watchdog", "allowed: i6300esb"}},
		// This machine's VMs run under TCG (its nested KVM crawls).
		{"memory dumps not enabled", map[string]string{"VirtletWatchdog": "i6300esb", "VirtletWatchdogAction": "dump"}, 128 << 20, nil,
			[]string{"annotation VirtletWatchdogAction", "has not enabled memory dumps"}},
		{"hyper-v on a TCG node", map[string]string{"VirtletHyperV": "true"}, 128 << 20, nil,
			[]string{"annotation VirtletHyperV", "Hyper-V enlightenments need KVM", "under tcg"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.spoil != nil {
				tc.spoil()
				defer os.WriteFile(data, original, 0o644)
			}
			podJSON, ctrJSON := vmPod(t, d, strings.ReplaceAll(tc.name, " ", "-"), tc.ann, tc.memory)
			sb := c.Must(t, "runp", podJSON)
			defer c.Run("rmp", "-f", sb)
			_, errOut, err := c.Run("create", sb, ctrJSON, podJSON)
			if err == nil {
				t.Fatal("create succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("error lacks %q:\n%s", w, errOut)
				}
			}
			assertNothingLeft(t, d, c)
		})
	}
	_, errOut, err := c.Run("pull", "virtlet.cloud/not-a-disk")
	if err == nil || !strings.Contains(errOut, "not a VM disk image") {
		t.Errorf("pull of an HTML page: %v %s", err, errOut)
	}
}

// A running VM survives a daemon restart and a crash of the hypervisor
// plugin; its console keeps reaching crictl logs.
func TestVMSurvivesDaemonRestartAndPluginCrash(t *testing.T) {
	parallel(t)
	d, c := startDaemon(t)
	c.Must(t, "pull", tinyRef)
	podJSON, ctrJSON := vmPod(t, d, "survivor", nil, 128<<20)
	sb, ctr, _ := bootTiny(t, c, podJSON, ctrJSON)
	domain := inspectCtr(t, c, ctr).VM.Name

	d.Stop()
	if state, _ := harness.Virsh("domstate", domain); state != "running" {
		t.Fatalf("the VM did not survive the daemon's stop: %q", state)
	}
	d.Start()
	var ps struct {
		Containers []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"containers"`
	}
	c.JSON(t, &ps, "ps", "-o", "json")
	if len(ps.Containers) != 1 || ps.Containers[0].ID != ctr || ps.Containers[0].State != "CONTAINER_RUNNING" {
		t.Fatalf("after the daemon restart: %+v", ps)
	}
	if logs, _, _ := c.Run("logs", ctr); !strings.Contains(logs, "@@TINY-READY") {
		t.Fatalf("the log before the restart is gone:\n%s", logs)
	}

	// Kill the hypervisor plugin: the VM runs on; the plugin comes back.
	for pid, cmd := range d.Children() {
		if strings.Contains(cmd, "virtlet-plugin-libvirt") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	harness.Eventually(t, time.Minute, "the libvirt plugin to come back", func() bool {
		var info struct {
			Plugins map[string]struct {
				State    string `json:"state"`
				Restarts int    `json:"restarts"`
			} `json:"plugins"`
		}
		c.JSON(t, &info, "info")
		return info.Plugins["libvirt"].State == "running" && info.Plugins["libvirt"].Restarts == 1
	})
	if state, _ := harness.Virsh("domstate", domain); state != "running" {
		t.Fatalf("the VM did not survive the plugin crash: %q", state)
	}
	// kubelet rotates the log: renames the file, then asks for a reopen.
	logPath := filepath.Join(d.Dir, "pods", "default_survivor", "survivor/0.log")
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	rt, _ := d.CRI(t)
	if _, err := rt.ReopenContainerLog(context.Background(), &runtimeapi.ReopenContainerLogRequest{ContainerId: ctr}); err != nil {
		t.Fatalf("ReopenContainerLog: %v", err)
	}
	// The console output after both restarts and the rotation reaches the new log.
	c.Must(t, "stop", "--timeout", "60", ctr)
	waitLog(t, c, ctr, "@@ACPI-POWER-BUTTON", time.Minute)
	if old, _ := os.ReadFile(logPath + ".1"); !strings.Contains(string(old), "@@TINY-READY") || strings.Contains(string(old), "@@ACPI-POWER-BUTTON") {
		t.Errorf("the rotated log should hold the boot and not the shutdown:\n%s", old)
	}
	if i := inspectCtr(t, c, ctr); i.Status.ExitCode != 0 || i.Status.Reason != "Completed" {
		t.Fatalf("after stop: %+v", i.Status)
	}
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
}
