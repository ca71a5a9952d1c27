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
}

// Run checks the contract.
func Run(t *testing.T, env Env) {
	ctx := context.Background()
	t.Run("prepare is idempotent, release removes, release again succeeds", func(t *testing.T) {
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
		if env.Exists(t, att) {
			t.Fatal("released volume still has data")
		}
		if err := env.Volumes.Release(ctx, req); err != nil {
			t.Fatalf("second release: %v", err)
		}
	})
	t.Run("volumes of different VMs are separate", func(t *testing.T) {
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
			t.Fatalf("err %v", err)
		}
	})
}
