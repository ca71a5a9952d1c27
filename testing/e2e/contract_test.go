package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
	"sigs.k8s.io/yaml"

	lv "github.com/virtlet/virtlet/adapters/libvirt"
	"github.com/virtlet/virtlet/plugins/host"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/hypervisortest"
	"github.com/virtlet/virtlet/testing/harness"
)

// The tests that need the node's libvirtd and host network to
// themselves, though not both cores: the hypervisor contracts and the
// crash matrix, side by side (as many at a time as the slots allow) and beside no other
// test. The contracts make no network namespace, host link or libvirt
// secret, which the crash matrix counts host-wide; the crash matrix
// neither kills libvirtd (TestLibvirtdKilled does, alone) nor loads both
// cores.
func TestLibvirtdSharedByFew(t *testing.T) {
	t.Run("CrashMatrix", func(t *testing.T) { parallel(t); testCrashMatrix(t) })
	t.Run("LibvirtHypervisorContract", func(t *testing.T) { parallel(t); testLibvirtHypervisorContract(t) })
	t.Run("LibvirtHypervisorContractPooled", func(t *testing.T) { parallel(t); testLibvirtHypervisorContractPooled(t) })
}

// The hypervisor contract, against the libvirt plugin as a process.
func testLibvirtHypervisorContract(t *testing.T) {
	dir := harness.VMDir(t)
	h := libvirtPlugin(t, dir, "")
	hypervisortest.Run(t, hypervisortest.Env{
		Hypervisor: h.Hypervisor(),
		NewSpec: func(t *testing.T, id string) ports.VMSpec {
			spec := tinyVMSpec(dir, id, "contract")
			spec.UUID = uuid.NewString()
			return spec
		},
		StopTimeout: 90 * time.Second,
		GuestAgent:  true, // the tiny guest runs qemu-guest-agent
		DomainXML:   domainXML(h.Hypervisor()),
	})
}

// tinyVMSpec is a VM of the tiny guest for a test of the libvirt plugin
// alone: one vCPU, 128 MiB, its root an overlay of the tiny image, its
// console log under dir; pod names its pod and ends its domain's name.
func tinyVMSpec(dir, id, pod string) ports.VMSpec {
	return ports.VMSpec{ID: id, Name: fmt.Sprintf("virtlet-%s-%s", id[len(id)-12:], pod),
		PodName: pod, PodNamespace: "e2e", VCPUs: 1, MemoryBytes: 128 << 20,
		Disks: []ports.Disk{{Name: "root", Device: ports.DeviceDisk, Bus: ports.BusVirtio, Boot: true,
			Source: ports.DiskSource{Type: ports.SourceFile, Format: "qcow2"}, Overlay: &ports.DiskOverlay{BasePath: tiny, BaseFormat: "qcow2"}}},
		ConsoleLogPath: filepath.Join(dir, "logs", id+".log")}
}

// domainXML returns libvirt's definition of a VM of hv, for the contract's
// spec round trip.
func domainXML(hv ports.Hypervisor) func(t *testing.T, id string) string {
	return func(t *testing.T, id string) string {
		t.Helper()
		st, err := hv.Status(context.Background(), id)
		if err != nil || st.Name == "" {
			t.Fatalf("the status of VM %s: %+v %v", id, st, err)
		}
		out, err := harness.Virsh("dumpxml", "--inactive", st.Name)
		if err != nil {
			t.Fatalf("virsh dumpxml %s: %v %s", st.Name, err, out)
		}
		return out
	}
}

// The same contract for VMs claimed from the plugin's pool of pre-launched
// domains: the shape is learnt from a first VM (cold), whose pool domain
// the contract's VMs then claim, one after the other.
func testLibvirtHypervisorContractPooled(t *testing.T) {
	dir := harness.VMDir(t)
	p := libvirtPluginUnderTest(t, dir, "{pool: {size: 1}}")
	hv, pluginLog := p.host.Hypervisor(), p.log
	newSpec := func(t *testing.T, id string) ports.VMSpec {
		spec := tinyVMSpec(dir, id, "contract")
		spec.RunAs = p.runAs(0)
		return spec
	}
	first := fmt.Sprintf("%064x", time.Now().UnixNano())
	if err := hv.Define(context.Background(), newSpec(t, first)); err != nil {
		t.Fatal(err)
	}
	if err := hv.Undefine(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	// The pool domain is ready for a claim once the plugin logs its launch
	// (libvirt lists it while QEMU still starts: a claim then starts cold).
	waitPool := func(t *testing.T) { waitPoolIn(t, dir, pluginLog.String, 1) }
	waitPool(t)
	hypervisortest.Run(t, hypervisortest.Env{
		Hypervisor: hv,
		NewSpec: func(t *testing.T, id string) ports.VMSpec {
			waitPool(t) // refilled after the previous claim
			return newSpec(t, id)
		},
		StopTimeout: 90 * time.Second,
		GuestAgent:  true,
		Pooled:      true,
		DomainXML:   domainXML(hv),
	})
}

// Two libvirt plugins with their own state on one libvirtd (two daemons,
// or a test's daemon beside a node's) see only their own domains: neither
// lists the other's VM, takes it for an orphan or removes it; nor a VM
// that claimed a pool domain (whose metadata is set on the live domain).
func TestLibvirtPluginsShareLibvirtd(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	dirA, dirB := harness.VMDir(t), harness.VMDir(t)
	pa := libvirtPluginUnderTest(t, dirA, "{pool: {size: 1}}")
	a, b, logA := pa.host.Hypervisor(), libvirtPlugin(t, dirB, "").Hypervisor(), pa.log
	newSpec := func(name string) ports.VMSpec {
		spec := tinyVMSpec(dirA, fmt.Sprintf("%064x", time.Now().UnixNano()), name)
		spec.RunAs = pa.runAs(0)
		return spec
	}
	listed := func(hv ports.Hypervisor, id string) bool {
		vms, err := hv.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, vm := range vms {
			if vm.ID == id {
				return true
			}
		}
		return false
	}
	check := func(t *testing.T, spec ports.VMSpec) {
		id := spec.ID
		if !listed(a, id) {
			t.Fatalf("the plugin that defined VM %s does not list it", id)
		}
		if listed(b, id) {
			t.Fatalf("another plugin instance lists VM %s as its own (it would remove it as an orphan)", id)
		}
		if err := b.Undefine(ctx, id); !errors.Is(err, ports.ErrNotFound) {
			t.Fatalf("another plugin instance's Undefine of VM %s: %v, want not found", id, err)
		}
		if st, err := a.Status(ctx, id); err != nil || st.State != ports.VMDefined {
			t.Fatalf("VM %s after the other plugin's calls: %+v %v", id, st, err)
		}
	}
	define := func(t *testing.T, spec ports.VMSpec) {
		if err := a.Define(ctx, spec); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Undefine(context.Background(), spec.ID) })
	}
	// A cold VM (it also teaches the pool its shape).
	cold := newSpec("shared")
	define(t, cold)
	check(t, cold)
	// A VM that claimed the pool domain launched for that shape.
	waitPoolIn(t, dirA, logA.String, 1)
	pooled := newSpec("sharedpool")
	define(t, pooled)
	st, err := a.Status(ctx, pooled.ID)
	if err != nil || !strings.HasPrefix(st.Name, "virtlet-pool-") {
		t.Fatalf("the second VM did not claim the pool domain: %+v %v", st, err)
	}
	check(t, pooled)

	// A domain claimed before claims recorded their owner: the other
	// instance takes it for its own, until the owning plugin's next start
	// names itself in the domain.
	legacy := fmt.Sprintf(`<vm id=%q pod="e2e/sharedpool" createdBy="virtlet"/>`, pooled.ID)
	if out, err := harness.Virsh("metadata", st.Name, lv.MetadataNS, "--key", "virtlet", "--set", legacy, "--config"); err != nil {
		t.Fatalf("virsh metadata --set: %v %s", err, out)
	}
	harness.Virsh("metadata", st.Name, lv.MetadataNS, "--key", "virtlet", "--set", legacy, "--live")
	if !listed(b, pooled.ID) {
		t.Fatalf("a domain without an owner is not taken for every instance's: the check below would prove nothing")
	}
	pa.host.Shutdown()
	a = libvirtPluginUnderTest(t, dirA, "{pool: {size: 1}}").host.Hypervisor()
	check(t, pooled)
}

// libvirtPlugin runs the libvirt plugin as a process with this config.
func libvirtPlugin(t *testing.T, dir, config string) *host.Host {
	t.Helper()
	return libvirtPluginUnderTest(t, dir, config).host
}

// pluginUnderTest is a libvirt plugin a test runs as a process, its log,
// and the users its VMs may run as (RunAs), the test's own.
type pluginUnderTest struct {
	host    *host.Host
	log     *harness.Screen
	vmUsers harness.UserRange
}

// runAs is the i-th user of the plugin's VM range.
func (p pluginUnderTest) runAs(i int) *ports.ProcessIdentity {
	uid := p.vmUsers.First + i
	return &ports.ProcessIdentity{UID: uid, GID: uid}
}

// libvirtPluginUnderTest runs the libvirt plugin as a process with this
// config; a pool takes its users from a range of the test's own.
func libvirtPluginUnderTest(t *testing.T, dir, config string) pluginUnderTest {
	t.Helper()
	bin := filepath.Join(bins, "virtlet-plugin-libvirt")
	sum, _ := manifest.FileSHA256(bin)
	// The plugin's log is shown when the test fails.
	logBuf := &harness.Screen{}
	log := logrus.New()
	log.SetOutput(logBuf)
	log.SetFormatter(&logrus.JSONFormatter{})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("libvirt plugin's log (%s):\n%s", dir, logBuf.String())
		}
	})
	vmUsers, poolUsers := harness.UserRanges()
	config, err := harness.WithPoolUsers(config, poolUsers)
	if err != nil {
		t.Fatal(err)
	}
	m := manifest.Manifest{Name: "libvirt", Kind: ports.KindHypervisor, Command: bin, SHA256: sum, File: "test"}
	if config != "" {
		js, err := yaml.YAMLToJSON([]byte(config))
		if err != nil {
			t.Fatal(err)
		}
		m.Config = js
	}
	// After the plugin stops: what its VM users were granted on
	// libvirtd's directories, had a kill left it. Its own ranges only: a
	// contract running beside it keeps its VMs' grants.
	t.Cleanup(func() { harness.RevokeUsers(vmUsers, poolUsers) })
	h, err := host.Start(context.Background(), []manifest.Manifest{m}, host.Options{StateDir: filepath.Join(dir, "plugins"), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Shutdown)
	return pluginUnderTest{host: h, log: logBuf, vmUsers: vmUsers}
}
