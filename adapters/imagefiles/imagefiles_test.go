package imagefiles_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/adapters/imagefiles"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/imagefilestest"
)

func TestContract(t *testing.T) {
	s, err := imagefiles.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	imagefilestest.Run(t, s)
}

func TestStalePartialsRemovedAtOpen(t *testing.T) {
	dir := t.TempDir()
	s, _ := imagefiles.Open(dir)
	tmp, _ := s.NewTemp(context.Background())
	os.WriteFile(tmp, []byte("half a download"), 0o600)
	if _, err := imagefiles.Open(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("stale partial survived a restart")
	}
}

func TestInputsCannotEscapeTheStore(t *testing.T) {
	dir := t.TempDir()
	s, _ := imagefiles.Open(dir)
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("keep me"), 0o600)
	ctx := context.Background()
	for name, err := range map[string]error{
		"commit foreign file":  func() error { _, err := s.Commit(ctx, victim, "sha256:"+strings.Repeat("a", 64)); return err }(),
		"discard foreign file": s.Discard(ctx, victim),
		"discard traversal":    s.Discard(ctx, filepath.Join(dir, "tmp", "..", "..", "victim")),
		"remove bad digest":    s.Remove(ctx, "sha256:../../victim"),
		"path bad digest":      func() error { _, err := s.Path(ctx, "../x"); return err }(),
	} {
		if !errors.Is(err, ports.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", name, err)
		}
	}
	if data, _ := os.ReadFile(victim); string(data) != "keep me" {
		t.Fatal("a file outside the store was touched")
	}
}

// The store is private: others may pass through its directories but not
// list them, and read no image; an older store's 0644 images are made
// private when it opens.
func TestStoreIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	s, err := imagefiles.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tmp, _ := s.NewTemp(ctx)
	os.WriteFile(tmp, []byte("a private image"), 0o644)
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	p, err := s.Commit(ctx, tmp, digest)
	if err != nil {
		t.Fatal(err)
	}
	mode := func(p string) os.FileMode {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm()
	}
	if m := mode(p); m != 0o600 {
		t.Errorf("image mode %o, want 600", m)
	}
	for _, d := range []string{dir, filepath.Dir(p), filepath.Dir(tmp)} {
		if m := mode(d); m != 0o711 {
			t.Errorf("%s: mode %o, want 711", d, m)
		}
	}
	// An older store's image and directory.
	os.Chmod(p, 0o644)
	os.Chmod(filepath.Dir(p), 0o755)
	if _, err := imagefiles.Open(dir); err != nil {
		t.Fatal(err)
	}
	if m := mode(p); m != 0o600 {
		t.Errorf("an older image's mode %o after Open, want 600", m)
	}
	if m := mode(filepath.Dir(p)); m != 0o711 {
		t.Errorf("an older store's directory mode %o after Open, want 711", m)
	}
}
