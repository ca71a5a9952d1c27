package crilog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "0.log")
	w, err := Open(path, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	fixed := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC)
	w.now = func() time.Time { return fixed }
	for _, chunk := range []string{"Linux version 6.1\r\n", "login", ": ", "root\nlast"} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(strings.Repeat("x", MaxLine+5) + "\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	ts := "2026-11-22T10:00:00.123456789Z"
	want := ts + " stdout F Linux version 6.1\n" +
		ts + " stdout F login: root\n" +
		ts + " stdout P last\n" +
		ts + " stdout P " + strings.Repeat("x", MaxLine) + "\n" +
		ts + " stdout F xxxxx\n"
	if string(got) != want {
		t.Fatalf("log:\n%s\nwant:\n%s", got, want)
	}
}

func TestReopenAfterRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log")
	w, err := Open(path, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("before\n"))
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := w.Reopen(); err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("after\n"))
	w.Close()
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if !strings.Contains(string(old), "F before") || strings.Contains(string(old), "after") || !strings.Contains(string(cur), "F after") {
		t.Fatalf("rotated %q, current %q", old, cur)
	}
}
