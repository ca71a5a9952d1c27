package manifest_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
)

// binary writes an executable and returns its path and checksum.
func binary(t *testing.T, dir, name, content string) (string, string) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	sum, err := manifest.FileSHA256(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, sum
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	_, hvSum := binary(t, dir, "hv", "#!/bin/sh\n")
	_, volSum := binary(t, dir, "vol", "#!/bin/sh\necho vol\n")
	write(t, dir, "10-hv.yaml", "name: fake\nkind: hypervisor\ncommand: hv\nargs: [hypervisor]\nsha256: "+hvSum+"\n")
	write(t, dir, "20-vol.yml", "name: scratch\nkind: volume\ncommand: "+filepath.Join(dir, "vol")+"\nsha256: "+volSum+"\nhandles: [scratch]\nconfig:\n  size: 64Mi\n")
	write(t, dir, "README.md", "not a manifest")
	ms, err := manifest.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Name != "fake" || ms[0].Command != filepath.Join(dir, "hv") || ms[0].Args[0] != "hypervisor" ||
		ms[1].Kind != ports.KindVolume || string(ms[1].Config) != `{"size":"64Mi"}` || ms[1].File != filepath.Join(dir, "20-vol.yml") {
		t.Fatalf("manifests %+v", ms)
	}
	if err := manifest.RequireHypervisor(ms, dir); err != nil {
		t.Fatal(err)
	}
	if err := manifest.RequireHypervisor(ms[1:], dir); err == nil || !strings.Contains(err.Error(), "no hypervisor plugin") {
		t.Fatalf("RequireHypervisor: %v", err)
	}
}

func TestMissingDirIsNotExist(t *testing.T) {
	_, err := manifest.LoadDir(filepath.Join(t.TempDir(), "absent"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err %v", err)
	}
}

func TestBadManifests(t *testing.T) {
	dir := t.TempDir()
	_, sum := binary(t, dir, "plugin", "#!/bin/sh\n")
	binary(t, dir, "other", "#!/bin/sh\necho changed\n")
	os.WriteFile(filepath.Join(dir, "not-exec"), []byte("x"), 0o644)
	ok := "name: p\nkind: volume\ncommand: plugin\nsha256: " + sum + "\n"
	tests := []struct {
		name, yaml, field, reason string
	}{
		{"unknown kind", strings.Replace(ok, "volume", "storage", 1), "kind", `unknown plugin kind "storage" (want one of hypervisor, image, volume, datasource, network)`},
		{"missing kind", "name: p\ncommand: plugin\nsha256: " + sum + "\n", "kind", "required"},
		{"missing name", "kind: volume\ncommand: plugin\nsha256: " + sum + "\n", "name", "required"},
		{"bad name", strings.Replace(ok, "name: p", "name: My_Plugin", 1), "name", "is not a lowercase name"},
		{"missing binary", strings.Replace(ok, "command: plugin", "command: /nonexistent/plugin", 1), "command", "binary /nonexistent/plugin does not exist"},
		{"not executable", strings.Replace(ok, "command: plugin", "command: not-exec", 1), "command", "is not an executable file"},
		{"checksum mismatch", strings.Replace(ok, "command: plugin", "command: other", 1), "sha256", "checksum mismatch"},
		{"missing checksum", "name: p\nkind: volume\ncommand: plugin\n", "sha256", "required"},
		{"malformed checksum", strings.Replace(ok, sum, "5d41402a", 1), "sha256", "not 64 lowercase hex digits"},
		{"unknown field", ok + "restartPolicy: always\n", "restartPolicy", "unknown field"},
		{"wrong type", ok + "args: --verbose\n", "args", "wrong type"},
		{"bad handle", ok + "handles: [Ceph]\n", "handles[0]", "not a lowercase name"},
		{"config not a mapping", ok + "config: [1, 2]\n", "config", "must be a mapping"},
		{"invalid yaml", "name: [\n", "", "not valid YAML"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(dir, "bad.yaml")
			_, err := manifest.Parse(file, []byte(tt.yaml), dir)
			var me *manifest.Error
			if !errors.As(err, &me) {
				t.Fatalf("err %v, want a manifest error", err)
			}
			if me.File != file || me.Field != tt.field || !strings.Contains(me.Reason, tt.reason) {
				t.Fatalf("got file %q field %q reason %q; want field %q reason containing %q", me.File, me.Field, me.Reason, tt.field, tt.reason)
			}
			if !strings.Contains(err.Error(), file) {
				t.Fatalf("message %q does not name the file", err)
			}
		})
	}
}

func TestConflictingSets(t *testing.T) {
	dir := t.TempDir()
	_, sum := binary(t, dir, "plugin", "#!/bin/sh\n")
	for _, tt := range []struct {
		name   string
		files  map[string]string
		file   string
		field  string
		reason string
	}{
		{"two plugins claim one volume type", map[string]string{
			"a.yaml": "name: ceph-a\nkind: volume\ncommand: plugin\nsha256: " + sum + "\nhandles: [ceph]\n",
			"b.yaml": "name: ceph-b\nkind: volume\ncommand: plugin\nsha256: " + sum + "\nhandles: [qcow2, ceph]\n",
		}, "b.yaml", "handles[1]", `volume "ceph" is already handled by the plugin in`},
		{"duplicate names", map[string]string{
			"a.yaml": "name: same\nkind: volume\ncommand: plugin\nsha256: " + sum + "\n",
			"b.yaml": "name: same\nkind: datasource\ncommand: plugin\nsha256: " + sum + "\n",
		}, "b.yaml", "name", "also the name of the plugin in"},
		{"two hypervisors", map[string]string{
			"a.yaml": "name: one\nkind: hypervisor\ncommand: plugin\nsha256: " + sum + "\n",
			"b.yaml": "name: two\nkind: hypervisor\ncommand: plugin\nsha256: " + sum + "\n",
		}, "b.yaml", "kind", "a second hypervisor plugin"},
		{"same handle, different kinds is fine", map[string]string{
			"a.yaml": "name: one\nkind: volume\ncommand: plugin\nsha256: " + sum + "\nhandles: [x]\n",
			"b.yaml": "name: two\nkind: datasource\ncommand: plugin\nsha256: " + sum + "\nhandles: [x]\n",
		}, "", "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sub := t.TempDir()
			binary(t, sub, "plugin", "#!/bin/sh\n")
			for name, content := range tt.files {
				write(t, sub, name, content)
			}
			_, err := manifest.LoadDir(sub)
			if tt.file == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var me *manifest.Error
			if !errors.As(err, &me) || me.File != filepath.Join(sub, tt.file) || me.Field != tt.field || !strings.Contains(me.Reason, tt.reason) {
				t.Fatalf("err %v", err)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	// An install holding every shipped plugin binary: the embedded set must
	// resolve against it, and report which checksums were not pinned.
	bin := t.TempDir()
	files, err := manifest.DefaultFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		binary(t, bin, f.Command, "#!/bin/sh\n# "+f.Name+"\n")
	}
	pinned := map[string]string{}
	if len(files) > 0 {
		_, sum := binary(t, bin, files[0].Command, "#!/bin/sh\n# "+files[0].Name+"\n")
		pinned[files[0].Name] = sum
	}
	ms, unpinned, err := manifest.Defaults(bin, pinned)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != len(files) || len(unpinned) != len(files)-len(pinned) {
		t.Fatalf("%d manifests, %d unpinned, from %d files", len(ms), len(unpinned), len(files))
	}
	for _, m := range ms {
		if filepath.Dir(m.Command) != bin || m.SHA256 == "" {
			t.Errorf("%s: command %q sha256 %q", m.File, m.Command, m.SHA256)
		}
	}
	// A pinned checksum that does not match the installed binary stops start-up.
	if len(files) > 0 {
		pinned[files[0].Name] = strings.Repeat("0", 64)
		if _, _, err := manifest.Defaults(bin, pinned); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
			t.Fatalf("tampered default plugin: %v", err)
		}
	}
	// Without the binaries, the error says what is missing.
	if len(files) > 0 {
		if _, _, err := manifest.Defaults(t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "plugin shipped with the daemon is missing") {
			t.Fatalf("missing default plugin: %v", err)
		}
	}
}

// The daemon runs plugins as root: a binary or a manifest that anyone but
// root can change, or that lies in a directory anyone but root can change,
// is refused, naming the file or directory.
func TestRefusesWhatOthersCanWrite(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("ownership checks need root")
	}
	setup := func(t *testing.T) (dir, sum string) {
		dir = t.TempDir()
		_, sum = binary(t, dir, "hv", "#!/bin/sh\n")
		write(t, dir, "10-hv.yaml", "name: fake\nkind: hypervisor\ncommand: hv\nsha256: "+sum+"\n")
		return dir, sum
	}
	for _, tc := range []struct {
		name  string
		spoil func(dir string) error
		want  string
	}{
		{"binary writable by others", func(dir string) error { return os.Chmod(filepath.Join(dir, "hv"), 0o757) }, "hv is writable by its group or others (-rwxr-xrwx)"},
		{"binary of another user", func(dir string) error { return os.Chown(filepath.Join(dir, "hv"), 1000, 0) }, "hv belongs to user 1000"},
		{"manifest writable by its group", func(dir string) error { return os.Chmod(filepath.Join(dir, "10-hv.yaml"), 0o664) }, "10-hv.yaml is writable by its group or others"},
		{"directory of another user", func(dir string) error { return os.Chown(dir, 1000, 1000) }, "belongs to user 1000"},
		{"directory writable by others, sticky or not", func(dir string) error { return os.Chmod(dir, os.ModeSticky|0o777) }, "is writable by its group or others (-rwxrwxrwx)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := setup(t)
			if err := tc.spoil(dir); err != nil {
				t.Fatal(err)
			}
			_, err := manifest.LoadDir(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "only root may change it") {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
	// A sticky directory higher up (as /tmp is) is fine: nobody can
	// replace what root owns in it.
	dir, _ := setup(t)
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	binary(t, sub, "hv", "#!/bin/sh\n")
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if err := manifest.OnlyOperatorWritable(filepath.Join(sub, "hv")); err != nil {
		t.Fatalf("a root-owned binary below a sticky directory: %v", err)
	}
}
