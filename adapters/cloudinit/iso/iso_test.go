package iso_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/virtlet/virtlet/adapters/cloudinit/configdrive"
	"github.com/virtlet/virtlet/adapters/cloudinit/iso"
	"github.com/virtlet/virtlet/adapters/cloudinit/nocloud"
	"github.com/virtlet/virtlet/plugins/datasource"
	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/datasourcetest"
)

// Both datasources meet the contract in process and through the plugin
// shims, with the file layout of docs/cloud-init.md.
func TestDatasourceContract(t *testing.T) {
	for _, tc := range []struct {
		new      func() *iso.Media
		name     string
		label    string
		layout   iso.Layout
		userData string
	}{
		{nocloud.New, "nocloud", "cidata", nocloud.Layout, "user-data"},
		{configdrive.New, "configdrive", "config-2", configdrive.Layout, "openstack/latest/user_data"},
	} {
		configured := func(t *testing.T) datasource.Adapter {
			m := tc.new()
			if err := m.Configure(context.Background(), ports.PluginConfig{StateDir: t.TempDir()}); err != nil {
				t.Fatal(err)
			}
			return m
		}
		t.Run(tc.name, func(t *testing.T) {
			datasourcetest.Run(t, datasourcetest.Env{Datasource: configured(t), Name: tc.name, Label: tc.label, Layout: tc.layout, UserData: tc.userData})
		})
		t.Run(tc.name+" over the plugin", func(t *testing.T) {
			c := datasource.NewClient(sdktest.Conn(t, configured(t)))
			datasourcetest.Run(t, datasourcetest.Env{Datasource: c, Name: tc.name, Label: tc.label, Layout: tc.layout, UserData: tc.userData})
		})
	}
}

// The plugin leaves the process environment alone (TMPDIR included: the
// host gives each plugin process a private one), and a build leaves
// nothing in the temporary directory.
func TestConfigureLeavesTheEnvironmentAlone(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	m := nocloud.New()
	if err := m.Configure(context.Background(), ports.PluginConfig{StateDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if got := os.Getenv("TMPDIR"); got != tmp {
		t.Fatalf("TMPDIR changed to %s", got)
	}
	req := ports.MediaRequest{VMID: "0123456789abcdef", Datasource: "nocloud", UserData: []byte("#cloud-config\n"), MetaData: []byte("{}")}
	if _, err := m.BuildMedia(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Fatalf("the build left %v in TMPDIR", entries)
	}
}

// A plugin killed while writing an image leaves its temporary file (which
// may hold secrets): the next start removes every one, and RemoveMedia
// removes the VM's own; finished images stay.
func TestPartialImagesAreRemoved(t *testing.T) {
	state := t.TempDir()
	media := filepath.Join(state, "media")
	os.MkdirAll(media, 0o711)
	partial := filepath.Join(media, "0123456789abcdef.iso.tmp")
	done := filepath.Join(media, "fedcba9876543210.iso")
	for _, p := range []string{partial, done} {
		if err := os.WriteFile(p, []byte("password: hunter2"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m := nocloud.New()
	if err := m.Configure(context.Background(), ports.PluginConfig{StateDir: state}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(partial); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a partial image survived the start: %v", err)
	}
	if _, err := os.Stat(done); err != nil {
		t.Errorf("a finished image: %v", err)
	}
	os.WriteFile(partial, []byte("password: hunter2"), 0o600)
	if err := m.RemoveMedia(context.Background(), "0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(partial); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("RemoveMedia left the partial image: %v", err)
	}
}

// Every image is a whole number of MediaAlign blocks, zeros after its file
// system, and reads back whole: one datasource's media have one size.
func TestImagesArePaddedToOneSize(t *testing.T) {
	dir := t.TempDir()
	small := map[string][]byte{"meta-data": []byte("{}")}
	big := map[string][]byte{"meta-data": []byte("{}"), "user-data": make([]byte, iso.MediaAlign+5)}
	for name, files := range map[string]map[string][]byte{"small": small, "big": big} {
		p := filepath.Join(dir, name+".iso")
		if err := iso.Write(p, "cidata", files); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		want := int64(iso.MediaAlign)
		if name == "big" {
			want = 2 * iso.MediaAlign
		}
		if st.Size() != want {
			t.Errorf("%s image: %d bytes, want %d", name, st.Size(), want)
		}
		label, got := datasourcetest.ReadISO(t, p)
		if label != "cidata" || len(got) != len(files) || len(got["user-data"]) != len(files["user-data"]) {
			t.Errorf("%s image reads back as %q with %d files", name, label, len(got))
		}
	}
}
