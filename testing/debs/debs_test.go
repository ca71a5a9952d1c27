package debs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/plugins/manifest"
)

// buildDeb makes a .deb with dpkg-deb of files (path as installed →
// content) and returns its path.
func buildDeb(t *testing.T, name string, files map[string]string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), name)
	control := "Package: " + name + "\nVersion: 1.0-1\nArchitecture: amd64\nMaintainer: test <test@example.org>\nDescription: test package\n"
	files["/DEBIAN/control"] = control
	for p, content := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deb := root + ".deb"
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", root, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
	return deb
}

func TestFiles(t *testing.T) {
	deb := buildDeb(t, "tool", map[string]string{"/usr/bin/tool": "#!/bin/sh\necho tool\n", "/usr/share/doc/tool/README": "readme"})
	files, err := Files(deb, "/usr/bin/tool", "usr/share/doc/tool/README")
	if err != nil {
		t.Fatal(err)
	}
	if got := files["/usr/bin/tool"]; string(got) != "#!/bin/sh\necho tool\n" {
		t.Errorf("/usr/bin/tool: %q", got)
	}
	if got := files["usr/share/doc/tool/README"]; string(got) != "readme" {
		t.Errorf("README, asked for without a leading slash: %q", got)
	}
	if _, err := Files(deb, "/usr/bin/tool", "/usr/bin/missing"); err == nil || !strings.Contains(err.Error(), "/usr/bin/missing") {
		t.Errorf("a file the package lacks: %v", err)
	}
}

func TestExtract(t *testing.T) {
	a := buildDeb(t, "a", map[string]string{"/usr/bin/one": "one", "/usr/bin/other": "other"})
	b := buildDeb(t, "b", map[string]string{"/usr/sbin/two": "two"})
	dir := t.TempDir()
	if err := extract(dir, a, []string{"/usr/bin/one"}); err != nil {
		t.Fatal(err)
	}
	if err := extract(dir, b, []string{"/usr/sbin/two"}); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: mode %v, want executable 0755", e.Name(), fi.Mode())
		}
	}
	if strings.Join(names, " ") != "one two" {
		t.Errorf("extracted %v, want only the programs asked for, by base name", names)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "two")); string(data) != "two" {
		t.Errorf("two: %q", data)
	}
	// Two packages giving one name: the second does not overwrite.
	if err := extract(dir, a, []string{"/usr/bin/one"}); err == nil {
		t.Error("extracting a program over another of the same name succeeded")
	}
}

func TestVersionsKey(t *testing.T) {
	got := versionsKey([]Package{{Name: "containerd", Version: "1.6.20~ds1-1+deb12u3"}, {Name: "runc", Version: "1:1.1.5+ds1-1"}})
	if want := "containerd_1.6.20~ds1-1+deb12u3,runc_1%3A1.1.5+ds1-1"; got != want {
		t.Errorf("key %q, want %q (no colon: the directory goes in PATH)", got, want)
	}
}

// A cached .deb whose SHA256 is apt's is used as it is, without apt.
func TestFetchCached(t *testing.T) {
	deb := buildDeb(t, "cached", map[string]string{"/usr/bin/cached": "cached"})
	sum, err := manifest.FileSHA256(deb)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(deb)
	p := Package{Name: "virtlet-test-no-such-package", Version: "1.0-1", SHA256: sum, Filename: filepath.Base(deb)}
	got, err := Fetch(dir, p)
	if err != nil || got != deb {
		t.Fatalf("Fetch of a cached .deb: %q, %v", got, err)
	}
	// The same file with another checksum is not trusted: apt is asked,
	// and knows no such package.
	p.SHA256 = strings.Repeat("0", 64)
	if _, err := Fetch(dir, p); err == nil || !strings.Contains(err.Error(), "apt-get download") {
		t.Errorf("Fetch of a .deb that does not match apt's SHA256: %v", err)
	}
}
