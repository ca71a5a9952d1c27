package hypervisortest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

// checkpointRunning checkpoints a running VM: the state file and a copy
// of each writable disk are in the directory, in their formats, the guest
// was paused meanwhile, and the VM runs on. An implementation without
// checkpoints says so (ErrUnimplemented) for running VMs and unknown ones
// alike.
func checkpointRunning(t *testing.T, hv ports.Hypervisor, vc ports.VMCheckpointer, vmID string) {
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := vc.CheckpointVM(ctx, "0000000000000000", dir); !errors.Is(err, ports.ErrNotFound) && !errors.Is(err, ports.ErrUnimplemented) {
		t.Errorf("checkpoint of an unknown VM: %v", err)
	}
	cp, err := vc.CheckpointVM(ctx, vmID, dir)
	if errors.Is(err, ports.ErrUnimplemented) {
		t.Logf("no checkpoints: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint: %+v", cp)
	if st, err := hv.Status(ctx, vmID); err != nil || st.State != ports.VMRunning {
		t.Fatalf("after the checkpoint: %+v %v", st, err)
	}
	if cp.Paused <= 0 || cp.Machine == "" || cp.Accelerator == "" {
		t.Errorf("the checkpoint does not say how long the guest was paused, or what it ran on: %+v", cp)
	}
	// libvirt's save image begins with its magic; a qcow2 file with its own.
	magic := map[string][]byte{"state": []byte("LibvirtQemudSave"), "qcow2": []byte("QFI\xfb")}
	expect := func(what, rel string, want []byte) {
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		if want != nil && !bytes.HasPrefix(data, want) {
			t.Errorf("%s %s begins with %q, not %q", what, rel, data[:min(len(data), len(want))], want)
		}
	}
	expect("state file", cp.StateFile, magic["state"])
	expect("definition", cp.DefinitionFile, nil)
	if len(cp.Disks) == 0 {
		t.Fatalf("no disk copied: %+v", cp)
	}
	for _, d := range cp.Disks {
		if d.Format == "qcow2" {
			expect("disk "+d.Name, d.File, magic["qcow2"])
		} else {
			expect("disk "+d.Name, d.File, nil)
		}
	}
}
