package boltstore_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/adapters/boltstore"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, filepath.Join(t.TempDir(), "virtlet.db"), func(t *testing.T, path string) ports.StateStore {
		s, err := boltstore.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestFileModeAndLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "virtlet.db")
	s, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", info.Mode(), err)
	}
	if _, err := boltstore.Open(path); err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second open: %v", err)
	}
}
