package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

const configMapMount = "/var/lib/kubelet/pods/uid-p/volumes/kubernetes.io~configmap/app-config"

func TestVMGetsCloudInitMedia(t *testing.T) {
	e := newEnv(t)
	e.kube.Secrets["default/keys"] = map[string][]byte{"authorized_keys": []byte("ssh-ed25519 AAAA from-secret\n")}
	e.kube.ConfigMaps["default/ud"] = map[string][]byte{"users": []byte("- name: alice\n")}
	e.vfiles[configMapMount] = []ports.ProjectedFile{{Path: "app.ini", Data: []byte("[app]\n"), Mode: 0o640}}
	sb := e.runPod(t, "p", map[string]string{
		annotations.SSHKeySource:            "secret/keys",
		annotations.CloudInitUserDataSource: "configmap/ud",
	})
	cfg := vmContainer(e.pull(t))
	cfg.Env = []core.EnvVar{{Name: "GREETING", Value: "hello"}}
	cfg.Mounts = []core.Mount{{ContainerPath: "/etc/app", HostPath: configMapMount, ReadOnly: true},
		{ContainerPath: "/data", HostPath: "/var/lib/kubelet/pods/uid-p/volumes/kubernetes.io~empty-dir/data"}}
	id, err := e.rt.CreateContainer(context.Background(), sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, ok := e.nc.Media(id)
	if !ok {
		t.Fatal("no nocloud media built")
	}
	var md map[string]interface{}
	if err := json.Unmarshal(req.MetaData, &md); err != nil {
		t.Fatal(err)
	}
	if md["instance-id"] != "p.default" || md["local-hostname"] != "p" || fmt.Sprint(md["public-keys"]) != "[ssh-ed25519 AAAA from-secret]" {
		t.Errorf("meta-data %s", req.MetaData)
	}
	ud := string(req.UserData)
	lacks(t, "user-data", ud, "#cloud-config\n", "name: alice", "path: /etc/app/app.ini", `permissions: "0640"`,
		"path: /etc/cloud/environment", "W2FwcF0K" /* "[app]\n" in base64 */)
	if strings.Contains(ud, "path: /data") {
		t.Errorf("an emptyDir mount became files:\n%s", ud)
	}
	spec, _ := e.hv.Spec(id)
	if n := len(spec.Disks); n != 2 {
		t.Fatalf("%d disks", n)
	}
	if len(spec.Filesystems) != 1 || spec.Filesystems[0].Tag != "data" {
		t.Errorf("the emptyDir is not a share: %+v", spec.Filesystems)
	}
	if d := spec.Disks[1]; d.Name != "cloud-init" || d.Device != ports.DeviceCDROM || d.Bus != ports.BusSCSI || !d.ReadOnly {
		t.Errorf("cloud-init disk %+v", d)
	}
	c, err := e.rt.ContainerStatus(context.Background(), id)
	if err != nil || len(c.Spec.Disks) != 2 || c.Datasource != "nocloud" {
		t.Fatalf("record %+v %v", c, err)
	}
	if err := e.rt.RemoveContainer(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if e.nc.Count() != 0 {
		t.Fatal("media left after RemoveContainer")
	}
}

func TestCloudInitDatasourceAndBus(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", map[string]string{annotations.CloudInitImageType: "configdrive", annotations.DiskDriver: "virtio"})
	id := e.createVM(t, sb)
	req, ok := e.cd.Media(id)
	if !ok || e.nc.Count() != 0 {
		t.Fatalf("configdrive media %v, nocloud %d", ok, e.nc.Count())
	}
	// The datasource owns its format: the core hands the same neutral
	// meta-data to every datasource.
	if strings.Contains(string(req.MetaData), `"uuid"`) || !strings.Contains(string(req.MetaData), `"instance-id": "p.default"`) {
		t.Errorf("meta-data handed to the configdrive plugin: %s", req.MetaData)
	}
	spec, _ := e.hv.Spec(id)
	if d := spec.Disks[1]; d.Device != ports.DeviceDisk || d.Bus != ports.BusVirtio || !d.ReadOnly {
		t.Errorf("cloud-init disk on virtio %+v", d)
	}
}

// Each bad input fails CreateContainer naming its cause, and leaves no VM,
// media or record behind.
func TestCloudInitErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ann   map[string]string
		setup func(e *env, cfg *core.ContainerConfig)
		want  []string
		is    error
	}{
		{"missing secret", map[string]string{annotations.SSHKeySource: "secret/nope"}, nil,
			[]string{"annotation VirtletSSHKeySource", "secret default/nope does not exist"}, ports.ErrNotFound},
		{"missing configmap", map[string]string{annotations.CloudInitUserDataSource: "configmap/nope"}, nil,
			[]string{"annotation VirtletCloudInitUserDataSource", "configmap default/nope does not exist"}, ports.ErrNotFound},
		{"missing key", map[string]string{annotations.SSHKeySource: "secret/keys/id.pub"},
			func(e *env, _ *core.ContainerConfig) {
				e.kube.Secrets["default/keys"] = map[string][]byte{"authorized_keys": []byte("k")}
			},
			[]string{"annotation VirtletSSHKeySource", `has no key "id.pub"`, "authorized_keys"}, ports.ErrInvalidArgument},
		{"invalid base64", map[string]string{annotations.CloudInitUserDataSource: "secret/ud",
			annotations.CloudInitUserDataSourceKey: "ud", annotations.CloudInitUserDataSourceEncoding: "base64"},
			func(e *env, _ *core.ContainerConfig) {
				e.kube.Secrets["default/ud"] = map[string][]byte{"ud": []byte("***")}
			},
			[]string{"annotation VirtletCloudInitUserDataSourceEncoding", "not valid base64"}, ports.ErrInvalidArgument},
		{"API server down", map[string]string{annotations.SSHKeySource: "secret/keys"},
			func(e *env, _ *core.ContainerConfig) {
				e.kube.Err = fmt.Errorf("dial tcp: refused: %w", ports.ErrUnavailable)
			},
			[]string{"annotation VirtletSSHKeySource: read secret default/keys", "refused"}, ports.ErrUnavailable},
		{"unreadable mount", nil,
			func(e *env, cfg *core.ContainerConfig) {
				cfg.Mounts = []core.Mount{{ContainerPath: "/etc/app", HostPath: configMapMount}}
			},
			[]string{"mount /etc/app (volume app-config)"}, ports.ErrNotFound},
		{"no datasource plugin", map[string]string{annotations.CloudInitImageType: "configdrive"},
			func(e *env, _ *core.ContainerConfig) {
				e.cd.BuildErr = fmt.Errorf("plugin configdrive: %w", ports.ErrUnavailable)
			},
			[]string{"build configdrive cloud-init media", "plugin configdrive"}, ports.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			sb := e.runPod(t, "p", tc.ann)
			cfg := vmContainer(e.pull(t))
			if tc.setup != nil {
				tc.setup(e, &cfg)
			}
			_, err := e.rt.CreateContainer(context.Background(), sb, cfg)
			if err == nil {
				t.Fatal("no error")
			}
			lacks(t, "error", err.Error(), tc.want...)
			if !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			if vms, _ := e.hv.List(context.Background()); len(vms) != 0 {
				t.Errorf("VMs left: %+v", vms)
			}
			if keys := e.store.Keys(ports.BucketContainers); len(keys) != 0 {
				t.Errorf("records left: %v", keys)
			}
			if e.nc.Count()+e.cd.Count() != 0 {
				t.Error("media left")
			}
		})
	}
}

func TestMissingDatasourcePlugin(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	img := e.pull(t)
	rt, err := core.New(core.Deps{Hypervisor: e.hv, ImageFiles: e.files, Store: e.store}, core.Options{Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err = rt.CreateContainer(context.Background(), sb, vmContainer(img))
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), `annotation VirtletCloudInitImageType: invalid value "nocloud": no installed datasource plugin handles this type`) {
		t.Fatalf("err %v", err)
	}
	// A type no installed plugin handles: the error lists those that are.
	sb = e.runPod(t, "q", map[string]string{annotations.CloudInitImageType: "vfat"})
	_, err = e.rt.CreateContainer(context.Background(), sb, vmContainer(img))
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "(allowed: configdrive, nocloud)") {
		t.Fatalf("err %v", err)
	}
}

func TestDefineFailureRemovesMedia(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	e.hv.Fail["Define"] = errors.New("no space left on device")
	if _, err := e.rt.CreateContainer(context.Background(), sb, vmContainer(e.pull(t))); err == nil {
		t.Fatal("no error")
	}
	if e.nc.Count() != 0 || e.nc.Removes != 1 {
		t.Fatalf("media count %d, removes %d", e.nc.Count(), e.nc.Removes)
	}
}

func TestReconcileRemovesMediaOfInterruptedCreation(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "p", nil)
	e.cancel()
	id := strings.Repeat("c", 64)
	if _, err := e.nc.BuildMedia(ctx, ports.MediaRequest{VMID: id, Datasource: "nocloud"}); err != nil {
		t.Fatal(err)
	}
	rec := fmt.Sprintf(`{"id":%q,"sandboxID":%q,"name":"vm","state":"creating","datasource":"nocloud","spec":{"ID":%q}}`, id, sb, id)
	if err := e.store.Apply(ctx, ports.Put(ports.BucketContainers, id, []byte(rec))); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	if e.nc.Count() != 0 {
		t.Fatal("media of an interrupted creation survived the resync")
	}
	if keys := e.store.Keys(ports.BucketContainers); len(keys) != 0 {
		t.Fatalf("records left: %v", keys)
	}
}
