package flexvolume

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/volume/ceph"
	"github.com/virtlet/virtlet/adapters/volume/qcow2"
	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/fakes"
)

// FuzzMountOptions drives kubelet's mount and unmount with any options
// through the real core and the real qcow2 and ceph volume plugins (the
// ones with flexvolume options; ceph keeps the cephx key on disk). The
// answer is Success or a Failure that says why; no secret reaches the
// answer or kubelet's volume directory; files are written only as the
// options file in the volume directory and as the key in the ceph
// plugin's keys directory; a failed mount leaves nothing, and an unmount
// after a mount leaves nothing either.
func FuzzMountOptions(f *testing.F) {
	key := "AQBkZXNrLXRlc3Qta2V5LW5ldmVyLWxvZ2dlZA=="
	f.Add("data", opts("type", "qcow2", "capacity", "2048MiB"))
	f.Add("data", opts("type", "qcow2", "capacity", "lots", "uuid", "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d"))
	f.Add("ceph", opts("type", "ceph", "monitor", "10.0.0.1:6789", "pool", "rbd", "volume", "img", "user", "admin", "secret", key))
	f.Add("ceph", opts("type", "ceph", "monitor", "10.0.0.1:6789,10.0.0.2:6789", "pool", "rbd", "volume", "img", "user", "client.admin",
		"capacity", "1Gi", "create", "true", "kubernetes.io/secret/secret", base64.StdEncoding.EncodeToString([]byte(key))))
	f.Add("x", opts("type", "ceph", "kubernetes.io/secret/secret", "%%%"))
	f.Add("x", opts("type", "lvm"))
	f.Add("x", "{not json")
	f.Add("x", `{"type":"qcow2"}`)

	root := f.TempDir()
	keys := filepath.Join(root, "keys")
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx := context.Background()
	q, c := qcow2.New(log), ceph.New(log)
	if err := q.Configure(ctx, ports.PluginConfig{StateDir: filepath.Join(root, "qcow2")}); err != nil {
		f.Fatal(err)
	}
	cfg, _ := json.Marshal(ceph.Config{KeysDir: keys})
	if err := c.Configure(ctx, ports.PluginConfig{Config: cfg, StateDir: filepath.Join(root, "ceph")}); err != nil {
		f.Fatal(err)
	}
	rt, err := core.New(core.Deps{Hypervisor: fakehypervisor.New(), Store: fakes.NewStore(), ImageFiles: fakes.NewImageFiles(filepath.Join(root, "images")),
		Volumes: map[string]ports.Volumes{"qcow2": q, "ceph": c}}, core.Options{Log: log})
	if err != nil {
		f.Fatal(err)
	}
	pods := filepath.Join(root, "pods")

	f.Fuzz(func(t *testing.T, volume, rawOpts string) {
		if volume == "" || volume == "." || volume == ".." || strings.ContainsAny(volume, "/\x00") {
			return // kubelet's volume directories are named after DNS labels
		}
		dir := filepath.Join(pods, "uid-1", "volumes", "virtlet~flexvolume_driver", volume)
		m := mounter{}
		d := &Driver{Daemon: rt, Mounter: m}
		defer os.RemoveAll(pods)

		var given map[string]string
		json.Unmarshal([]byte(rawOpts), &given)
		var secrets []string
		var public strings.Builder
		public.WriteString(dir)
		for k, v := range given {
			switch {
			case k == "secret":
				secrets = append(secrets, v)
			case strings.HasPrefix(k, keySecret):
				if dec, err := base64.StdEncoding.DecodeString(v); err == nil {
					secrets = append(secrets, string(dec))
				}
			default:
				public.WriteString(k + "\x00" + v + "\x00")
			}
		}
		// A secret too short, or also given in the open, proves nothing.
		secrets = slices.DeleteFunc(secrets, func(s string) bool { return len(s) < 8 || strings.Contains(public.String(), s) })
		noSecret := func(where, text string) {
			t.Helper()
			for _, s := range secrets {
				if strings.Contains(text, s) {
					t.Fatalf("a secret is in %s: %s", where, text)
				}
			}
		}

		res := d.Run([]string{"mount", dir, rawOpts})
		answer, _ := json.Marshal(res)
		noSecret("the answer", string(answer))
		switch res.Status {
		case Success:
			if !m[dir] {
				t.Fatal("mounted without a tmpfs")
			}
			data, err := os.ReadFile(filepath.Join(dir, ports.FlexvolumeOptionsFile))
			if err != nil {
				t.Fatalf("no options kept: %v", err)
			}
			noSecret("the volume directory", string(data))
			var kept map[string]string
			if err := json.Unmarshal(data, &kept); err != nil || kept["type"] == "" {
				t.Fatalf("options kept: %v %s", err, data)
			}
			checkFiles(t, root, func(p string) bool {
				return p == filepath.Join(dir, ports.FlexvolumeOptionsFile) || kept["type"] == "ceph" && strings.HasPrefix(p, keys+"/")
			})
			if res := d.Run([]string{"unmount", dir}); res.Status != Success {
				t.Fatalf("unmount after mount: %+v", res)
			}
		case Failure:
			if res.Message == "" {
				t.Fatal("a failure that does not say why")
			}
		default:
			t.Fatalf("answer %+v", res)
		}
		if m[dir] {
			t.Fatal("tmpfs left")
		}
		checkFiles(t, root, func(string) bool { return false })
	})
}

// checkFiles fails on a regular file below root that allowed refuses.
func checkFiles(t *testing.T, root string, allowed func(string) bool) {
	t.Helper()
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return nil
		}
		if !allowed(p) {
			t.Fatalf("file %s written", p)
		}
		return nil
	})
}
