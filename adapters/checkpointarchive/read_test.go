package checkpointarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

func TestReadAndUnpackWhatWasWritten(t *testing.T) {
	dir := t.TempDir()
	loc := filepath.Join(dir, "cp.tar")
	a := New(Options{Runtime: "virtlet", Version: "1", WorkDir: filepath.Join(dir, "restore"), Log: logrus.New()})
	if _, err := a.WriteCheckpoint(context.Background(), loc, meta, capture); err != nil {
		t.Fatal(err)
	}
	if !Recognise(loc) {
		t.Fatal("a checkpoint archive is not recognised as one")
	}
	if Recognise(filepath.Join(dir, "none")) || Recognise(os.Args[0]) {
		t.Fatal("a file that is no checkpoint archive is recognised as one")
	}
	m, cp, err := a.ReadCheckpoint(context.Background(), loc)
	if err != nil || m.PodName != "web-0" || m.ImageID != "sha256:ab" || m.VM.Name != meta.VM.Name || cp.StateFile != "checkpoint/memory.save" || len(cp.Disks) != 1 {
		t.Fatalf("read %+v %+v %v", m, cp, err)
	}
	var unpacked string
	err = a.UnpackCheckpoint(context.Background(), loc, func(_ context.Context, r ports.VMRestore) error {
		unpacked = filepath.Dir(filepath.Dir(r.StateFile))
		data, err := os.ReadFile(r.Disks["root"])
		if err != nil || string(data) != "QFI\xfb..." {
			t.Errorf("root disk copy %q %v", data, err)
		}
		if data, err := os.ReadFile(r.StateFile); err != nil || !strings.HasPrefix(string(data), "LibvirtQemudSave") {
			t.Errorf("state %q %v", data, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(unpacked); !os.IsNotExist(err) {
		t.Errorf("the unpacked checkpoint %s stays: %v", unpacked, err)
	}
}

// An archive is untrusted: anything a checkpoint does not have is refused
// before anything is unpacked or used.
func TestHostileArchivesAreRefused(t *testing.T) {
	good, _ := json.Marshal(VirtletMeta{FormatVersion: FormatVersion, StateFile: "checkpoint/memory.save",
		Disks: []ports.CheckpointDisk{{Name: "root", File: "disks/root.qcow2", Format: "qcow2"}}})
	type member struct {
		name string
		typ  byte
		data string
		link string
	}
	base := []member{{"checkpoint/", tar.TypeDir, "", ""}, {"checkpoint/memory.save", tar.TypeReg, "state", ""}, {"checkpoint/virtlet.json", tar.TypeReg, string(good), ""},
		{"disks/", tar.TypeDir, "", ""}, {"disks/root.qcow2", tar.TypeReg, "disk", ""}}
	with := func(extra ...member) []member { return append(append([]member{}, base...), extra...) }
	meta := func(m VirtletMeta) member {
		data, _ := json.Marshal(m)
		return member{"checkpoint/virtlet.json", tar.TypeReg, string(data), ""}
	}
	for _, tc := range []struct {
		name    string
		members []member
		want    string
	}{
		{"a file out of the archive", with(member{"../../etc/cron.d/x", tar.TypeReg, "x", ""}), "is not part of a VM checkpoint"},
		{"an absolute path", with(member{"/etc/passwd", tar.TypeReg, "x", ""}), "is not part of a VM checkpoint"},
		{"a symlink as a disk", []member{base[0], base[1], base[2], base[3], {"disks/root.qcow2", tar.TypeSymlink, "", "/etc/shadow"}}, "not a regular file"},
		{"a hard link", []member{base[0], base[1], base[2], base[3], {"disks/root.qcow2", tar.TypeLink, "", "checkpoint/memory.save"}}, "not a regular file"},
		{"a member twice", with(member{"disks/root.qcow2", tar.TypeReg, "again", ""}), "twice"},
		{"another member name", with(member{"disks/ROOT.qcow2", tar.TypeReg, "x", ""}), "is not part of a VM checkpoint"},
		{"no metadata", []member{base[0], base[1]}, "it has no checkpoint/virtlet.json"},
		{"another format version", []member{base[0], base[1], meta(VirtletMeta{FormatVersion: 9, StateFile: "checkpoint/memory.save"})}, "format version 9"},
		{"a disk named elsewhere", []member{base[0], base[1], meta(VirtletMeta{FormatVersion: FormatVersion, StateFile: "checkpoint/memory.save",
			Disks: []ports.CheckpointDisk{{Name: "root", File: "disks/other.qcow2", Format: "qcow2"}}})}, `disk "root" is in "disks/other.qcow2"`},
		{"a disk missing", []member{base[0], base[1], base[2]}, "disks/root.qcow2 is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, m := range tc.members {
				tw.WriteHeader(&tar.Header{Name: m.name, Typeflag: m.typ, Size: int64(len(m.data)), Mode: 0o600, Linkname: m.link})
				tw.Write([]byte(m.data))
			}
			tw.Close()
			dir := t.TempDir()
			archive := filepath.Join(dir, "cp.tar")
			os.WriteFile(archive, buf.Bytes(), 0o600)
			a := New(Options{WorkDir: filepath.Join(dir, "restore"), Log: logrus.New()})
			used := false
			err := a.UnpackCheckpoint(context.Background(), archive, func(context.Context, ports.VMRestore) error { used = true; return nil })
			if err == nil || !strings.Contains(err.Error(), tc.want) || used {
				t.Fatalf("error %v (used %v), want %q", err, used, tc.want)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "restore", "*")); len(left) != 0 {
				t.Errorf("left unpacked: %q", left)
			}
		})
	}
}
