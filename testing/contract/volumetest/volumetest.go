// Package volumetest is the contract every ports.Volumes must meet.
package volumetest

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

// Env is a volume implementation under test.
type Env struct {
	Volumes ports.Volumes
	// Request returns a valid request for a fresh volume of the type under test.
	Request func(t *testing.T, vmID, name string) ports.VolumeRequest
	// Exists reports whether the prepared volume's data exists.
	Exists func(t *testing.T, att ports.VolumeAttachment) bool
	// Invalid is a request the implementation must refuse.
	Invalid ports.VolumeRequest
	// Persistent volumes keep their data when released (raw devices,
	// Ceph images); ephemeral ones lose it.
	Persistent bool
	// Shared: two VMs' requests may name the same data (a device, an
	// image), so "volumes of different VMs are separate" does not apply.
	Shared bool
	// NotFlexvolume: the type is only for Kubernetes volumes (directory
	// shares, block devices); Validate must refuse every request.
	NotFlexvolume bool
	// NamesFiles: the plugin names files or directories after the VM's
	// ID and the volume's name (kubelet's volume directory, the
	// flexvolume driver's argument); a name that would lead out of its
	// directory must be refused before anything is made.
	NamesFiles bool
}

// escapingNames are VM IDs and volume names that would lead a path out of
// a plugin's directory, or be cut short by the kernel.
var escapingNames = []struct{ vm, name string }{
	{"vm-esc", "../escape"}, {"vm-esc", ".."}, {"vm-esc", "."}, {"vm-esc", "/etc/passwd"}, {"vm-esc", "a/b"},
	{"vm-esc", "nul\x00x"}, {"vm-esc", ""}, {"../vm", "data"}, {"..", "data"}, {"/vm", "data"}, {"vm\x00x", "data"},
}

// Run checks the contract.
func Run(t *testing.T, env Env) {
	ctx := context.Background()
	if env.NamesFiles {
		t.Run("names that would lead out of the plugin's directory are refused", func(t *testing.T) {
			for _, n := range escapingNames {
				req := env.Request(t, n.vm, n.name)
				if att, err := env.Volumes.Prepare(ctx, req); !errors.Is(err, ports.ErrInvalidArgument) {
					t.Errorf("Prepare of VM %q volume %q: %+v %v, want an invalid-argument error", n.vm, n.name, att, err)
					env.Volumes.Release(ctx, req)
				}
			}
		})
	}
	t.Run("prepare is idempotent, release undoes it, release again succeeds", func(t *testing.T) {
		req := env.Request(t, "vm-1", "data")
		att, err := env.Volumes.Prepare(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(att.Disks)+len(att.Filesystems) == 0 {
			t.Fatal("prepared volume attaches nothing")
		}
		for _, d := range att.Disks {
			if d.Name == "" || d.Source.Type == "" {
				t.Fatalf("disk without name or source: %+v", d)
			}
		}
		if !env.Exists(t, att) {
			t.Fatal("prepared volume has no data")
		}
		again, err := env.Volumes.Prepare(ctx, req)
		if err != nil || !reflect.DeepEqual(again, att) {
			t.Fatalf("second prepare: %+v %v, want %+v", again, err, att)
		}
		if err := env.Volumes.Release(ctx, req); err != nil {
			t.Fatal(err)
		}
		if exists := env.Exists(t, att); exists != env.Persistent {
			t.Fatalf("after release, the volume's data exists: %v; the volume is persistent: %v", exists, env.Persistent)
		}
		if err := env.Volumes.Release(ctx, req); err != nil {
			t.Fatalf("second release: %v", err)
		}
	})
	t.Run("volumes of different VMs are separate", func(t *testing.T) {
		if env.Shared {
			t.Skip("the requests name shared data")
		}
		a, err := env.Volumes.Prepare(ctx, env.Request(t, "vm-a", "data"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := env.Volumes.Prepare(ctx, env.Request(t, "vm-b", "data"))
		if err != nil {
			t.Fatal(err)
		}
		if reflect.DeepEqual(a, b) {
			t.Fatal("two VMs got the same volume")
		}
		env.Volumes.Release(ctx, env.Request(t, "vm-a", "data"))
		if !env.Exists(t, b) {
			t.Fatal("releasing one VM's volume removed another's")
		}
		env.Volumes.Release(ctx, env.Request(t, "vm-b", "data"))
	})
	t.Run("invalid requests are refused as invalid", func(t *testing.T) {
		if _, err := env.Volumes.Prepare(ctx, env.Invalid); !errors.Is(err, ports.ErrInvalidArgument) {
			t.Fatalf("prepare: err %v", err)
		}
		if _, err := env.Volumes.Validate(ctx, env.Invalid); !errors.Is(err, ports.ErrInvalidArgument) {
			t.Fatalf("validate: err %v", err)
		}
	})
	if env.NotFlexvolume {
		t.Run("not a flexvolume type: validate refuses", func(t *testing.T) {
			if _, err := env.Volumes.Validate(ctx, env.Request(t, "vm-v", "data")); !errors.Is(err, ports.ErrInvalidArgument) {
				t.Fatalf("validate: err %v", err)
			}
		})
		return
	}
	t.Run("validate keeps options a later prepare accepts; forget is idempotent", func(t *testing.T) {
		req := env.Request(t, "vm-v", "data")
		kept, err := env.Volumes.Validate(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for k := range kept {
			if _, ok := req.Options[k]; !ok {
				t.Errorf("validate invented option %q", k)
			}
		}
		again := req
		again.Options = kept
		if _, err := env.Volumes.Prepare(ctx, again); err != nil {
			t.Fatalf("prepare with the kept options: %v", err)
		}
		if err := env.Volumes.Release(ctx, again); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if err := env.Volumes.Forget(ctx, req); err != nil {
				t.Fatalf("forget %d: %v", i, err)
			}
		}
	})
}
