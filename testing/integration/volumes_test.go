package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/testing/harness"
)

// volumePlugins are the shipped volume plugins; raw allows loop devices.
func volumePlugins() []harness.Plugin {
	return []harness.Plugin{
		{Name: "qcow2", Kind: "volume", Binary: filepath.Join(bins, "virtlet-plugin-qcow2")},
		{Name: "raw", Kind: "volume", Binary: filepath.Join(bins, "virtlet-plugin-raw"), Config: `{allowedPaths: ["/dev/loop*"]}`},
		{Name: "ninep", Kind: "volume", Binary: filepath.Join(bins, "virtlet-plugin-ninep")},
		{Name: "ceph", Kind: "volume", Binary: filepath.Join(bins, "virtlet-plugin-ceph")},
	}
}

// driver runs the real flexvolume driver as kubelet does.
func driver(t *testing.T, d *harness.Daemon, args ...string) map[string]interface{} {
	t.Helper()
	return d.FlexvolumeDriver(t, filepath.Join(bins, "virtlet-flexvolume-driver"), args...)
}

// The flexvolume story through the real driver binary, the daemon's admin
// socket and the real volume plugins: kubelet mounts the volumes (the
// driver checks them with the plugins), CreateContainer attaches them with
// their serials, and removal and unmount leave nothing.
func TestVolumesThroughCrictl(t *testing.T) {
	d, c := startDaemon(t, volumePlugins()...)
	k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: "uid-vols"}
	loop := harness.LoopDevice(t, 16<<20, nil)

	if res := driver(t, d, "init"); res["status"] != "Success" || fmt.Sprint(res["capabilities"]) != "map[attach:false]" {
		t.Fatalf("init: %v", res)
	}
	extra, raw := k.Volume("virtlet~flexvolume_driver", "extra"), k.Volume("virtlet~flexvolume_driver", "raw")
	for dir, opts := range map[string]map[string]string{
		extra: {"type": "qcow2", "capacity": "64MiB"},
		raw:   {"type": "raw", "path": loop},
	} {
		if res := driver(t, d, "mount", dir, k.FlexvolumeOptions("vols", filepath.Base(dir), opts)); res["status"] != "Success" {
			t.Fatalf("mount %s: %v", dir, res)
		}
	}
	empty := k.Volume("kubernetes.io~empty-dir", "cache")
	os.MkdirAll(empty, 0o777)
	os.WriteFile(filepath.Join(empty, "hello.txt"), []byte("hello"), 0o644)

	c.Must(t, "pull", image)
	podJSON, ctrJSON := vmPod(t, d, "vols", nil)
	var ctr map[string]interface{}
	b, _ := os.ReadFile(ctrJSON)
	json.Unmarshal(b, &ctr)
	ctr["mounts"] = []map[string]interface{}{
		{"container_path": "/var/lib/docker", "host_path": extra},
		{"container_path": "/var/lib/postgresql", "host_path": raw},
		{"container_path": "/cache", "host_path": empty, "readonly": true},
		{"container_path": "/etc/hosts", "host_path": k.File("etc-hosts")},
	}
	ctrJSON = harness.WriteJSON(t, d.Dir, "vols-ctr2.json", ctr)
	sb := c.Must(t, "runp", podJSON)
	id := c.Must(t, "create", sb, ctrJSON, podJSON)

	var info struct {
		VM struct {
			Volumes []struct {
				Name, Kind, Type, Serial, Tag string
				MountPaths                    []string
				ReadOnly                      bool
			} `json:"volumes"`
			Disks []struct {
				Name, Serial, Source, Path string
			} `json:"disks"`
			Shares []struct {
				Source, Tag string
				ReadOnly    bool
			} `json:"shares"`
		} `json:"vm"`
	}
	c.JSON(t, &info, "inspect", id)
	var vols []string
	for _, v := range info.VM.Volumes {
		vols = append(vols, fmt.Sprintf("%s/%s/%s/%s%s/%v/ro=%v", v.Name, v.Kind, v.Type, v.Serial, v.Tag, v.MountPaths, v.ReadOnly))
	}
	want := "extra/flexvolume/qcow2/vol-extra/[/var/lib/docker]/ro=false raw/flexvolume/raw/vol-raw/[/var/lib/postgresql]/ro=false " +
		"cache/emptyDir/share/cache/[/cache (read-only)]/ro=true"
	if got := strings.Join(vols, " "); got != want {
		t.Errorf("volumes %s\nwant     %s", got, want)
	}
	disks := map[string]string{}
	for _, dk := range info.VM.Disks {
		disks[dk.Name] = dk.Serial + " " + dk.Source + " " + dk.Path
	}
	qcow2Disk := filepath.Join(d.StateDir, "plugins", "qcow2", "disks", id+"-extra.qcow2")
	if disks["vol-extra"] != "vol-extra file "+qcow2Disk || disks["vol-raw"] != "vol-raw block "+loop {
		t.Errorf("disks %v", disks)
	}
	if out, err := exec.Command("qemu-img", "info", qcow2Disk).CombinedOutput(); err != nil || !strings.Contains(string(out), "virtual size: 64 MiB") {
		t.Errorf("qcow2 disk: %v\n%s", err, out)
	}
	share := filepath.Join(d.StateDir, "plugins", "ninep", "shares", id, "cache")
	if len(info.VM.Shares) != 1 || info.VM.Shares[0].Source != share || !info.VM.Shares[0].ReadOnly {
		t.Errorf("shares %+v", info.VM.Shares)
	}
	if got, err := os.ReadFile(filepath.Join(share, "hello.txt")); err != nil || string(got) != "hello" {
		t.Errorf("the share does not show the emptyDir: %q %v", got, err)
	}

	c.Must(t, "rm", id)
	if _, err := os.Stat(qcow2Disk); !os.IsNotExist(err) {
		t.Errorf("qcow2 disk left after rm: %v", err)
	}
	if _, err := os.Stat(share); !os.IsNotExist(err) {
		t.Errorf("share left after rm: %v", err)
	}
	if _, err := os.Stat(filepath.Join(empty, "hello.txt")); err != nil {
		t.Error("removing the VM removed the emptyDir's files")
	}
	c.Must(t, "rmp", "-f", sb)
	for _, dir := range []string{extra, raw} {
		if res := driver(t, d, "unmount", dir); res["status"] != "Success" {
			t.Fatalf("unmount %s: %v", dir, res)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("left in %s: %v", dir, entries)
		}
	}
}

// What kubelet's mount call gets back from the real plugins for bad
// options: a Failure naming the option and saying what is allowed.
func TestFlexvolumeDriverRefusals(t *testing.T) {
	d, _ := startDaemon(t, volumePlugins()...)
	k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: "uid-bad"}
	for _, tc := range []struct {
		name string
		opts map[string]string
		want []string
	}{
		{"unknown type", map[string]string{"type": "lvm"}, []string{`option type: invalid value "lvm"`, "allowed: ceph, qcow2, raw, scratch"}},
		{"no type", map[string]string{"capacity": "1G"}, []string{"option type: missing"}},
		{"bad capacity", map[string]string{"type": "qcow2", "capacity": "lots"}, []string{"qcow2 volume data option capacity", `"lots"`}},
		{"unknown option", map[string]string{"type": "qcow2", "colour": "red"}, []string{"qcow2 volume data option colour: unknown option"}},
		{"raw outside the globs", map[string]string{"type": "raw", "path": "/dev/sda"}, []string{"raw volume data option path", "paths matching /dev/loop*"}},
		{"ceph without a key", map[string]string{"type": "ceph", "monitor": "127.0.0.1:6789", "pool": "rbd", "volume": "v", "user": "u"},
			[]string{"ceph volume data option secret: missing"}},
		{"ceph without a pool", map[string]string{"type": "ceph", "monitor": "127.0.0.1:6789", "volume": "v", "user": "u", "secret": "AQBkZXNrLXRlc3Qta2V5LW5ldmVyLWxvZ2dlZA=="},
			[]string{"ceph volume data option pool: missing"}},
		{"share type as flexvolume", map[string]string{"type": "share"}, []string{"this type is for Kubernetes volumes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := k.Volume("virtlet~flexvolume_driver", "data")
			res := driver(t, d, "mount", dir, k.FlexvolumeOptions("bad", "data", tc.opts))
			msg, _ := res["message"].(string)
			if res["status"] != "Failure" {
				t.Fatalf("%v", res)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "virtlet-flexvolume.json")); !os.IsNotExist(err) {
				t.Errorf("a refused volume left its options: %v", err)
			}
		})
	}
	// The daemon is down: the driver says so, and kubelet retries later.
	d.Stop()
	res := driver(t, d, "mount", k.Volume("virtlet~flexvolume_driver", "late"), k.FlexvolumeOptions("bad", "late", map[string]string{"type": "qcow2"}))
	if msg, _ := res["message"].(string); res["status"] != "Failure" || !strings.Contains(msg, "does not answer on its admin socket") {
		t.Errorf("daemon down: %v", res)
	}
}

// A pod whose volume VM pods cannot use is refused at CreateContainer,
// naming the volume, its kind and what is supported.
func TestUnsupportedVolumeFailsCreateContainer(t *testing.T) {
	d, c := startDaemon(t, volumePlugins()...)
	k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: "uid-gitrepo"}
	c.Must(t, "pull", image)
	podJSON, ctrJSON := vmPod(t, d, "gitrepo", nil)
	var ctr map[string]interface{}
	b, _ := os.ReadFile(ctrJSON)
	json.Unmarshal(b, &ctr)
	ctr["mounts"] = []map[string]interface{}{{"container_path": "/shared", "host_path": k.Volume("kubernetes.io~git-repo", "shared")}}
	ctrJSON = harness.WriteJSON(t, d.Dir, "gitrepo-ctr2.json", ctr)
	sb := c.Must(t, "runp", podJSON)
	_, errOut, err := c.Run("create", sb, ctrJSON, podJSON)
	if err == nil || !strings.Contains(errOut, "mount /shared: volume shared is a git-repo volume, which VM pods do not support (supported: configMap") ||
		!strings.Contains(errOut, "InvalidArgument") {
		t.Fatalf("create: %v\n%s", err, errOut)
	}
	if ps := c.Must(t, "ps", "-a", "-q"); ps != "" {
		t.Errorf("containers: %s", ps)
	}
}
