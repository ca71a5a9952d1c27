// Package imagefilestest is the contract every ports.ImageFiles must meet.
package imagefilestest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Run checks f, a fresh empty store.
func Run(t *testing.T, f ports.ImageFiles) {
	ctx := context.Background()
	data := []byte("QFI\xfb disk image bytes")
	d := digest(data)

	if _, err := f.Path(ctx, d); !errors.Is(err, ports.ErrNotFound) {
		t.Fatalf("Path of absent data: %v", err)
	}
	tmp, err := f.NewTemp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	path, err := f.Commit(ctx, tmp, d)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != string(data) {
		t.Fatalf("stored %q", got)
	}
	if p, err := f.Path(ctx, d); err != nil || p != path {
		t.Fatalf("Path %q %v, want %q", p, err, path)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left after commit: %v", err)
	}

	// Committing the same content again succeeds and drops the duplicate.
	tmp2, _ := f.NewTemp(ctx)
	os.WriteFile(tmp2, data, 0o600)
	if p, err := f.Commit(ctx, tmp2, d); err != nil || p != path {
		t.Fatalf("second commit %q %v", p, err)
	}
	if _, err := os.Stat(tmp2); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("duplicate download left behind")
	}
	if list, _ := f.List(ctx); len(list) != 1 || list[0] != d {
		t.Fatalf("List %v", list)
	}
	u, err := f.Usage(ctx)
	if err != nil || u.UsedBytes == 0 || u.InodesUsed == 0 || u.Mountpoint == "" {
		t.Fatalf("Usage %+v %v", u, err)
	}

	tmp3, _ := f.NewTemp(ctx)
	os.WriteFile(tmp3, []byte("partial"), 0o600)
	if err := f.Discard(ctx, tmp3); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp3); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("Discard left the file")
	}
	if err := f.Remove(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(ctx, d); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if list, _ := f.List(ctx); len(list) != 0 {
		t.Fatalf("List after remove %v", list)
	}
}
