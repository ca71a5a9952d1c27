// Package hypervisortest is the contract every ports.Hypervisor must meet,
// whether called in-process or through its plugin.
package hypervisortest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// Env is a hypervisor under test.
type Env struct {
	Hypervisor ports.Hypervisor
	// NewSpec returns a valid spec for a fresh VM with the given ID (root
	// disk, console log, ...), for the implementation under test.
	NewSpec func(t *testing.T, id string) ports.VMSpec
	// StopTimeout is how long a graceful stop may take.
	StopTimeout time.Duration
	// GuestAgent: guests of NewSpec run a guest agent (exec must work);
	// else exec must fail at once with ErrFailedPrecondition.
	GuestAgent bool
	// Pooled: VMs of NewSpec are claimed from a pool of pre-launched VMs
	// (prelaunched once defined, under the pool's name), after a first
	// VM of their shape.
	Pooled bool
	// DomainXML returns libvirt's definition of a defined VM, for an
	// implementation that keeps no spec to read back (the libvirt
	// plugin): the spec round trip then finds each of the spec's settings
	// in it. An implementation with neither fails the round trip.
	DomainXML func(t *testing.T, id string) string
}

// Run checks the contract.
func Run(t *testing.T, env Env) {
	hv := env.Hypervisor
	ctx := context.Background()
	id := func(n int) string { return fmt.Sprintf("%064x", time.Now().UnixNano()+int64(n)) }

	t.Run("capabilities", func(t *testing.T) {
		c, err := hv.Capabilities(ctx)
		if err != nil || c.Name == "" || c.Accelerator == "" {
			t.Fatalf("%+v %v", c, err)
		}
	})

	t.Run("unknown VMs are ErrNotFound", func(t *testing.T) {
		if _, err := hv.Status(ctx, id(0)); !errors.Is(err, ports.ErrNotFound) {
			t.Errorf("Status: %v", err)
		}
		if err := hv.Undefine(ctx, id(0)); !errors.Is(err, ports.ErrNotFound) {
			t.Errorf("Undefine: %v", err)
		}
		if err := hv.Start(ctx, id(0)); !errors.Is(err, ports.ErrNotFound) {
			t.Errorf("Start: %v", err)
		}
		if err := hv.WriteFiles(ctx, id(0), []ports.GuestFile{{Path: "/etc/x", Data: []byte("x")}}); !errors.Is(err, ports.ErrNotFound) {
			t.Errorf("WriteFiles: %v", err)
		}
	})

	t.Run("lifecycle with events", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		events, err := hv.Watch(wctx)
		if err != nil {
			t.Fatal(err)
		}
		vmID := id(1)
		spec := env.NewSpec(t, vmID)
		if err := hv.Define(ctx, spec); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { hv.Undefine(context.Background(), vmID) })
		if err := hv.Define(ctx, spec); err != nil {
			t.Fatalf("defining the same spec again: %v", err)
		}
		changed := spec
		changed.VCPUs++
		if err := hv.Define(ctx, changed); !errors.Is(err, ports.ErrAlreadyExists) {
			t.Fatalf("redefining with another spec: %v", err)
		}
		st, err := hv.Status(ctx, vmID)
		if err != nil || st.State != ports.VMDefined || st.ID != vmID {
			t.Fatalf("after define: %+v %v", st, err)
		}
		if spec.UUID == "" && st.UUID == "" {
			t.Fatalf("the hypervisor gave no UUID to a VM whose spec has none: %+v", st)
		}
		if env.Pooled && (!st.Prelaunched || st.Name == spec.Name) {
			t.Fatalf("a VM of the pool's shape was not claimed from it: %+v", st)
		}
		if err := hv.Start(ctx, vmID); err != nil {
			t.Fatal(err)
		}
		// Files go into the root file system before the first boot only.
		if err := hv.WriteFiles(ctx, vmID, []ports.GuestFile{{Path: "/etc/x", Data: []byte("x")}}); !errors.Is(err, ports.ErrFailedPrecondition) {
			t.Errorf("WriteFiles after the first boot: %v", err)
		}
		if err := hv.Start(ctx, vmID); err != nil {
			t.Fatalf("second start: %v", err)
		}
		waitEvent(t, events, vmID, ports.VMRunning)
		st, _ = hv.Status(ctx, vmID)
		if st.State != ports.VMRunning || st.StartedAt.IsZero() {
			t.Fatalf("after start: %+v", st)
		}
		list, err := hv.List(ctx)
		if err != nil || !contains(list, vmID) {
			t.Fatalf("List %+v %v", list, err)
		}
		stopped, err := hv.Stop(ctx, vmID, env.StopTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if stopped.State != ports.VMStopped || stopped.ExitCode != 0 || stopped.FinishedAt.IsZero() || stopped.Reason == "" {
			t.Fatalf("graceful stop: %+v", stopped)
		}
		waitEvent(t, events, vmID, ports.VMStopped)
		again, err := hv.Stop(ctx, vmID, env.StopTimeout)
		if err != nil || again.State != ports.VMStopped {
			t.Fatalf("second stop: %+v %v", again, err)
		}
		// A stopped VM starts again, the same VM (a run strategy halts
		// VMs in place), claimed from the pool or not.
		if err := hv.Start(ctx, vmID); err != nil {
			t.Fatalf("start after a stop: %v", err)
		}
		waitEvent(t, events, vmID, ports.VMRunning)
		if st, _ := hv.Status(ctx, vmID); st.State != ports.VMRunning || st.Prelaunched {
			t.Fatalf("after the restart: %+v", st)
		}
		if st, err := hv.Stop(ctx, vmID, 0); err != nil || st.State != ports.VMStopped {
			t.Fatalf("stop after the restart: %+v %v", st, err)
		}
		if err := hv.Undefine(ctx, vmID); err != nil {
			t.Fatal(err)
		}
		if _, err := hv.Status(ctx, vmID); !errors.Is(err, ports.ErrNotFound) {
			t.Fatalf("after undefine: %v", err)
		}
	})

	t.Run("forced stop", func(t *testing.T) {
		vmID := id(2)
		if err := hv.Define(ctx, env.NewSpec(t, vmID)); err != nil {
			t.Fatal(err)
		}
		defer hv.Undefine(ctx, vmID)
		if err := hv.Start(ctx, vmID); err != nil {
			t.Fatal(err)
		}
		st, err := hv.Stop(ctx, vmID, 0)
		if err != nil || st.State != ports.VMStopped || st.ExitCode == 0 {
			t.Fatalf("stop with no grace period: %+v %v", st, err)
		}
	})

	t.Run("reaching a running VM", func(t *testing.T) { runAccess(t, env, id(4)) })

	t.Run("spec round trip", func(t *testing.T) {
		r, ok := hv.(interface {
			Spec(string) (ports.VMSpec, bool)
		})
		if !ok && env.DomainXML == nil {
			t.Fatal("the contract cannot see what was defined: the implementation keeps no spec and Env has no DomainXML")
		}
		vmID := id(3)
		spec := env.NewSpec(t, vmID)
		zero := 0 // libvirt numbers a guest's NUMA cells from 0
		spec.CPU = ports.CPUSpec{Model: "host-model", Setting: &ports.CPUSetting{Match: "exact",
			Model: &ports.CPUSettingModel{Fallback: "allow", Value: "core2duo"}, Topology: &ports.CPUTopology{Sockets: 1, Cores: 1, Threads: 1},
			Features: []ports.CPUFeature{{Policy: "require", Name: "vmx"}}, Numa: &ports.CPUNuma{Cells: []ports.CPUNumaCell{{ID: &zero, CPUs: "0", Memory: 128, Unit: "MiB"}}}}}
		spec.Filesystems = []ports.Filesystem{{Source: "/srv", Tag: "srv", AccessMode: "squash"}}
		spec.NICs = []ports.NIC{{Name: "eth0", MAC: "52:54:00:00:00:01", MTU: 1500, Bridge: "vtcontract0"}}
		if err := hv.Define(ctx, spec); err != nil {
			t.Fatal(err)
		}
		defer hv.Undefine(ctx, vmID)
		if ok {
			got, _ := r.Spec(vmID)
			if !reflect.DeepEqual(got, spec) {
				t.Fatalf("spec changed in transit:\n got %#v\nwant %#v", got, spec)
			}
		}
		if env.DomainXML != nil {
			checkDomain(t, env.DomainXML(t, vmID), spec)
		}
	})
}

// checkDomain finds the round trip's settings in libvirt's definition of
// the VM: the CPU definition whole, the 9p share and the NIC's address
// and MTU, in the units libvirt keeps them.
func checkDomain(t *testing.T, domainXML string, spec ports.VMSpec) {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(domainXML); err != nil {
		t.Fatalf("the domain's XML: %v", err)
	}
	want := spec.CPU.Setting
	cpu := d.CPU
	if cpu == nil || cpu.Match != want.Match || cpu.Model == nil || cpu.Model.Value != want.Model.Value || cpu.Model.Fallback != want.Model.Fallback {
		t.Errorf("the domain's CPU %+v, want match %s, model %s with fallback %s", cpu, want.Match, want.Model.Value, want.Model.Fallback)
	} else {
		if top := cpu.Topology; top == nil || top.Sockets != want.Topology.Sockets || top.Cores != want.Topology.Cores || top.Threads != want.Topology.Threads {
			t.Errorf("the domain's CPU topology %+v, want %+v", top, want.Topology)
		}
		if len(cpu.Features) != len(want.Features) || cpu.Features[0].Name != want.Features[0].Name || cpu.Features[0].Policy != want.Features[0].Policy {
			t.Errorf("the domain's CPU features %+v, want %+v", cpu.Features, want.Features)
		}
		cell := want.Numa.Cells[0]
		if cpu.Numa == nil || len(cpu.Numa.Cell) != 1 || cpu.Numa.Cell[0].ID == nil || int(*cpu.Numa.Cell[0].ID) != *cell.ID ||
			cpu.Numa.Cell[0].CPUs != cell.CPUs || kib(cpu.Numa.Cell[0].Memory, cpu.Numa.Cell[0].Unit) != kib(uint(cell.Memory), cell.Unit) {
			t.Errorf("the domain's NUMA cells %+v, want %+v", cpu.Numa, want.Numa)
		}
	}
	fs := spec.Filesystems[0]
	var shared bool
	for _, f := range d.Devices.Filesystems {
		if f.Source != nil && f.Source.Mount != nil && f.Source.Mount.Dir == fs.Source && f.Target != nil && f.Target.Dir == fs.Tag && f.AccessMode == fs.AccessMode {
			shared = true
		}
	}
	if !shared {
		t.Errorf("no filesystem %s tagged %s (%s) in the domain: %+v", fs.Source, fs.Tag, fs.AccessMode, d.Devices.Filesystems)
	}
	nic := spec.NICs[0]
	var found bool
	for _, i := range d.Devices.Interfaces {
		if i.MAC != nil && strings.EqualFold(i.MAC.Address, nic.MAC) && i.MTU != nil && int(i.MTU.Size) == nic.MTU &&
			i.Source != nil && i.Source.Bridge != nil && i.Source.Bridge.Bridge == nic.Bridge {
			found = true
		}
	}
	if !found {
		t.Errorf("no NIC %s with MTU %d on bridge %s in the domain", nic.MAC, nic.MTU, nic.Bridge)
	}
}

// kib converts a libvirt memory figure to KiB.
func kib(n uint, unit string) uint {
	switch strings.ToLower(unit) {
	case "b", "bytes":
		return n / 1024
	case "", "k", "kib":
		return n
	case "m", "mib":
		return n << 10
	case "g", "gib":
		return n << 20
	}
	return 0 // a unit the check does not know never matches
}

func contains(list []ports.VMStatus, id string) bool {
	for _, st := range list {
		if st.ID == id {
			return true
		}
	}
	return false
}

func waitEvent(t *testing.T, events <-chan ports.VMStatus, id string, state ports.VMState) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case st, ok := <-events:
			if !ok {
				t.Fatalf("event stream closed while waiting for %s", state)
			}
			if st.ID == id && st.State == state {
				return
			}
		case <-timeout:
			t.Fatalf("no %s event for %s", state, id)
		}
	}
}
