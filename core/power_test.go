package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// virtletctl stop keeps the pod's container running for kubelet with its
// VM off; everything that needs the VM says it is halted; the halt
// survives a daemon restart and the VM's stop events; start boots the same
// VM, whose CPU time goes on from where it was.
func TestHaltKeepsTheContainerAndStartBootsTheSameVM(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	_, id := e.runningVM(t, "p")
	before, _ := e.hv.Spec(id)
	time.Sleep(20 * time.Millisecond) // some CPU time for the fake to report
	stats, err := e.rt.ContainerStats(ctx, id)
	if err != nil || stats.Usage == nil {
		t.Fatalf("stats of the running VM: %+v, %v", stats, err)
	}
	cpuBefore := stats.Usage.CPUNanos

	if err := e.rt.HaltVM(ctx, id, time.Second); err != nil {
		t.Fatalf("HaltVM: %v", err)
	}
	if st, _ := e.hv.Status(ctx, id); st.State != ports.VMStopped {
		t.Fatalf("the VM after a halt: %+v", st)
	}
	halted := func(what string) {
		t.Helper()
		c, err := e.rt.ContainerStatus(ctx, id)
		if err != nil || c.State != core.ContainerRunning || !c.Halted() {
			t.Fatalf("%s: container %s halted=%v (%v), want running and halted", what, c.State, c.Halted(), err)
		}
	}
	halted("after the halt")
	e.settled(t) // the VM's stop event is applied
	halted("after the VM's stop event")
	if err := e.rt.HaltVM(ctx, id, time.Second); err != nil {
		t.Errorf("a second halt: %v", err)
	}

	// Exec probes must fail, not err (kubelet ignores a probe that errs).
	res, err := e.rt.ExecSync(ctx, id, []string{"true"}, time.Second)
	if err != nil || res.ExitCode != core.ExitHalted {
		t.Errorf("exec probe of a halted VM: %+v, %v; want exit code %d", res, err, core.ExitHalted)
	}
	lacks(t, "exec's stderr", string(res.Stderr), "halted", "virtletctl start p boots it")
	for what, err := range map[string]error{
		"exec":   e.rt.CheckExec(id, []string{"true"}, false),
		"attach": e.rt.CheckAttach(id),
		"status": func() error { _, err := e.rt.GuestInfo(ctx, id); return err }(),
	} {
		if !errors.Is(err, ports.ErrFailedPrecondition) {
			t.Errorf("%s of a halted VM: %v, want FailedPrecondition", what, err)
			continue
		}
		lacks(t, what, err.Error(), "halted", "virtletctl start p boots it")
	}
	if s, err := e.rt.ContainerStats(ctx, id); err != nil || s.Usage != nil {
		t.Errorf("stats of a halted VM: %+v, %v (want none: the VM uses nothing)", s.Usage, err)
	}
	if err := e.rt.ReopenContainerLog(ctx, id); err != nil {
		t.Errorf("kubelet rotating a halted VM's log: %v", err)
	}
	if n := e.rt.Counts().HaltedVMs; n != 1 {
		t.Errorf("halted VMs counted: %d", n)
	}

	e.start(t) // a daemon restart: the halt is recorded, the VM stays off
	halted("after a daemon restart")

	if err := e.rt.BootVM(ctx, id); err != nil {
		t.Fatalf("BootVM: %v", err)
	}
	c, _ := e.rt.ContainerStatus(ctx, id)
	if c.State != core.ContainerRunning || c.Halted() || c.BootedAt.IsZero() {
		t.Fatalf("after start: %s halted=%v booted at %v", c.State, c.Halted(), c.BootedAt)
	}
	if st, _ := e.hv.Status(ctx, id); st.State != ports.VMRunning {
		t.Fatalf("the VM after start: %+v", st)
	}
	after, _ := e.hv.Spec(id)
	if after.Name != before.Name || after.UUID != before.UUID || len(after.Disks) != len(before.Disks) || after.Disks[0].Source.Path != before.Disks[0].Source.Path {
		t.Errorf("start booted another VM: %+v, was %+v", after, before)
	}
	stats, err = e.rt.ContainerStats(ctx, id)
	if err != nil || stats.Usage == nil || stats.Usage.CPUNanos < cpuBefore {
		t.Errorf("CPU time after the boot: %+v (%v), was %d before the halt: a container's CPU time never goes back", stats.Usage, err, cpuBefore)
	}
	if res, err := e.rt.ExecSync(ctx, id, []string{"hostname"}, time.Second); err != nil || res.ExitCode != 0 {
		t.Errorf("exec after start: %+v %v", res, err)
	}
}

// restart power-cycles the VM in the same container; a halted VM is just
// started. Only a running container's VM can be powered.
func TestRebootAndRefusals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, id := e.runningVM(t, "p")
	first, _ := e.hv.Status(ctx, id)
	time.Sleep(10 * time.Millisecond)
	if err := e.rt.RebootVM(ctx, id, time.Second); err != nil {
		t.Fatalf("RebootVM: %v", err)
	}
	second, _ := e.hv.Status(ctx, id)
	c, _ := e.rt.ContainerStatus(ctx, id)
	if second.State != ports.VMRunning || !second.StartedAt.After(first.StartedAt) || c.State != core.ContainerRunning || c.Halted() {
		t.Fatalf("after restart: VM %+v (first boot %v), container %s halted=%v", second, first.StartedAt, c.State, c.Halted())
	}
	e.settled(t) // the stop and start events are applied
	if c, _ := e.rt.ContainerStatus(ctx, id); c.State != core.ContainerRunning {
		t.Fatalf("the reboot's stop event ended the container: %+v", c)
	}
	if err := e.rt.HaltVM(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.RebootVM(ctx, id, time.Second); err != nil {
		t.Fatalf("restart of a halted VM: %v", err)
	}
	if st, _ := e.hv.Status(ctx, id); st.State != ports.VMRunning {
		t.Fatalf("restart of a halted VM left it %s", st.State)
	}

	// kubelet stopping the container of a halted VM ends it as usual.
	if err := e.rt.HaltVM(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.StopContainer(ctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	c, _ = e.rt.ContainerStatus(ctx, id)
	if c.State != core.ContainerExited || c.Halted() {
		t.Fatalf("StopContainer of a halted VM: %+v", c)
	}
	lacks(t, "exit message", c.Message, "halted")
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"stop", func() error { return e.rt.HaltVM(ctx, id, 0) }},
		{"start", func() error { return e.rt.BootVM(ctx, id) }},
		{"restart", func() error { return e.rt.RebootVM(ctx, id, 0) }},
	} {
		err := op.call()
		if !errors.Is(err, ports.ErrFailedPrecondition) {
			t.Errorf("%s of an exited container: %v", op.name, err)
			continue
		}
		lacks(t, op.name, err.Error(), "exited", "restartPolicy")
	}
	created := e.createVM(t, sb)
	if err := e.rt.HaltVM(ctx, created, 0); !errors.Is(err, ports.ErrFailedPrecondition) {
		t.Errorf("halt of a created VM: %v", err)
	}
}

// A halt whose VM did not stop leaves no halt mark; a VM booted after a
// halt mark (a start interrupted before it was recorded) runs again once
// its status arrives.
func TestHaltMarkFollowsTheVM(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	_, id := e.runningVM(t, "p")
	e.hv.Fail["Stop"] = errors.New("libvirt said no")
	if err := e.rt.HaltVM(ctx, id, 0); err == nil {
		t.Fatal("a halt whose stop failed succeeded")
	}
	delete(e.hv.Fail, "Stop")
	if c, _ := e.rt.ContainerStatus(ctx, id); c.Halted() {
		t.Fatal("a VM that did not stop is marked halted")
	}

	if err := e.rt.HaltVM(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := e.hv.Start(ctx, id); err != nil { // the plugin started it; the core did not record it
		t.Fatal(err)
	}
	eventually(t, "the halt mark to be cleared by the VM's start", func() bool {
		c, _ := e.rt.ContainerStatus(ctx, id)
		return c.State == core.ContainerRunning && !c.Halted()
	})
	vm, err := e.hv.Status(ctx, id)
	if c, _ := e.rt.ContainerStatus(ctx, id); err != nil || !c.BootedAt.Equal(vm.StartedAt) {
		t.Fatalf("the boot by hand is recorded at %v, the VM started at %v (%v)", c.BootedAt, vm.StartedAt, err)
	}
}
