package kubefiles

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

// atomicWriterLayout lays out files as kubelet's atomic writer does.
func atomicWriterLayout(t *testing.T, dir string, files map[string]string, modes map[string]os.FileMode) {
	t.Helper()
	ts := filepath.Join(dir, "..2026_11_22_10_00_00.123456789")
	for name, data := range files {
		p := filepath.Join(ts, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if m, ok := modes[name]; ok {
			mode = m
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(ts)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join("..data", e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "volumes", "kubernetes.io~secret", "creds")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	atomicWriterLayout(t, dir,
		map[string]string{"password": "s3cret", "conf/app.ini": "[app]\n", "empty": ""},
		map[string]os.FileMode{"password": 0o400, "conf/app.ini": 0o640})
	got, err := Reader{}.Read(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []ports.ProjectedFile{
		{Path: "conf/app.ini", Data: []byte("[app]\n"), Mode: 0o640},
		{Path: "empty", Data: []byte{}, Mode: 0o644},
		{Path: "password", Data: []byte("s3cret"), Mode: 0o400},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d files: %+v", len(got), got)
	}
	for i := range want {
		if got[i].Path != want[i].Path || string(got[i].Data) != string(want[i].Data) || got[i].Mode != want[i].Mode {
			t.Errorf("file %d = %s %q %v, want %s %q %v", i, got[i].Path, got[i].Data, got[i].Mode, want[i].Path, want[i].Data, want[i].Mode)
		}
	}
}

func TestReadMissing(t *testing.T) {
	_, err := Reader{}.Read(context.Background(), filepath.Join(t.TempDir(), "nope"))
	if !errors.Is(err, ports.ErrNotFound) {
		t.Fatalf("err %v, want not found", err)
	}
}
