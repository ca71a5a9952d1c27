package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// poolPlugins are the shipped plugins (loop devices allowed) with a pool
// of size pre-launched domains, and extra ones.
func poolPlugins(size int, extra ...harness.Plugin) []harness.Plugin {
	return append(harness.WithConfig(volumePlugins(), "libvirt", harness.PoolConfig(fmt.Sprint(size))), extra...)
}

// pooledDaemon starts a daemon with these plugins and pulls the tiny
// guest.
func pooledDaemon(t *testing.T, ps []harness.Plugin) (*harness.Daemon, *harness.Crictl) {
	t.Helper()
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), ps)
	// A pooled VM that died or stalled: who destroyed, claimed, started or
	// lost which domain, and why.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the daemon's and plugins' lifecycle log:\n%s", lifecycleLog(d))
		}
	})
	d.Translate("test-images.yaml", translation)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	c.Must(t, "pull", tinyRef)
	return d, c
}

// waitPool waits until the pool holds n domains launched paused, each
// ready for a claim (the plugin logs a launch once it is).
func waitPool(t *testing.T, d *harness.Daemon, n int) []string {
	t.Helper()
	return waitPoolIn(t, d.Dir, d.Log, n)
}

// waitPoolIn is waitPool for the libvirt plugin whose directory is dir
// and whose log is log's (a plugin a test runs alone).
func waitPoolIn(t *testing.T, dir string, log func() string, n int) []string {
	t.Helper()
	var doms []string
	harness.Eventually(t, 2*time.Minute, fmt.Sprintf("%d pool domains", n), func() bool {
		doms = harness.PoolDomainsUsing(dir)
		if len(doms) != n {
			return false
		}
		launched := harness.PoolLaunches(log())
		for _, dom := range doms {
			if state, _ := harness.Virsh("domstate", "--reason", dom); state != "paused (user)" || !launched[dom] {
				return false // starting up
			}
		}
		return true
	})
	sorted := slices.Clone(doms)
	slices.Sort(sorted)
	return sorted
}

// The guest's hardware as it reports it: the tiny guest's console markers
// (without what differs between any two VMs: UUID, clock, host name,
// MAC and address, timings) and, through its agent, the PCI functions
// with their IDs and IRQs, block devices, NICs and interrupt sources.
func guestHardware(t *testing.T, c *harness.Crictl, ctr, logs string) []string {
	t.Helper()
	volatile := regexp.MustCompile(` ?(uptime|ip|hostname|mac|port)=\S*`)
	// A SCSI disk's sdX name is the order in which the guest kernel's
	// asynchronous probes ended, which the hardware does not fix (two
	// cold boots of one VM can differ): SCSI disks are compared by their
	// serials and their SCSI addresses (below) instead.
	scsiName := regexp.MustCompile(`^@@DISK sd[a-z]+ `)
	// The kernel registers the TSC as tsc-early and replaces it by tsc
	// once a delayed work has refined its calibration (≈ 1 s after it
	// boots, later under load): which one the init script lists is when
	// it ran, not the hardware.
	tscEarly := regexp.MustCompile(`\btsc-early\b`)
	var hw, scsi []string
	for _, line := range strings.Split(logs, "\n") {
		i := strings.Index(line, "@@")
		if i < 0 || strings.Contains(line, "@@SMBIOS_UUID") || strings.Contains(line, "@@RTC") || strings.Contains(line, "@@HOSTNAME") {
			continue
		}
		fact := tscEarly.ReplaceAllString(volatile.ReplaceAllString(strings.TrimSpace(line[i:]), ""), "tsc")
		if scsiName.MatchString(fact) {
			scsi = append(scsi, scsiName.ReplaceAllString(fact, "@@DISK sd? "))
			continue
		}
		hw = append(hw, fact)
	}
	slices.Sort(scsi)
	hw = append(hw, scsi...)
	waitAgent(t, c, ctr, 2*time.Minute)
	const script = `for d in /sys/bus/pci/devices/*; do echo "pci $(basename $d) $(cat $d/vendor $d/device $d/subsystem_vendor $d/subsystem_device $d/class $d/irq | tr '\n' ' ')"; done
echo "block $(ls /sys/block | tr '\n' ' ')"; echo "net $(ls /sys/class/net | tr '\n' ' ')"
for b in /sys/block/*; do echo "sectors $(basename $b) $(cat $b/size)"; done
for b in /sys/block/sd*; do [ -e "$b" ] && echo "scsi $(basename $(readlink -f $b/device)) $(tail -c +5 $b/device/vpd_pg80 2>/dev/null | tr -d '\0 ')"; done | sort
sed -n 's/^ *\([^ ]*\):.* \([^ ]*\)$/irq \1 \2/p' /proc/interrupts`
	out := c.Must(t, "exec", "-s", "--timeout", "30", ctr, "sh", "-c", script)
	return append(hw, strings.Split(strings.TrimSpace(out), "\n")...)
}

// A VM claimed from the pool runs on the hardware a cold start gives the
// same pod: the same PCI functions at the same addresses, the same disks
// with the same serials, names (virtio), sizes and SCSI addresses, the
// same NIC, the same cloud-init medium (its own, written into the pool
// domain's placeholder). The first pod of a shape starts cold (the pool learns the shape
// from it), the second claims the pool domain launched meanwhile. A guest
// that reboots keeps its devices.
func TestPooledVMSeesTheSameHardware(t *testing.T) {
	parallel(t)
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 47})
	d, c := pooledDaemon(t, poolPlugins(1, tn.Plugin(bins)))
	for _, tc := range []struct {
		name string
		ann  map[string]string
	}{
		{"scsi", nil},
		{"virtio", map[string]string{"VirtletDiskDriver": "virtio"}},
		// Its disks and NICs are hot-plugged into the PCIe root ports the
		// pool domain was launched with.
		{"q35-virtio", map[string]string{"VirtletDiskDriver": "virtio", "VirtletMachineType": "q35"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hw [2][]string
			var ctrs [2]string
			var before []string // the pool before the cold VM taught it the shape
			for i, path := range []string{"cold", "pooled"} {
				name := fmt.Sprintf("pool-%s-%s", tc.name, path)
				k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: "uid-" + name}
				vol := flexMount(t, d, k, name, "data", map[string]string{"type": "qcow2", "capacity": "64MiB"})
				podJSON, ctrJSON := vmPod(t, d, name, tc.ann, 160<<20)
				ctrJSON = withMounts(t, d, ctrJSON, []map[string]interface{}{{"container_path": "/data", "host_path": vol}})
				if path == "cold" {
					before = harness.PoolDomainsUsing(d.Dir)
				} else {
					harness.Eventually(t, 2*time.Minute, "a pool domain of the shape", func() bool {
						doms := harness.PoolDomainsUsing(d.Dir)
						return len(doms) == 1 && !slices.Contains(before, doms[0]) && slices.Equal(waitPool(t, d, 1), doms)
					})
				}
				sb := c.Must(t, "runp", podJSON)
				t.Cleanup(func() { c.Run("rmp", "-f", sb) })
				ctrs[i] = c.Must(t, "create", sb, ctrJSON, podJSON)
				dom := inspectCtr(t, c, ctrs[i]).VM.Name
				if pooled := strings.HasPrefix(dom, "virtlet-pool-"); pooled != (path == "pooled") {
					t.Fatalf("the %s VM runs in domain %s", path, dom)
				}
				c.Must(t, "start", ctrs[i])
				logs := waitLog(t, c, ctrs[i], "@@TINY-READY", 3*time.Minute)
				if !strings.Contains(logs, "@@DHCP-BOUND iface=eth0") || !strings.Contains(logs, "SERIAL=vol-data") {
					t.Errorf("the %s VM lacks its NIC's lease or its volume:\n%s", path, logs)
				}
				// Its own cloud-init medium (a pooled VM's is written into
				// the pool domain's placeholder).
				if !strings.Contains(logs, "@@HOSTNAME="+name) {
					t.Errorf("the %s VM did not read its own cloud-init medium:\n%s", path, logs)
				}
				hw[i] = guestHardware(t, c, ctrs[i], logs)
			}
			if !slices.Equal(hw[0], hw[1]) {
				t.Fatalf("the pooled VM's hardware differs from the cold one's:\ncold:\n%s\npooled:\n%s", strings.Join(hw[0], "\n"), strings.Join(hw[1], "\n"))
			}
			t.Logf("%d facts about the hardware, the same both ways", len(hw[0]))

			// The pooled guest reboots itself: its devices stay.
			domain := inspectCtr(t, c, ctrs[1]).VM.Name
			c.Run("exec", "-s", "--timeout", "10", ctrs[1], "reboot", "-f")
			harness.Eventually(t, 3*time.Minute, "the guest booted twice", func() bool {
				logs, _, _ := c.Run("logs", ctrs[1])
				return strings.Count(logs, "@@TINY-READY") == 2
			})
			logs, _, _ := c.Run("logs", ctrs[1])
			second := logs[strings.LastIndex(logs, "@@TINY-INIT-START"):]
			if after := guestHardware(t, c, ctrs[1], second); !slices.Equal(after, hw[1]) {
				t.Fatalf("after a reboot the pooled VM's hardware changed:\nbefore:\n%s\nafter:\n%s", strings.Join(hw[1], "\n"), strings.Join(after, "\n"))
			}
			if after := inspectCtr(t, c, ctrs[1]); after.Status.State != "CONTAINER_RUNNING" || after.VM.Name != domain {
				t.Fatalf("after the guest's reboot: %+v", after)
			}
			for _, ctr := range ctrs {
				c.Must(t, "stop", ctr)
				c.Must(t, "rm", ctr)
			}
		})
	}
	c.Must(t, "rmp", "-a", "-f")
	assertNothingLeft(t, d, c)
	if n := len(harness.PoolDomainsUsing(d.Dir)); n > 1 {
		t.Errorf("%d pool domains, more than the pool's size", n)
	}
	d.Stop()
	if left := harness.PoolDomainsUsing(d.Dir); len(left) != 0 {
		t.Errorf("pool domains left after the daemon stopped: %v\n%s", left, poolLog(d))
	}
}

// poolLog is what the daemon's log says of the pool.
// lifecycleLog is what the daemon's log says of domains coming and going
// and of the plugins' restarts, at most the last 150 lines.
func lifecycleLog(d *harness.Daemon) string {
	re := regexp.MustCompile(`(?i)destroy|undefine|claim|"pool|resum|lost|reconcil|restart|exited|interrupted|no record|orphan|disappeared|plugin .*(start|stop|crash)|StartContainer|RemoveContainer|StopContainer|"VM started"`)
	var out []string
	for _, line := range strings.Split(d.Log(), "\n") {
		if re.MatchString(line) {
			out = append(out, line)
		}
	}
	if len(out) > 150 {
		out = out[len(out)-150:]
	}
	return strings.Join(out, "\n")
}

func poolLog(d *harness.Daemon) string {
	var out []string
	for _, line := range strings.Split(d.Log(), "\n") {
		if strings.Contains(line, "pool") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// The pool survives crashes and leaks nothing: its paused domains are
// taken up by the libvirt plugin that starts after one was killed, or
// after the daemon was; a VM claimed just before a kill is the pod's and
// starts; on a graceful stop the pool's domains go.
func TestPoolSurvivesCrashes(t *testing.T) {
	parallel(t)
	const size = 2
	d, c := pooledDaemon(t, poolPlugins(size))
	pods := 0
	run := func(t *testing.T) (sb, ctr string) {
		t.Helper()
		pods++
		podJSON, ctrJSON := vmPod(t, d, fmt.Sprintf("pool-crash-%d", pods), nil, 128<<20)
		sb = c.Must(t, "runp", podJSON)
		for attempt := 0; ; attempt++ {
			out, errOut, err := c.Run("create", sb, ctrJSON, podJSON)
			if err == nil {
				return sb, strings.TrimSpace(out)
			}
			if attempt == 20 {
				t.Fatalf("create after 20 attempts: %v %s", err, errOut)
			}
			time.Sleep(time.Second) // kubelet's retry
		}
	}
	libvirtPID := func() int {
		var pid int
		harness.Eventually(t, time.Minute, "the libvirt plugin running", func() bool {
			pid = pluginPID(t, c, "libvirt")
			return pid > 0
		})
		return pid
	}
	sb, ctr := run(t) // the first pod of the shape starts cold: the pool learns it
	c.Must(t, "start", ctr)
	pool := waitPool(t, d, size)

	// A killed plugin: the next one takes the pool up as it was.
	killed := libvirtPID()
	if err := syscallKill(killed); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "a new libvirt plugin", func() bool { p := pluginPID(t, c, "libvirt"); return p > 0 && p != killed })
	if got := waitPool(t, d, size); !slices.Equal(got, pool) {
		t.Fatalf("after the plugin's crash the pool is %v, was %v", got, pool)
	}
	// A killed daemon (its plugins die with it): the same.
	d.Kill()
	d.Start()
	if got := waitPool(t, d, size); !slices.Equal(got, pool) {
		t.Fatalf("after the daemon's crash the pool is %v, was %v", got, pool)
	}
	if state, _ := harness.Virsh("domstate", inspectCtr(t, c, ctr).VM.Name); state != "running" {
		t.Fatalf("the first VM is %s after the crashes", state)
	}

	// A kill right after a claim: the claimed VM is the pod's, and starts
	// once the plugin is back. (A kill inside a claim, at each of its
	// steps, is TestPoolClaimCrashes'.)
	waitPool(t, d, size)
	podJSON, ctrJSON := vmPod(t, d, "pool-kill", nil, 128<<20)
	claimedSB := c.Must(t, "runp", podJSON)
	claimed := c.Must(t, "create", claimedSB, ctrJSON, podJSON)
	if !harness.EventuallyOK(10*time.Second, func() bool { return strings.Contains(d.Log(), "VM claimed a pool domain") }) {
		t.Fatalf("the VM did not claim a pool domain:\n%s", poolLog(d))
	}
	pid := libvirtPID()
	if err := syscallKill(pid); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "a new libvirt plugin", func() bool { p := pluginPID(t, c, "libvirt"); return p > 0 && p != pid })
	harness.Eventually(t, time.Minute, "the claimed VM to start after the plugin's return", func() bool {
		_, _, err := c.Run("start", claimed)
		return err == nil
	})
	waitLog(t, c, claimed, "@@TINY-INIT-START", 3*time.Minute)
	// The claimed VM is confined as a cold one is, as a user of the
	// pool's range, its root disk the pool domain's overlay; the first
	// (cold) VM is its neighbour.
	claimedDomain := inspectCtr(t, c, claimed).VM.Name
	if !strings.HasPrefix(claimedDomain, "virtlet-pool-") {
		t.Fatalf("the claimed VM's domain is %s, not a pool domain's", claimedDomain)
	}
	checkConfinement(t, d, claimedDomain, claimed, inspectCtr(t, c, ctr).VM.Name)
	c.Must(t, "rmp", "-f", claimedSB)
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
	waitPool(t, d, size)
	// Nothing of the pool's outside it: console logs of its domains only.
	consoles, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "libvirt", "pool", "*.console"))
	if len(consoles) != size {
		t.Errorf("pool console logs %v, want the %d of its domains", consoles, size)
	}
	d.Stop()
	if left := harness.PoolDomainsUsing(d.Dir); len(left) != 0 {
		t.Errorf("pool domains left after the daemon stopped: %v\n%s", left, poolLog(d))
	}
	if files, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "libvirt", "pool", "virtlet-pool-*")); len(files) != 0 {
		t.Errorf("pool files left after the daemon stopped: %v\n%s", files, poolLog(d))
	}
}

// A claim the libvirt plugin's crash interrupts ends as no VM at all: at
// each step of a claim (its intent recorded, the VM's devices plugged in,
// the domain defined persistently) the plugin is killed once; the daemon
// restarts it, the creation is undone (the domain destroyed, its files
// gone), kubelet's retry makes the VM again, and it runs. The pool fills
// again; nothing is left.
func TestPoolClaimCrashes(t *testing.T) {
	parallel(t)
	for _, fp := range []string{"claim-recorded", "claim-plugged", "claim-defined"} {
		t.Run(fp, func(t *testing.T) {
			fired := filepath.Join(t.TempDir(), "failpoint-fired")
			ps := poolPlugins(1)
			for i := range ps {
				if ps[i].Name == "libvirt" {
					ps[i].Binary = filepath.Join(bins, "virtlet-plugin-libvirt-failpoints")
					ps[i].Args = []string{fmt.Sprintf("%q", "--failpoint="+fp), fmt.Sprintf("%q", "--failpoint-once="+fired)}
				}
			}
			d, c := pooledDaemon(t, ps)
			warmPod, warmCtr := vmPod(t, d, "warm", nil, 128<<20)
			warm := c.Must(t, "runp", warmPod)
			c.Must(t, "create", warm, warmCtr, warmPod) // cold: the pool learns the shape
			waitPool(t, d, 1)

			podJSON, ctrJSON := vmPod(t, d, "claimed", nil, 128<<20)
			sb := c.Must(t, "runp", podJSON)
			pid := pluginPID(t, c, "libvirt")
			if _, _, err := c.Run("create", sb, ctrJSON, podJSON); err == nil {
				t.Fatalf("the creation went through the failpoint %s:\n%s", fp, poolLog(d))
			}
			if _, err := os.Stat(fired); err != nil {
				t.Fatalf("the plugin did not reach %s: %v", fp, err)
			}
			harness.Eventually(t, time.Minute, "a new libvirt plugin", func() bool { p := pluginPID(t, c, "libvirt"); return p > 0 && p != pid })
			var ctr string
			harness.Eventually(t, time.Minute, "kubelet's retry creating the VM", func() bool {
				out, _, err := c.Run("create", sb, ctrJSON, podJSON)
				ctr = strings.TrimSpace(out)
				return err == nil
			})
			c.Must(t, "start", ctr)
			waitLog(t, c, ctr, "@@TINY-READY", 3*time.Minute)
			// Only the two pods' VMs exist: the one the crash interrupted
			// is gone.
			if doms := harness.DomainsUsing(d.Dir); len(doms) != 2 {
				t.Errorf("domains of VMs %v, want the two pods'", doms)
			}
			if !strings.Contains(d.Log(), "its claim was interrupted") {
				t.Errorf("the restarted plugin did not destroy the domain of the interrupted claim:\n%s", poolLog(d))
			}
			c.Must(t, "rmp", "-f", sb, warm)
			assertNothingLeft(t, d, c)
			// The pool's directory holds its domain's console log and
			// root overlay, nothing of a VM.
			pool := waitPool(t, d, 1)
			files, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "libvirt", "pool", "virtlet-pool-*"))
			for _, f := range files {
				if !strings.HasPrefix(filepath.Base(f), pool[0]) {
					t.Errorf("pool file %s is not its domain's (%s)", f, pool[0])
				}
			}
			d.Stop()
			if left := harness.PoolDomainsUsing(d.Dir); len(left) != 0 {
				t.Errorf("pool domains left after the daemon stopped: %v\n%s", left, poolLog(d))
			}
			if files, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "libvirt", "pool", "virtlet-pool-*")); len(files) != 0 {
				t.Errorf("pool files left after the daemon stopped: %v\n%s", files, poolLog(d))
			}
		})
	}
}

func syscallKill(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

// withMounts gives a container's config these mounts.
func withMounts(t *testing.T, d *harness.Daemon, ctrJSON string, mounts []map[string]interface{}) string {
	t.Helper()
	return withCtrField(t, d, ctrJSON, "mounts", mounts, "-mounts")
}
