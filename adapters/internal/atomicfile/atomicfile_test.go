package atomicfile_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
)

func TestWriteReplacesTheFileWithTheModeAsked(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "r.json")
	if err := os.WriteFile(p+atomicfile.TempSuffix, []byte("left by a crash"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, content := range []string{"first", "second, longer"} {
		if err := atomicfile.Write(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Fatalf("content %q %v, want %q", got, err, content)
		}
	}
	info, err := os.Stat(p)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", info.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("directory holds %v, want only the file", entries)
	}
}

func TestAFailedWriteKeepsTheOldContent(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "r.json")
	if err := atomicfile.Write(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("encoder failed")
	err := atomicfile.WriteFunc(p, 0o600, func(w io.Writer) error {
		io.WriteString(w, "half of the new")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("error %v", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "old" {
		t.Fatalf("content %q after a failed write", got)
	}
	if _, err := os.Stat(p + atomicfile.TempSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left: %v", err)
	}
}

func TestQuarantineSetsTheFileAside(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "r.json")
	os.WriteFile(p, []byte("{garbage"), 0o600)
	aside, err := atomicfile.Quarantine(p, time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(aside) != dir || !strings.HasPrefix(filepath.Base(aside), "r.json"+atomicfile.QuarantineMarker+"20250102T030405") {
		t.Fatalf("set aside as %s", aside)
	}
	if got, _ := os.ReadFile(aside); string(got) != "{garbage" {
		t.Fatalf("quarantined content %q", got)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file is still in place: %v", err)
	}
}

// What a write killed before its rename left is removed, and nothing else.
func TestRemoveTempsRemovesInterruptedWrites(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"a.json": "kept", "a.json" + atomicfile.TempSuffix: "torn", "b.iso" + atomicfile.TempSuffix: "torn", "notes.txt": "kept"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := atomicfile.RemoveTemps(dir)
	if err != nil || len(removed) != 2 {
		t.Fatalf("removed %v, %v", removed, err)
	}
	entries, _ := os.ReadDir(dir)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if strings.Join(left, " ") != "a.json notes.txt" {
		t.Fatalf("left %v", left)
	}
	if removed, err := atomicfile.RemoveTemps(filepath.Join(dir, "missing")); err != nil || removed != nil {
		t.Fatalf("a missing directory: %v %v", removed, err)
	}
}
