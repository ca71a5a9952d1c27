package core_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

// With VM users, every VM gets the lowest free user of the range, its
// shares are made for that user, a full range refuses a VM naming the
// setting, a removed VM's user is free again, and a restarted daemon
// knows which users its VMs hold.
func TestEveryVMHasAUserOfItsOwn(t *testing.T) {
	e := newEnv(t)
	e.users = &core.VMUsers{FirstUID: 200000, Count: 2, GID: 109}
	e.start(t)
	ctx := context.Background()
	runAs := func(id string) ports.ProcessIdentity {
		t.Helper()
		spec, ok := e.hv.Spec(id)
		if !ok || spec.RunAs == nil {
			t.Fatalf("VM %s: no user of its own: %+v", id, spec.RunAs)
		}
		return *spec.RunAs
	}
	a := e.createVM(t, e.runPod(t, "a", nil))
	sbB := e.runPod(t, "b", nil)
	cfg := vmContainer(e.pull(t))
	cfg.Mounts = []core.Mount{{ContainerPath: "/data", HostPath: volDir("kubernetes.io~empty-dir", "data")}}
	b, err := e.rt.CreateContainer(ctx, sbB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := runAs(a); got != (ports.ProcessIdentity{UID: 200000, GID: 109}) {
		t.Errorf("a runs as %+v", got)
	}
	if got := runAs(b); got != (ports.ProcessIdentity{UID: 200001, GID: 109}) {
		t.Errorf("b runs as %+v", got)
	}
	if req, ok := e.vols.Request(b, "data"); !ok || req.RunAs == nil || *req.RunAs != runAs(b) {
		t.Errorf("b's share was asked for %+v, want its user", req.RunAs)
	}
	_, err = e.rt.CreateContainer(ctx, e.runPod(t, "c", nil), vmContainer(e.pull(t)))
	if !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "all 2 VM users") {
		t.Fatalf("a VM beyond the range: %v", err)
	}
	if err := e.rt.RemoveContainer(ctx, a); err != nil {
		t.Fatal(err)
	}
	e.start(t) // the daemon restarts: b still holds 200001
	c := e.createVM(t, e.runPod(t, "d", nil))
	if got := runAs(c); got.UID != 200000 {
		t.Errorf("after a's removal and a restart, the next VM runs as %+v, want 200000", got)
	}
}

// By default every VM's group is its own too: its user's ID.
func TestEveryVMHasAGroupOfItsOwn(t *testing.T) {
	e := newEnv(t)
	e.users = &core.VMUsers{FirstUID: 300000, Count: 5, GID: core.OwnGroup}
	e.start(t)
	for i, name := range []string{"a", "b"} {
		id := e.createVM(t, e.runPod(t, name, nil))
		spec, _ := e.hv.Spec(id)
		if want := (ports.ProcessIdentity{UID: 300000 + i, GID: 300000 + i}); spec.RunAs == nil || *spec.RunAs != want {
			t.Errorf("VM %s runs as %+v, want %+v", name, spec.RunAs, want)
		}
	}
}

func TestVMUsersValidate(t *testing.T) {
	for _, tc := range []struct {
		u    core.VMUsers
		want string
	}{
		{core.VMUsers{FirstUID: 1000, Count: 10}, "first UID"},
		{core.VMUsers{FirstUID: 100000, Count: 0}, "count"},
		{core.VMUsers{FirstUID: 1<<31 - 5, Count: 10}, "count"},
		{core.VMUsers{FirstUID: 100000, Count: 10, GID: -2}, "GID"},
		{core.VMUsers{FirstUID: 100000, Count: 10, GID: core.OwnGroup}, ""},
		{core.VMUsers{FirstUID: 100000, Count: 10, GID: 109}, ""},
	} {
		err := tc.u.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.u, err, tc.want)
		}
	}
}

// The runtime refuses a range that Validate refuses, whoever built it.
func TestNewRefusesBadVMUsers(t *testing.T) {
	e := newEnv(t)
	_, err := core.New(core.Deps{Hypervisor: e.hv, ImageFiles: e.files, Store: e.store},
		core.Options{Log: quietLog(), VMUsers: &core.VMUsers{FirstUID: 1000, Count: 10}})
	if err == nil || !strings.Contains(err.Error(), "VM users' first UID") {
		t.Fatalf("a range among the node's own users: %v", err)
	}
}
