package flexvolume

import (
	"context"
	"encoding/json"
	"errors"
	"flag"

	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// daemon stands in for the virtlet daemon: it knows the types qcow2
// (option capacity) and ceph (it keeps the secret), as the real plugins'
// errors name options.
type daemon struct {
	validated, forgotten []ports.FlexvolumeOptions
	down                 bool
}

func (d *daemon) ValidateVolume(ctx context.Context, fv ports.FlexvolumeOptions) (map[string]string, error) {
	if d.down {
		return nil, errors.New("the virtlet daemon does not answer on its admin socket (is it running?)")
	}
	d.validated = append(d.validated, fv)
	switch fv.Options["type"] {
	case "qcow2":
		if c := fv.Options["capacity"]; c != "" && c != "2048MiB" {
			return nil, &ports.InvalidError{Field: "qcow2 volume " + fv.Volume + " option capacity", Value: c, Allowed: "a size"}
		}
		return map[string]string{"type": "qcow2", "capacity": fv.Options["capacity"]}, nil
	case "ceph":
		if fv.Options["secret"] == "" {
			return nil, &ports.InvalidError{Field: "ceph volume " + fv.Volume + " option secret", Reason: "missing"}
		}
		return map[string]string{"type": "ceph", "monitor": fv.Options["monitor"]}, nil
	case "":
		return nil, &ports.InvalidError{Field: "option type", Reason: "missing", Allowed: "one of the installed volume types: ceph, qcow2"}
	default:
		return nil, &ports.InvalidError{Field: "option type", Value: fv.Options["type"], Reason: "no installed volume plugin handles it", Allowed: "ceph, qcow2"}
	}
}

func (d *daemon) ForgetVolume(ctx context.Context, fv ports.FlexvolumeOptions) error {
	if d.down {
		return errors.New("the virtlet daemon does not answer on its admin socket (is it running?)")
	}
	d.forgotten = append(d.forgotten, fv)
	return nil
}

// mounter records the tmpfs mounts instead of making them.
type mounter map[string]bool

func (m mounter) Mount(dir string) error    { m[dir] = true; return nil }
func (m mounter) Unmount(dir string) error  { delete(m, dir); return nil }
func (m mounter) IsMounted(dir string) bool { return m[dir] }
func opts(kv ...string) string {
	m := map[string]string{"kubernetes.io/pod.uid": "uid-1", "kubernetes.io/pod.name": "vm", "kubernetes.io/pod.namespace": "default",
		"kubernetes.io/pvOrVolumeName": "data", "kubernetes.io/fsType": "", "kubernetes.io/readwrite": "rw"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// Every call of kubelet's protocol gets the answer in its golden file.
func TestDriverGolden(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pods", "uid-1", "volumes", "virtlet~flexvolume_driver", "data")
	secret := "AQBkZXNrLXRlc3Qta2V5LW5ldmVyLWxvZ2dlZA=="
	for _, tc := range []struct {
		name string
		args []string
		down bool
	}{
		{"init", []string{"init"}, false},
		{"mount-qcow2", []string{"mount", dir, opts("type", "qcow2", "capacity", "2048MiB")}, false},
		{"mount-ceph-secretref", []string{"mount", dir, opts("type", "ceph", "monitor", "10.0.0.1:6789",
			"kubernetes.io/secret/secret", "QVFCa1pYTnJMWFJsYzNRdGEyVjVMVzVsZG1WeUxXeHZaMmRsWkE9PQ==")}, false},
		{"unmount", []string{"unmount", dir}, false},
		{"unmount-again", []string{"unmount", dir}, false},
		{"mount-malformed-json", []string{"mount", dir, "{not json"}, false},
		{"mount-unknown-type", []string{"mount", dir, opts("type", "lvm")}, false},
		{"mount-no-type", []string{"mount", dir, opts()}, false},
		{"mount-bad-option", []string{"mount", dir, opts("type", "qcow2", "capacity", "lots")}, false},
		{"mount-missing-secret", []string{"mount", dir, opts("type", "ceph", "monitor", "10.0.0.1:6789")}, false},
		{"mount-bad-secretref", []string{"mount", dir, opts("type", "ceph", "kubernetes.io/secret/secret", "%%%")}, false},
		{"mount-daemon-down", []string{"mount", dir, opts("type", "qcow2")}, true},
		{"mount-relative-dir", []string{"mount", "volumes/data", opts("type", "qcow2")}, false},
		{"mount-wrong-args", []string{"mount", dir}, false},
		{"attach", []string{"attach", opts("type", "qcow2"), "node-1"}, false},
		{"getvolumename", []string{"getvolumename", opts("type", "qcow2")}, false},
		{"no-command", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Driver{Daemon: &daemon{down: tc.down}, Mounter: mounter{}}
			got, _ := json.MarshalIndent(d.Run(tc.args), "", "  ")
			golden := filepath.Join("testdata", tc.name+".json")
			if *update {
				os.MkdirAll("testdata", 0o755)
				os.WriteFile(golden, append(got, '\n'), 0o644)
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if strings.TrimSpace(string(want)) != strings.TrimSpace(string(got)) {
				t.Fatalf("answer differs from %s:\n%s", golden, got)
			}
			if strings.Contains(string(got), secret) {
				t.Fatal("the answer holds the secret")
			}
		})
	}
}

// mount keeps the checked options (no secret) in the volume directory,
// under and on its tmpfs; unmount tells the daemon and removes them.
func TestMountKeepsOptionsAndUnmountForgets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	dm := &daemon{}
	m := mounter{}
	d := &Driver{Daemon: dm, Mounter: m}
	secret := "AQBkZXNrLXRlc3Qta2V5LW5ldmVyLWxvZ2dlZA=="
	res := d.Run([]string{"mount", dir, opts("type", "ceph", "monitor", "10.0.0.1:6789", "secret", secret)})
	if res.Status != Success {
		t.Fatalf("%+v", res)
	}
	if len(dm.validated) != 1 || dm.validated[0].PodUID != "uid-1" || dm.validated[0].Volume != "data" || dm.validated[0].Options["secret"] != secret {
		t.Fatalf("daemon asked %+v", dm.validated)
	}
	raw, err := os.ReadFile(filepath.Join(dir, ports.FlexvolumeOptionsFile))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(filepath.Join(dir, ports.FlexvolumeOptionsFile))
	var kept map[string]string
	json.Unmarshal(raw, &kept)
	if kept["type"] != "ceph" || kept["monitor"] != "10.0.0.1:6789" || kept["kubernetes.io/pod.uid"] != "uid-1" || st.Mode().Perm() != 0o600 {
		t.Fatalf("kept %v mode %v", kept, st.Mode())
	}
	if strings.Contains(string(raw), secret) {
		t.Fatal("the secret is in the volume directory")
	}
	if !m[dir] {
		t.Fatal("no tmpfs on the volume directory")
	}
	if res := d.Run([]string{"unmount", dir}); res.Status != Success {
		t.Fatalf("%+v", res)
	}
	if len(dm.forgotten) != 1 || dm.forgotten[0].PodUID != "uid-1" || dm.forgotten[0].Options["type"] != "ceph" {
		t.Fatalf("forgotten %+v", dm.forgotten)
	}
	if _, err := os.Stat(filepath.Join(dir, ports.FlexvolumeOptionsFile)); !errors.Is(err, os.ErrNotExist) || m[dir] {
		t.Fatalf("options or tmpfs left: %v %v", err, m)
	}
}

// A mount killed between the tmpfs and its file: unmount still finds the
// options (under the tmpfs), tells the daemon, and leaves nothing.
func TestUnmountAfterAnInterruptedMount(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	dm := &daemon{}
	m := mounter{}
	d := &Driver{Daemon: dm, Mounter: m}
	if res := d.Run([]string{"mount", dir, opts("type", "qcow2")}); res.Status != Success {
		t.Fatalf("%+v", res)
	}
	// The fake tmpfs shows the file underneath; remove it from "on top" by
	// pretending the tmpfs hides it until unmounted.
	hidden := &hidingMounter{mounter: m, dir: dir}
	d.Mounter = hidden
	if res := d.Run([]string{"unmount", dir}); res.Status != Success {
		t.Fatalf("%+v", res)
	}
	if len(dm.forgotten) != 1 || dm.forgotten[0].Options["type"] != "qcow2" || m[dir] {
		t.Fatalf("forgotten %+v, mounted %v", dm.forgotten, m[dir])
	}
}

// hidingMounter hides the options file while "mounted", like a tmpfs
// mounted before the file was written on it.
type hidingMounter struct {
	mounter
	dir    string
	hidden []byte
}

func (h *hidingMounter) IsMounted(dir string) bool {
	if h.mounter[dir] && h.hidden == nil {
		p := filepath.Join(dir, ports.FlexvolumeOptionsFile)
		h.hidden, _ = os.ReadFile(p)
		os.Remove(p)
	}
	return h.mounter[dir]
}

func (h *hidingMounter) Unmount(dir string) error {
	delete(h.mounter, dir)
	return os.WriteFile(filepath.Join(dir, ports.FlexvolumeOptionsFile), h.hidden, 0o600)
}

// The real tmpfs: kubelet sees a mount point; the options are on it.
func TestTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := filepath.Join(t.TempDir(), "data")
	d := &Driver{Daemon: &daemon{}, Mounter: Tmpfs{}}
	if res := d.Run([]string{"mount", dir, opts("type", "qcow2")}); res.Status != Success {
		t.Fatalf("%+v", res)
	}
	t.Cleanup(func() { Tmpfs{}.Unmount(dir) })
	if !(Tmpfs{}).IsMounted(dir) {
		t.Fatal("no tmpfs")
	}
	if _, err := os.Stat(filepath.Join(dir, ports.FlexvolumeOptionsFile)); err != nil {
		t.Fatal(err)
	}
	if res := d.Run([]string{"unmount", dir}); res.Status != Success {
		t.Fatalf("%+v", res)
	}
	if (Tmpfs{}).IsMounted(dir) {
		t.Fatal("tmpfs left")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("left in the volume directory: %v", entries)
	}

}
