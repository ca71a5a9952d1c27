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
