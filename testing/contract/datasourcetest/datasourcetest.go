// Package datasourcetest is the contract every ports.Datasource writing
// ISO 9660 media must meet: the image carries the volume label and exactly
// the files its layout makes of the request (the layout itself is each
// datasource's own, golden-tested), the user-data byte for byte, and it is
// private to the plugin.
package datasourcetest

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"strings"
	"testing"

	"github.com/kdomanski/iso9660"

	"github.com/virtlet/virtlet/ports"
)

// Env is a datasource under test.
type Env struct {
	Datasource ports.Datasource
	Name       string // the datasource name the adapter handles
	Label      string // the ISO volume label it must write
	// Layout is the files, by ISO path, the image of a request must hold.
	Layout func(ports.MediaRequest) (map[string][]byte, error)
	// UserData is the path of the user-data file.
	UserData string
}

// Run checks the contract.
func Run(t *testing.T, env Env) {
	ctx := context.Background()
	full := ports.MediaRequest{
		VMID:          "0123456789abcdef",
		Datasource:    env.Name,
		MetaData:      []byte(`{"instance-id":"vm.default","local-hostname":"vm"}`),
		UserData:      []byte("#cloud-config\nusers:\n- name: test\n"),
		NetworkConfig: []byte("version: 1\nconfig:\n- {type: physical, name: eth0, mac_address: '52:54:00:00:00:01', subnets: [{type: static, address: 198.18.0.5/24}]}\n"),
		Network: &ports.NetworkAttachment{Interfaces: []ports.NetworkInterface{{Name: "eth0", MAC: "52:54:00:00:00:01",
			IPs: []ports.IPConfig{{Address: "198.18.0.5/24"}}}}},
	}
	layout := func(req ports.MediaRequest) map[string][]byte {
		t.Helper()
		files, err := env.Layout(req)
		if err != nil {
			t.Fatal(err)
		}
		return files
	}

	t.Run("the image has the label and exact files", func(t *testing.T) {
		d, err := env.Datasource.BuildMedia(ctx, full)
		if err != nil {
			t.Fatal(err)
		}
		if d.Device != ports.DeviceCDROM || !d.ReadOnly || d.Source.Type != ports.SourceFile || d.Source.Format != "raw" {
			t.Fatalf("disk %+v: want a read-only raw file CD-ROM", d)
		}
		label, files := ReadISO(t, d.Source.Path)
		if label != env.Label {
			t.Errorf("label %q, want %q", label, env.Label)
		}
		compare(t, files, layout(full))
		if string(files[env.UserData]) != string(full.UserData) {
			t.Errorf("%s = %q, want the request's user-data byte for byte", env.UserData, files[env.UserData])
		}
		st, err := os.Stat(d.Source.Path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("image mode %v, want 0600 (it may carry secrets)", st.Mode().Perm())
		}
	})
	t.Run("empty user-data and network config", func(t *testing.T) {
		req := full
		req.UserData, req.NetworkConfig, req.Network = nil, nil, nil
		d, err := env.Datasource.BuildMedia(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		_, files := ReadISO(t, d.Source.Path)
		compare(t, files, layout(req))
	})
	t.Run("building again replaces the media", func(t *testing.T) {
		req := full
		req.MetaData = []byte(`{"instance-id":"other"}`)
		d, err := env.Datasource.BuildMedia(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		_, files := ReadISO(t, d.Source.Path)
		compare(t, files, layout(req))
	})
	t.Run("remove deletes the media and is idempotent", func(t *testing.T) {
		d, err := env.Datasource.BuildMedia(ctx, full)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if err := env.Datasource.RemoveMedia(ctx, full.VMID); err != nil {
				t.Fatalf("remove #%d: %v", i+1, err)
			}
		}
		if _, err := os.Stat(d.Source.Path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("media still there: %v", err)
		}
	})
	t.Run("bad requests are invalid", func(t *testing.T) {
		for name, req := range map[string]ports.MediaRequest{
			"other datasource": {VMID: full.VMID, Datasource: "no-such-datasource", MetaData: full.MetaData},
			"path in VM ID":    {VMID: "../../etc/passwd", Datasource: env.Name, MetaData: full.MetaData},
		} {
			if _, err := env.Datasource.BuildMedia(ctx, req); !errors.Is(err, ports.ErrInvalidArgument) {
				t.Errorf("%s: err %v, want invalid argument", name, err)
			}
		}
	})
}

func compare(t *testing.T, got, want map[string][]byte) {
	t.Helper()
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			t.Errorf("missing %s (have %v)", p, keys(got))
			continue
		}
		if string(g) != string(w) {
			t.Errorf("%s = %q, want %q", p, g, w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected file %s", p)
		}
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// ReadISO returns an ISO 9660 image's volume label and every regular
// file by path.
func ReadISO(t testing.TB, p string) (string, map[string][]byte) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := iso9660.OpenImage(f)
	if err != nil {
		t.Fatalf("open ISO: %v", err)
	}
	label, err := img.Label()
	if err != nil {
		t.Fatal(err)
	}
	root, err := img.RootDir()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	var walk func(dir *iso9660.File, prefix string)
	walk = func(dir *iso9660.File, prefix string) {
		children, err := dir.GetChildren()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range children {
			name := path.Join(prefix, c.Name())
			if c.IsDir() {
				walk(c, name)
				continue
			}
			data, err := io.ReadAll(c.Reader())
			if err != nil {
				t.Fatal(err)
			}
			files[strings.TrimPrefix(name, "/")] = data
		}
	}
	walk(root, "")
	return label, files
}
