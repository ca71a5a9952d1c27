package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/plugins/datasource"
	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/ports"
)

func configured(t *testing.T) *vfat {
	for _, tool := range []string{"mkfs.vfat", "mcopy", "mlabel"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (dosfstools, mtools)", tool)
		}
	}
	v := &vfat{}
	if err := v.Configure(context.Background(), ports.PluginConfig{StateDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	return v
}

// The seed is a FAT image labelled CIDATA holding NoCloud's files, built
// through the plugin shims as the daemon calls it.
func TestSeedOverTheShims(t *testing.T) {
	c := datasource.NewClient(sdktest.Conn(t, configured(t)))
	ctx := context.Background()
	req := ports.MediaRequest{VMID: "0123456789abcdef", Datasource: Type, MetaData: []byte(`{"instance-id":"p.ns"}`),
		UserData: []byte("#cloud-config\nhostname: x\n"), NetworkConfig: []byte("version: 1\n")}
	d, err := c.BuildMedia(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Device != ports.DeviceDisk || !d.ReadOnly || d.Source.Format != "raw" {
		t.Fatalf("disk %+v", d)
	}
	if st, _ := os.Stat(d.Source.Path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", st.Mode())
	}
	label, _ := exec.Command("mlabel", "-s", "-i", d.Source.Path, "::").CombinedOutput()
	if !strings.Contains(string(label), "CIDATA") {
		t.Errorf("label %q", label)
	}
	for name, want := range map[string]string{"meta-data": string(req.MetaData), "user-data": string(req.UserData), "network-config": "version: 1\n"} {
		got, err := exec.Command("mtype", "-i", d.Source.Path, "::/"+name).Output()
		if err != nil || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", name, got, err, want)
		}
	}
	if err := c.RemoveMedia(ctx, req.VMID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Source.Path); !errors.Is(err, os.ErrNotExist) {
		t.Error("seed left after RemoveMedia")
	}
	if _, err := c.BuildMedia(ctx, ports.MediaRequest{VMID: "../x", Datasource: Type}); !errors.Is(err, ports.ErrInvalidArgument) {
		t.Errorf("bad VM ID: %v", err)
	}
}
