package ceph

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	volumeplugin "github.com/virtlet/virtlet/plugins/volume"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/cephcluster"
	"github.com/virtlet/virtlet/testing/contract/volumetest"
)

func configured(t *testing.T) *Volumes {
	t.Helper()
	return configuredIn(t, t.TempDir())
}

// configuredIn is the plugin configured with state directory stateDir and
// a keys directory of the test's.
func configuredIn(t *testing.T, stateDir string) *Volumes {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	v := New(l)
	cfg := fmt.Sprintf(`{"timeout":"20s","keysDir":%q}`, filepath.Join(t.TempDir(), "keys"))
	if err := v.Configure(context.Background(), ports.PluginConfig{StateDir: stateDir, Config: []byte(cfg)}); err != nil {
		t.Fatal(err)
	}
	return v
}

// user makes a cephx user limited to the rbd pool, as an operator would
// for libvirt, and returns its key.
func user(t *testing.T, c *cephcluster.Cluster, name string) string {
	c.Run(t, "ceph", "auth", "get-or-create", "client."+name, "mon", "profile rbd", "osd", "profile rbd pool=rbd")
	return strings.TrimSpace(c.Run(t, "ceph", "auth", "print-key", "client."+name))
}

func opts(key string, kv ...string) map[string]string {
	m := map[string]string{"type": "ceph", "monitor": cephcluster.Monitor, "pool": "rbd", "volume": "data", "user": "libvirt", "secret": key}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// Against a real cluster: the key is kept by Validate and out of the
// options; Prepare finds the image (or creates it when asked), checks its
// size, and describes an RBD disk whose key is the raw cephx key; Forget
// drops the key; nothing keeps a watch on the image.
func TestAgainstARealCluster(t *testing.T) {
	c := cephcluster.Start(t)
	key := user(t, c, "libvirt")
	ctx := context.Background()
	v := configured(t)
	pod := ports.VolumeRequest{VMID: "0123abcd", PodUID: "uid-1", PodNamespace: "default", PodName: "vm", Name: "data", Type: "ceph"}

	req := pod
	req.Options = opts(key)
	kept, err := v.Validate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := kept["secret"]; ok || kept["monitor"] != cephcluster.Monitor {
		t.Fatalf("kept %v", kept)
	}
	keyFile := filepath.Join(v.keys, "uid-1", "data.key")
	if st, err := os.Stat(keyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	if st, _ := os.Stat(v.keys); st.Mode().Perm() != 0o700 {
		t.Fatalf("keys directory mode %v", st.Mode())
	}

	req.Options = kept
	if _, err := v.Prepare(ctx, req); !errors.Is(err, ports.ErrNotFound) || !strings.Contains(err.Error(), `create: "true"`) {
		t.Fatalf("missing image: %v", err)
	}
	req.Options = map[string]string{"type": "ceph", "monitor": cephcluster.Monitor, "pool": "rbd", "volume": "data", "user": "libvirt",
		"create": "true", "capacity": "64MiB"}
	att, err := v.Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	d := att.Disks[0]
	raw, _ := base64.StdEncoding.DecodeString(key)
	if d.Source.Type != ports.SourceNetwork || d.Source.Protocol != "rbd" || d.Source.Name != "rbd/data" ||
		len(d.Source.Hosts) != 1 || d.Source.Hosts[0] != (ports.NetworkHost{Name: "127.0.0.1", Port: "6789"}) ||
		d.Source.Auth.Username != "libvirt" || string(d.Source.Auth.Secret) != string(raw) || att.Format != "ext4" {
		t.Fatalf("attachment %+v auth %+v", att, d.Source.Auth)
	}
	if info := c.Run(t, "rbd", "info", "rbd/data"); !strings.Contains(info, "size 64 MiB") {
		t.Fatalf("rbd info:\n%s", info)
	}
	if status := c.Run(t, "rbd", "status", "rbd/data"); !strings.Contains(status, "Watchers: none") {
		t.Errorf("the plugin left a watch on the image:\n%s", status)
	}
	// A capacity larger than the image is refused.
	req.Options["capacity"] = "1Gi"
	delete(req.Options, "create")
	if _, err := v.Prepare(ctx, req); !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "the image has 67108864 bytes") {
		t.Fatalf("too small: %v", err)
	}
	// A wrong key: the cluster refuses, the error says where it connected.
	wrong := pod
	wrong.PodUID = "uid-2"
	wrong.Options = opts("AQBzb21lLW90aGVyLWtleS10aGF0LWZhaWxzAA==")
	if _, err := v.Validate(ctx, wrong); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Prepare(ctx, wrong); err == nil || !strings.Contains(err.Error(), "connect to the Ceph monitors 127.0.0.1:6789 as libvirt") {
		t.Fatalf("wrong key: %v", err)
	}
	if err := v.Forget(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(keyFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the key is still kept after Forget")
	}
	if _, err := v.Prepare(ctx, req); !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "does not know its cephx key") {
		t.Fatalf("after Forget: %v", err)
	}
	if strings.Contains(c.Logs(), key) {
		t.Error("the key is in the cluster's logs")
	}
}

func TestContractAgainstARealCluster(t *testing.T) {
	c := cephcluster.Start(t)
	key := user(t, c, "libvirt")
	conn, err := rados.NewConnWithUser("admin")
	if err != nil {
		t.Fatal(err)
	}
	conn.ReadConfigFile(c.Conf)
	if err := conn.Connect(); err != nil {
		t.Fatal(err)
	}
	defer conn.Shutdown()
	ioctx, err := conn.OpenIOContext("rbd")
	if err != nil {
		t.Fatal(err)
	}
	defer ioctx.Destroy()
	env := func(v ports.Volumes) volumetest.Env {
		return volumetest.Env{
			Volumes: v, Persistent: true, Shared: true,
			Request: func(t *testing.T, vmID, name string) ports.VolumeRequest {
				return ports.VolumeRequest{VMID: vmID, PodUID: "uid-c", Name: name, Type: "ceph",
					Options: opts(key, "volume", "contract", "create", "true", "capacity", "16MiB")}
			},
			Exists: func(t *testing.T, att ports.VolumeAttachment) bool {
				img, err := rbd.OpenImageReadOnly(ioctx, strings.TrimPrefix(att.Disks[0].Source.Name, "rbd/"), rbd.NoSnapshot)
				if err != nil {
					return false
				}
				img.Close()
				return true
			},
			Invalid: ports.VolumeRequest{VMID: "vm", PodUID: "uid-c", Name: "data", Type: "ceph", Options: opts(key, "monitor", "nowhere")},
		}
	}
	t.Run("in process", func(t *testing.T) { volumetest.Run(t, env(configured(t))) })
	t.Run("over gRPC", func(t *testing.T) { volumetest.Run(t, env(volumeplugin.NewClient(sdktest.Conn(t, configured(t))))) })
}

// Option errors name the option; the key is never echoed.
func TestOptionErrors(t *testing.T) {
	v := configured(t)
	key := "AQBkZXNrLXRlc3Qta2V5LW5ldmVyLWxvZ2dlZA=="
	for opt, o := range map[string]map[string]string{
		"monitor":  opts(key, "monitor", "10.0.0.1"),
		"pool":     opts(key, "pool", "bad/pool"),
		"secret":   opts("not a key at all!"),
		"capacity": opts(key, "create", "true"),
		"create":   opts(key, "create", "yes"),
		"protocol": opts(key, "protocol", "iscsi"),
		"colour":   opts(key, "colour", "blue"),
	} {
		_, err := v.Validate(context.Background(), ports.VolumeRequest{PodUID: "u", Name: "data", Type: "ceph", Options: o})
		if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "option "+opt) || strings.Contains(err.Error(), "not a key at all") {
			t.Errorf("%s: %v", opt, err)
		}
	}
	noSecret := opts("")
	delete(noSecret, "secret")
	if _, err := v.Validate(context.Background(), ports.VolumeRequest{PodUID: "u", Name: "data", Type: "ceph", Options: noSecret}); err == nil ||
		!strings.Contains(err.Error(), "option secret: missing") {
		t.Errorf("no secret: %v", err)
	}
}
