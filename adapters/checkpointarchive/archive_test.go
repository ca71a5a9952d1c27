package checkpointarchive

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

var meta = ports.CheckpointMeta{ContainerID: "c0ffee", ContainerName: "vm", SandboxID: "5a4d", PodName: "web-0", PodNamespace: "apps", PodUID: "u1",
	Image: "virtlet.cloud/tiny", ImageID: "sha256:ab", Annotations: map[string]string{"io.kubernetes.container.hash": "1"},
	CreatedAt: time.Unix(100, 0).UTC(), CheckpointedAt: time.Unix(200, 0).UTC(),
	VM: ports.VMSpec{ID: "c0ffee", Name: "virtlet-c0ffee-web-0", MemoryBytes: 128 << 20, VCPUs: 1,
		Disks: []ports.Disk{{Name: "ceph", Source: ports.DiskSource{Type: ports.SourceNetwork, Auth: &ports.DiskAuth{Username: "admin", Secret: []byte("s3cret")}}}}}}

// capture writes what a hypervisor would.
func capture(_ context.Context, dir string) (ports.VMCheckpoint, error) {
	for name, data := range map[string]string{"checkpoint/memory.save": "LibvirtQemudSave...", "checkpoint/domain.xml": "<domain/>", "disks/root.qcow2": "QFI\xfb..."} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return ports.VMCheckpoint{}, err
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			return ports.VMCheckpoint{}, err
		}
	}
	return ports.VMCheckpoint{StateFile: "checkpoint/memory.save", DefinitionFile: "checkpoint/domain.xml", Paused: 150 * time.Millisecond,
		Disks: []ports.CheckpointDisk{{Name: "root", File: "disks/root.qcow2", Format: "qcow2", BackingFile: "/images/tiny"}}}, nil
}

func TestWriteCheckpointLayout(t *testing.T) {
	dir := t.TempDir()
	loc := filepath.Join(dir, "checkpoint-web-0_apps-vm-2026.tar")
	a := New(Options{Runtime: "virtlet", Version: "1.2.3", Log: logrus.New()})
	out, err := a.WriteCheckpoint(context.Background(), loc, meta, capture)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(loc)
	if err != nil || out.Bytes != info.Size() || info.Mode().Perm() != 0o600 {
		t.Fatalf("archive %+v: %v %v", out, info, err)
	}
	members := readTar(t, loc)
	var names []string
	for n := range members {
		names = append(names, n)
	}
	sort.Strings(names)
	want := []string{"checkpoint/", "checkpoint/domain.xml", "checkpoint/memory.save", "checkpoint/virtlet.json", "config.dump", "disks/", "disks/root.qcow2", "spec.dump"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("members %q, want %q", names, want)
	}
	var config ContainerConfig
	if err := json.Unmarshal(members["config.dump"], &config); err != nil || config.ID != "c0ffee" || config.Name != "vm" ||
		config.RootfsImageName != "virtlet.cloud/tiny" || config.OCIRuntime != "virtlet" || !config.CheckpointedAt.Equal(meta.CheckpointedAt) {
		t.Errorf("config.dump %+v %v", config, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(members["spec.dump"], &spec); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"io.kubernetes.cri.sandbox-name": "web-0", "io.kubernetes.cri.sandbox-namespace": "apps",
		"io.kubernetes.cri.container-name": "vm", "io.kubernetes.container.hash": "1", "org.criu.checkpoint.engine.name": "virtlet"} {
		if spec.Annotations[k] != v {
			t.Errorf("spec.dump annotation %s = %q, want %q", k, spec.Annotations[k], v)
		}
	}
	var vm VirtletMeta
	if err := json.Unmarshal(members["checkpoint/virtlet.json"], &vm); err != nil || vm.FormatVersion != FormatVersion || vm.StateFile != "checkpoint/memory.save" ||
		len(vm.Disks) != 1 || vm.Disks[0].BackingFile != "/images/tiny" || vm.PausedMillis != 150 || vm.VM.Name != meta.VM.Name {
		t.Errorf("virtlet.json %+v %v", vm, err)
	}
	if strings.Contains(string(members["checkpoint/virtlet.json"]), "s3cret") || strings.Contains(string(members["checkpoint/virtlet.json"]), "czNjcmV0") {
		t.Error("a disk's secret reached the archive")
	}
	if string(members["disks/root.qcow2"]) != "QFI\xfb..." {
		t.Errorf("disk copy %q", members["disks/root.qcow2"])
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".virtlet-checkpoint-*"))
	if len(leftovers) != 0 {
		t.Errorf("working directories left: %q", leftovers)
	}
}

func TestWriteCheckpointFailuresLeaveNothing(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o700); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("the VM is gone")
	symlinked := func(ctx context.Context, d string) (ports.VMCheckpoint, error) {
		cp, err := capture(ctx, d)
		if err == nil {
			err = os.Symlink("/etc/shadow", filepath.Join(d, "disks/evil"))
		}
		return cp, err
	}
	for _, tc := range []struct {
		name, location string
		capture        func(context.Context, string) (ports.VMCheckpoint, error)
		want           string
	}{
		{"relative location", "checkpoint.tar", capture, "not a clean absolute path"},
		{"unclean location", dir + "/../x/../checkpoint.tar", capture, "not a clean absolute path"},
		{"missing directory", filepath.Join(dir, "none", "checkpoint.tar"), capture, "its directory does not exist"},
		{"a directory", filepath.Join(dir, "adir"), capture, "not a regular file"},
		{"the hypervisor fails", filepath.Join(dir, "c1.tar"), func(context.Context, string) (ports.VMCheckpoint, error) { return ports.VMCheckpoint{}, failed }, "the VM is gone"},
		{"a symlink in the state", filepath.Join(dir, "c2.tar"), symlinked, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Options{Runtime: "virtlet", Version: "1", Log: logrus.New()}).WriteCheckpoint(context.Background(), tc.location, meta, tc.capture)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if _, err := os.Lstat(tc.location); err == nil && tc.name != "a directory" {
				t.Errorf("%s exists after a failure", tc.location)
			}
			left, _ := filepath.Glob(filepath.Join(dir, "*"))
			for _, l := range left {
				if filepath.Base(l) != "adir" {
					t.Errorf("left behind: %s", l)
				}
			}
		})
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = data
	}
}

// A daemon killed while it packed an archive left the archive's temporary
// file beside its location (kubelet's directory) and the note naming it:
// the next daemon's archiver removes both, and the working directory. A
// note naming anything but such a temporary file removes nothing else.
func TestAnArchiveHalfWrittenByADeadDaemonIsRemoved(t *testing.T) {
	work, kubelet := t.TempDir(), t.TempDir()
	a := New(Options{Runtime: "virtlet", Version: "1", WorkDir: work, Log: logrus.New()})
	// A write that ends normally leaves no note.
	if _, err := a.WriteCheckpoint(context.Background(), filepath.Join(kubelet, "done.tar"), meta, capture); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(work, "*")); len(left) != 0 {
		t.Fatalf("a finished checkpoint left %v in the work directory", left)
	}
	// What SIGKILL during the pack leaves: the beginning of an archive.
	done, err := os.ReadFile(filepath.Join(kubelet, "done.tar"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(kubelet, "cp.tar.tmp")
	kept := filepath.Join(kubelet, "keep.tar")
	other := filepath.Join(kubelet, "other.tar.tmp") // a file that took a noted path since
	for f, data := range map[string][]byte{tmp: done[:4096], kept: done[:4096], other: []byte("not an archive")} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range map[string]string{
		".virtlet-checkpoint-1":             "",
		".virtlet-checkpoint-1.destination": tmp,
		".virtlet-checkpoint-2.destination": kept,
		".virtlet-checkpoint-3.destination": "relative.tmp",
		".virtlet-checkpoint-4.destination": other,
	} {
		p := filepath.Join(work, name)
		if content == "" {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	New(Options{WorkDir: work, Log: logrus.New()})
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("the half-written archive %s stays: %v", tmp, err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("a file a note names that is no temporary file was removed: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a temporary file a note names that is no archive was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(kubelet, "done.tar")); err != nil {
		t.Errorf("the finished archive went: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(work, "*")); len(left) != 0 {
		t.Errorf("left in the work directory: %v", left)
	}
}
