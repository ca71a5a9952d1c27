package core_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

const podDir = "/var/lib/kubelet/pods/uid-p"

func volDir(plugin, name string) string { return podDir + "/volumes/" + plugin + "/" + name }

// Every mount and device kubelet produces goes somewhere, or the pod is
// refused naming the volume, its kind and what is supported: nothing is
// dropped silently.
func TestEveryMountKubeletMakesGoesSomewhere(t *testing.T) {
	e := newEnv(t)
	e.vdirs[volDir(core.FlexvolumeDriverDir, "extra")] = map[string]string{"type": "qcow2", "capacity": "2048MiB",
		"kubernetes.io/pod.uid": "uid-p"}
	e.vfiles[volDir("kubernetes.io~configmap", "config")] = []ports.ProjectedFile{{Path: "a.conf", Data: []byte("a"), Mode: 0o644}}
	e.vfiles[volDir("kubernetes.io~secret", "secret")] = []ports.ProjectedFile{{Path: "pw", Data: []byte("s3cret"), Mode: 0o600}}
	e.vfiles[volDir("kubernetes.io~projected", "kube-api-access-x")] = []ports.ProjectedFile{{Path: "token", Data: []byte("t"), Mode: 0o644}}
	e.vfiles[volDir("kubernetes.io~downward-api", "podinfo")] = []ports.ProjectedFile{{Path: "labels", Data: []byte("l"), Mode: 0o644}}
	sb := e.runPod(t, "p", map[string]string{annotations.DiskDriver: "virtio"})
	cfg := vmContainer(e.pull(t))
	cfg.Mounts = []core.Mount{
		{ContainerPath: "/etc/hosts", HostPath: podDir + "/etc-hosts"},
		{ContainerPath: "/dev/termination-log", HostPath: podDir + "/containers/vm/5f3a2b1c"},
		{ContainerPath: "/etc/foo", HostPath: volDir("kubernetes.io~configmap", "config"), ReadOnly: true},
		{ContainerPath: "/etc/baz", HostPath: volDir("kubernetes.io~secret", "secret"), ReadOnly: true},
		{ContainerPath: "/var/run/secrets/kubernetes.io/serviceaccount", HostPath: volDir("kubernetes.io~projected", "kube-api-access-x"), ReadOnly: true},
		{ContainerPath: "/etc/podinfo", HostPath: volDir("kubernetes.io~downward-api", "podinfo"), ReadOnly: true},
		{ContainerPath: "/var/lib/docker", HostPath: volDir(core.FlexvolumeDriverDir, "extra")},
		{ContainerPath: "/scratch", HostPath: volDir("kubernetes.io~empty-dir", "cache")},
		{ContainerPath: "/srv", HostPath: "/data/srv", ReadOnly: true},
		{ContainerPath: "/pv", HostPath: volDir("kubernetes.io~csi", "pvc-1234") + "/mount"},
		{ContainerPath: "/local", HostPath: volDir("kubernetes.io~local-volume", "local-pv-1")},
		{ContainerPath: "/nfs", HostPath: volDir("kubernetes.io~nfs", "nfs-pv")},
		{ContainerPath: "/iscsi", HostPath: volDir("kubernetes.io~iscsi", "iscsi-pv"), ReadOnly: true},
	}
	cfg.Devices = []core.Device{{ContainerPath: "/dev/testpvc", HostPath: podDir + "/volumeDevices/kubernetes.io~local-volume/block-pv", Permissions: "mrw"}}
	id, err := e.rt.CreateContainer(context.Background(), sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{id + "/block-pv block", id + "/cache share", id + "/extra qcow2", id + "/iscsi-pv share", id + "/local-pv-1 share", id + "/nfs-pv share",
		id + "/pvc-1234 share", id + "/srv share"}
	if got := e.vols.Prepared(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("prepared volumes %v, want %v", got, want)
	}
	// The plugin gets the volume's options (kubelet's keys too), its type
	// in the request as at Validate.
	if req, _ := e.vols.Request(id, "extra"); req.Type != "qcow2" || req.Options["capacity"] != "2048MiB" || req.Options["type"] != "" ||
		req.PodUID != "uid-p" || req.VMID != id {
		t.Errorf("qcow2 request %+v", req)
	}
	spec, _ := e.hv.Spec(id)
	var disks, shares []string
	for _, d := range spec.Disks {
		disks = append(disks, fmt.Sprintf("%s:%s:%s", d.Name, d.Serial, d.Bus))
	}
	for _, f := range spec.Filesystems {
		shares = append(shares, fmt.Sprintf("%s:%s:ro=%v", f.Tag, f.Source, f.ReadOnly))
	}
	if got := strings.Join(disks, " "); got != "root:virtlet-root:virtio vol-extra:vol-extra:virtio vol-block-pv:vol-block-pv:virtio cloud-init:virtlet-cidata:virtio" {
		t.Errorf("disks %s", got)
	}
	if got := strings.Join(shares, " "); got != "cache:/fake/shares/"+id+"-cache:ro=false srv:/fake/shares/"+id+"-srv:ro=true "+
		"pvc-1234:/fake/shares/"+id+"-pvc-1234:ro=false local-pv-1:/fake/shares/"+id+"-local-pv-1:ro=false "+
		"nfs-pv:/fake/shares/"+id+"-nfs-pv:ro=false iscsi-pv:/fake/shares/"+id+"-iscsi-pv:ro=true" {
		t.Errorf("shares %s", got)
	}
	req, _ := e.nc.Media(id)
	ud := string(req.UserData)
	lacks(t, "user-data", ud,
		"path: /etc/foo/a.conf", "path: /etc/baz/pw", "path: /var/run/secrets/kubernetes.io/serviceaccount/token", "path: /etc/podinfo/labels",
		"- /dev/disk/by-id/virtio-vol-extra\n  - /var/lib/docker", "- cache\n  - /scratch\n  - 9p",
		"- srv\n  - /srv\n  - 9p\n  - trans=virtio,version=9p2000.L,nofail,ro",
		"find_dev '/dev/disk/by-id/virtio-vol-block-pv' 'vol-block-pv'", "ln -sf \"$dev\" '/dev/testpvc'")
	if strings.Contains(ud, "/etc/hosts") || strings.Contains(ud, "termination-log") {
		t.Errorf("kubelet's own files reached the guest:\n%s", ud)
	}
	// The record keeps the volumes, so that removal releases them.
	if err := e.rt.RemoveContainer(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if got := e.vols.Prepared(); len(got) != 0 {
		t.Errorf("volumes left after RemoveContainer: %v", got)
	}
}

func TestUnsupportedVolumesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mount core.Mount
		dev   *core.Device
		want  []string
		is    error
	}{
		{"gitRepo", core.Mount{ContainerPath: "/src", HostPath: volDir("kubernetes.io~git-repo", "repo")},
			nil, []string{"mount /src: volume repo is a git-repo volume, which VM pods do not support", "supported: configMap"}, ports.ErrInvalidArgument},
		{"subPath", core.Mount{ContainerPath: "/etc/app.conf", HostPath: podDir + "/volume-subpaths/config/vm/0"},
			nil, []string{"volume config is mounted with subPath"}, ports.ErrInvalidArgument},
		{"image volume", core.Mount{ContainerPath: "/img", Image: "sha256:abcd"},
			nil, []string{"image volumes (sha256:abcd) are not supported"}, ports.ErrInvalidArgument},
		{"flexvolume of an unknown type", core.Mount{ContainerPath: "/x", HostPath: volDir(core.FlexvolumeDriverDir, "odd")},
			nil, []string{"flexvolume odd option type", `"lvm"`, "allowed: ceph, qcow2, sized"}, ports.ErrInvalidArgument},
		{"flexvolume never mounted by the driver", core.Mount{ContainerPath: "/x", HostPath: volDir(core.FlexvolumeDriverDir, "ghost")},
			nil, []string{"flexvolume ghost", "virtlet-flexvolume.json"}, ports.ErrNotFound},
		{"disk mounted twice", core.Mount{ContainerPath: "/b", HostPath: volDir(core.FlexvolumeDriverDir, "extra")},
			nil, []string{"volume extra (flexvolume) is mounted at both /a and /b"}, ports.ErrInvalidArgument},
		{"two persistent roots", core.Mount{}, &core.Device{ContainerPath: "/", HostPath: podDir + "/volumeDevices/kubernetes.io~local-volume/other"},
			[]string{"two block volumes ask to be the persistent root"}, ports.ErrInvalidArgument},
		{"a device plugin's device", core.Mount{}, &core.Device{ContainerPath: "/dev/kvm", HostPath: "/dev/kvm", Permissions: "rw"},
			[]string{"device /dev/kvm (host /dev/kvm) is not a block volume: devices of device plugins"}, ports.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.vdirs[volDir(core.FlexvolumeDriverDir, "odd")] = map[string]string{"type": "lvm"}
			e.vdirs[volDir(core.FlexvolumeDriverDir, "extra")] = map[string]string{"type": "qcow2"}
			sb := e.runPod(t, "p", nil)
			cfg := vmContainer(e.pull(t))
			cfg.Mounts = []core.Mount{{ContainerPath: "/a", HostPath: volDir(core.FlexvolumeDriverDir, "extra")}}
			if tc.mount.ContainerPath != "" {
				cfg.Mounts = append(cfg.Mounts, tc.mount)
			}
			if tc.dev != nil {
				cfg.Devices = []core.Device{{ContainerPath: "/", HostPath: podDir + "/volumeDevices/kubernetes.io~local-volume/root-pv"}, *tc.dev}
			}
			_, err := e.rt.CreateContainer(context.Background(), sb, cfg)
			refusedUnprepared(t, e, err, tc.is, tc.want...)
		})
	}
}

// A volume that fails to prepare undoes the others, the media and the
// record; so does a hypervisor that refuses the VM.
func TestVolumeFailuresLeaveNothing(t *testing.T) {
	for _, fail := range []string{"volume", "define"} {
		t.Run(fail, func(t *testing.T) {
			e := newEnv(t)
			e.vdirs[volDir(core.FlexvolumeDriverDir, "a")] = map[string]string{"type": "qcow2"}
			e.vdirs[volDir(core.FlexvolumeDriverDir, "b")] = map[string]string{"type": "qcow2"}
			if fail == "volume" {
				e.vols.FailVolume["b"] = fmt.Errorf("disk full: %w", ports.ErrUnavailable)
			} else {
				e.hv.Fail["Define"] = errors.New("no space left on device")
			}
			sb := e.runPod(t, "p", nil)
			cfg := vmContainer(e.pull(t))
			cfg.Mounts = []core.Mount{{ContainerPath: "/a", HostPath: volDir(core.FlexvolumeDriverDir, "a")},
				{ContainerPath: "/s", HostPath: volDir("kubernetes.io~empty-dir", "s")},
				{ContainerPath: "/b", HostPath: volDir(core.FlexvolumeDriverDir, "b")}}
			_, err := e.rt.CreateContainer(context.Background(), sb, cfg)
			if err == nil {
				t.Fatal("no error")
			}
			if fail == "volume" && !strings.Contains(err.Error(), "volume b (flexvolume): disk full") {
				t.Errorf("err %v", err)
			}
			if got := e.vols.Prepared(); len(got) != 0 {
				t.Errorf("volumes left: %v", got)
			}
			if keys := e.store.Keys(ports.BucketContainers); len(keys) != 0 {
				t.Errorf("records left: %v", keys)
			}
			if e.nc.Count() != 0 {
				t.Error("media left")
			}
		})
	}
}

// A network disk's key reaches the hypervisor and no record.
func TestVolumeSecretsStayOutOfRecords(t *testing.T) {
	e := newEnv(t)
	const key = "AQBkZXNrLXRlc3Qta2V5LW5ldmVyLWxvZ2dlZA=="
	ctx := context.Background()
	fv := ports.FlexvolumeOptions{PodUID: "uid-p", PodNamespace: "default", PodName: "p", Volume: "ceph",
		Options: map[string]string{"type": "ceph", "monitor": "127.0.0.1:6789", "secret": key}}
	kept, err := e.rt.ValidateVolume(ctx, fv)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := kept["secret"]; ok || kept["type"] != "ceph" || kept["monitor"] != "127.0.0.1:6789" {
		t.Fatalf("kept options %v", kept)
	}
	e.vdirs[volDir(core.FlexvolumeDriverDir, "ceph")] = kept
	sb := e.runPod(t, "p", nil)
	cfg := vmContainer(e.pull(t))
	cfg.Mounts = []core.Mount{{ContainerPath: "/cephdata", HostPath: volDir(core.FlexvolumeDriverDir, "ceph")}}
	id, err := e.rt.CreateContainer(ctx, sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := e.rt.ContainerStatus(ctx, id)
	if d := c.Spec.Disks[1]; d.Source.Type != ports.SourceNetwork || d.Source.Auth == nil || d.Source.Auth.Secret != nil {
		t.Fatalf("recorded disk %+v", d)
	}
	for _, bucket := range ports.Buckets {
		all, _ := e.store.List(ctx, bucket)
		for k, v := range all {
			if strings.Contains(string(v), key) || strings.Contains(string(v), base64.StdEncoding.EncodeToString([]byte(key))) {
				t.Errorf("record %s/%s holds the key", bucket, k)
			}
		}
	}
	if err := e.rt.ForgetVolume(ctx, fv); err != nil {
		t.Fatal(err)
	}
	// The type's plugin was uninstalled since: the unmount still succeeds.
	gone := fv
	gone.Options = map[string]string{"type": "lvm"}
	if err := e.rt.ForgetVolume(ctx, gone); err != nil {
		t.Fatalf("forgetting a volume of an uninstalled type: %v", err)
	}
	if _, ok := e.vols.Kept("uid-p", "ceph"); ok {
		t.Error("the plugin still keeps the key after ForgetVolume")
	}
}

func TestValidateVolumeErrors(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		opts map[string]string
		want string
	}{
		{map[string]string{"capacity": "1G"}, "option type: missing (allowed: one of the installed volume types"},
		{map[string]string{"type": "lvm"}, `option type: invalid value "lvm": no installed volume plugin handles it (allowed: ceph, qcow2, sized)`},
		{map[string]string{"type": "share"}, "this type is for Kubernetes volumes, not flexvolumes"},
		{map[string]string{"type": "sized"}, "flexvolume data (type sized): sized volume data option size: missing"},
	} {
		_, err := e.rt.ValidateVolume(context.Background(), ports.FlexvolumeOptions{PodUID: "u", Volume: "data", Options: tc.opts})
		if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.opts, err, tc.want)
		}
	}
}

// A block volume at devicePath "/" is the VM's root: the plugin gets the
// image to put on it, the VM boots from it, and the guest gets no
// network-config (a persistent root keeps its first network).
func TestPersistentRoot(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	img := e.pull(t)
	root := core.Device{ContainerPath: "/", HostPath: podDir + "/volumeDevices/kubernetes.io~local-volume/root-pv"}

	sb := e.runPod(t, "p", map[string]string{annotations.PersistentRootfsReinit: "true"})
	cfg := vmContainer(img)
	cfg.Devices = []core.Device{root}
	id, err := e.rt.CreateContainer(ctx, sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, ok := e.vols.Request(id, "root-pv")
	if !ok || req.Rootfs == nil || req.Rootfs.ImageDigest != img || !req.Rootfs.Reinitialize || req.Rootfs.ImagePath == "" || req.Rootfs.ImageName != testImage {
		t.Fatalf("rootfs request %+v", req.Rootfs)
	}
	spec, _ := e.hv.Spec(id)
	if d := spec.Disks[0]; d.Name != "root" || !d.Boot || d.Overlay != nil || d.Source.Type != ports.SourceBlock || d.Source.Offset != 1<<20 || d.Serial != core.RootSerial {
		t.Fatalf("root disk %+v", d)
	}
	if len(spec.Disks) != 2 {
		t.Fatalf("disks %+v", spec.Disks)
	}
	if media, _ := e.nc.Media(id); len(media.NetworkConfig) != 0 || media.Network != nil {
		t.Errorf("a persistent root got network-config: %s", media.NetworkConfig)
	}
	other := e.createVM(t, e.runPod(t, "plain", nil))
	if media, _ := e.nc.Media(other); len(media.NetworkConfig) == 0 {
		t.Error("a pod on the network without a persistent root got no network-config")
	}

	for _, tc := range []struct {
		ann  map[string]string
		devs []core.Device
		want string
	}{
		{map[string]string{annotations.RootVolumeSize: "4Gi"}, []core.Device{root},
			"annotation VirtletRootVolumeSize: invalid value \"4Gi\": the VM's root is the persistent root filesystem on block volume root-pv"},
		{map[string]string{annotations.PersistentRootfsReinit: "true"}, nil,
			"annotation VirtletPersistentRootfsReinit: invalid value \"true\": the pod has no persistent root filesystem"},
	} {
		sb := e.runPod(t, "bad"+fmt.Sprint(len(tc.devs)), tc.ann)
		cfg := vmContainer(img)
		cfg.Devices = tc.devs
		if _, err := e.rt.CreateContainer(ctx, sb, cfg); !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.ann, err, tc.want)
		}
	}
}

// A flexvolume with rootfs: "true" on a type whose plugin can hold a root
// (ceph) is the VM's persistent root: the plugin gets the image, the VM
// boots its disk, and its mount path is mounted nowhere in the guest.
func TestFlexvolumePersistentRoot(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	img := e.pull(t)
	fv := ports.FlexvolumeOptions{PodUID: "uid-p", PodNamespace: "default", PodName: "p", Volume: "root",
		Options: map[string]string{"type": "ceph", "monitor": "127.0.0.1:6789", "rootfs": "true", "secret": "AQBrZXk="}}
	kept, err := e.rt.ValidateVolume(ctx, fv)
	if err != nil {
		t.Fatal(err)
	}
	e.vdirs[volDir(core.FlexvolumeDriverDir, "root")] = kept
	sb := e.runPod(t, "p", map[string]string{annotations.PersistentRootfsReinit: "true"})
	cfg := vmContainer(img)
	cfg.Mounts = []core.Mount{{ContainerPath: "/not-in-the-guest", HostPath: volDir(core.FlexvolumeDriverDir, "root")}}
	id, err := e.rt.CreateContainer(ctx, sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, ok := e.vols.Request(id, "root")
	if !ok || req.Type != "ceph" || req.Rootfs == nil || req.Rootfs.ImageDigest != img || !req.Rootfs.Reinitialize || req.Options["rootfs"] != "true" {
		t.Fatalf("ceph request %+v rootfs %+v", req, req.Rootfs)
	}
	spec, _ := e.hv.Spec(id)
	if d := spec.Disks[0]; d.Name != "root" || !d.Boot || d.Overlay != nil || d.Serial != core.RootSerial ||
		d.Source.Type != ports.SourceNetwork || d.Source.Name != "pool/root" || d.Source.Offset != 1<<20 {
		t.Fatalf("root disk %+v", d)
	}
	if len(spec.Disks) != 2 || spec.Disks[1].Name != "cloud-init" {
		t.Fatalf("disks %+v: the root volume is attached once, as the root", spec.Disks)
	}
	media, _ := e.nc.Media(id)
	if ud := string(media.UserData); strings.Contains(ud, "/not-in-the-guest") || strings.Contains(ud, "vol-root") {
		t.Errorf("the root volume's mount path reached the guest:\n%s", ud)
	}
	if len(media.NetworkConfig) != 0 {
		t.Errorf("a persistent root got network-config: %s", media.NetworkConfig)
	}
}

// A pod is refused, before any volume is prepared, when it asks for two
// roots, a read-only root, or a root on a type that cannot hold one; the
// error names the volume and the option.
func TestFlexvolumePersistentRootRefusals(t *testing.T) {
	root := func(name string) core.Mount {
		return core.Mount{ContainerPath: "/" + name, HostPath: volDir(core.FlexvolumeDriverDir, name)}
	}
	for _, tc := range []struct {
		name   string
		mounts []core.Mount
		devs   []core.Device
		fail   error // of the plugin's RootfsTypes
		want   []string
		is     error
	}{
		{"two rootfs flexvolumes", []core.Mount{root("root"), root("root2")}, nil, nil,
			[]string{`flexvolume root2 option rootfs: invalid value "true": volume root is the VM's persistent root filesystem already (a ceph flexvolume with rootfs: "true")`},
			ports.ErrInvalidArgument},
		{"a rootfs flexvolume and a block volume at /", []core.Mount{root("root")},
			[]core.Device{{ContainerPath: "/", HostPath: podDir + "/volumeDevices/kubernetes.io~local-volume/root-pv"}}, nil,
			[]string{"device / (block volume root-pv)", "volume root is the VM's persistent root filesystem already"}, ports.ErrInvalidArgument},
		{"read-only", []core.Mount{{ContainerPath: "/r", HostPath: volDir(core.FlexvolumeDriverDir, "root"), ReadOnly: true}}, nil, nil,
			[]string{`flexvolume root option rootfs: invalid value "true": the volume is mounted read-only`}, ports.ErrInvalidArgument},
		{"a type that cannot hold a root", []core.Mount{root("scratch")}, nil, nil,
			[]string{`flexvolume scratch option rootfs: invalid value "true": volume type qcow2 cannot hold a persistent root filesystem`,
				`on a volume type that can (ceph)`}, ports.ErrInvalidArgument},
		{"not a boolean", []core.Mount{root("odd")}, nil, nil,
			[]string{`flexvolume odd option rootfs: invalid value "yes"`}, ports.ErrInvalidArgument},
		{"the plugin cannot say", []core.Mount{root("root")}, nil, fmt.Errorf("plugin ceph is restarting: %w", ports.ErrUnavailable),
			[]string{"flexvolume root (type ceph): ask its plugin whether it can hold a persistent root filesystem: plugin ceph is restarting"},
			ports.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			for name, typ := range map[string]string{"root": "ceph", "root2": "ceph", "scratch": "qcow2"} {
				e.vdirs[volDir(core.FlexvolumeDriverDir, name)] = map[string]string{"type": typ, "rootfs": "true"}
			}
			e.vdirs[volDir(core.FlexvolumeDriverDir, "odd")] = map[string]string{"type": "ceph", "rootfs": "yes"}
			if tc.fail != nil {
				e.vols.SetFail("RootfsTypes", tc.fail)
			}
			sb := e.runPod(t, "p", nil)
			cfg := vmContainer(e.pull(t))
			cfg.Mounts, cfg.Devices = tc.mounts, tc.devs
			_, err := e.rt.CreateContainer(context.Background(), sb, cfg)
			refusedUnprepared(t, e, err, tc.is, tc.want...)
		})
	}
}

// VirtletFilesFromDataSource: the keys become files written into the root
// file system before the first boot, as Virtlet read them; bad keys fail
// naming the key and the path.
func TestFilesFromDataSource(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.kube.ConfigMaps["default/files"] = map[string][]byte{
		"locale": []byte(`LANG="pl_PL.UTF-8"`), "locale_path": []byte("/etc/locale.conf"), "locale_encoding": []byte("plain"),
		"host_conf": []byte("bXVsdGkgb2ZmCg=="), "host_conf_path": []byte("/etc/host.conf\n"),
	}
	e.kube.Secrets["default/files"] = map[string][]byte{"key": []byte("c2VjcmV0"), "key_path": []byte("/root/.key")}
	sb := e.runPod(t, "p", map[string]string{annotations.FilesFromDataSource: "configmap/files"})
	id := e.createVM(t, sb)
	if got := fmt.Sprint(e.hv.Files(id)); got != "[/etc/host.conf 0644 10 /etc/locale.conf 0644 18]" {
		t.Errorf("files written %s", got)
	}
	sb = e.runPod(t, "q", map[string]string{annotations.FilesFromDataSource: "secret/files"})
	id = e.createVM(t, sb)
	if got := fmt.Sprint(e.hv.Files(id)); got != "[/root/.key 0600 6]" {
		t.Errorf("files of a secret %s", got)
	}

	for name, tc := range map[string]struct {
		data map[string][]byte
		want string
	}{
		"no path":         {map[string][]byte{"x": []byte("eA==")}, "key x_path: missing"},
		"relative":        {map[string][]byte{"x": []byte("eA=="), "x_path": []byte("etc/x")}, `key x_path: invalid value "etc/x": not a clean absolute file path`},
		"dot-dot":         {map[string][]byte{"x": []byte("eA=="), "x_path": []byte("/etc/../x")}, "not a clean absolute file path"},
		"leading dot-dot": {map[string][]byte{"x": []byte("eA=="), "x_path": []byte("../etc/x")}, "not a clean absolute file path"},
		"NUL":             {map[string][]byte{"x": []byte("eA=="), "x_path": []byte("/etc/shadow\x00.conf")}, "holds a NUL or control character"},
		"newline":         {map[string][]byte{"x": []byte("eA=="), "x_path": []byte("/etc/x\ny")}, "holds a NUL or control character"},
		"not base64":      {map[string][]byte{"x": []byte("plain text"), "x_path": []byte("/x")}, "key x: the content for /x is not valid base64"},
		"bad encoding":    {map[string][]byte{"x": []byte("a"), "x_path": []byte("/x"), "x_encoding": []byte("gzip")}, `key x_encoding: invalid value "gzip": unknown encoding`},
		"stray path":      {map[string][]byte{"y_path": []byte("/y")}, "key y_path: it belongs to no file key"},
		"empty":           {map[string][]byte{}, "has no file keys"},
	} {
		e.kube.ConfigMaps["default/bad"] = tc.data
		sb := e.runPod(t, "bad-"+strings.ReplaceAll(name, " ", "-"), map[string]string{annotations.FilesFromDataSource: "configmap/bad"})
		_, err := e.rt.CreateContainer(ctx, sb, vmContainer(e.pull(t)))
		if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "annotation VirtletFilesFromDataSource (configmap/bad)") ||
			!strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", name, err, tc.want)
		}
	}
	// A hypervisor that cannot write them fails the pod and leaves nothing.
	e.hv.Fail["WriteFiles"] = fmt.Errorf("no root file system: %w", ports.ErrFailedPrecondition)
	sb = e.runPod(t, "r", map[string]string{annotations.FilesFromDataSource: "configmap/files"})
	_, err := e.rt.CreateContainer(ctx, sb, vmContainer(e.pull(t)))
	if !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "write the files of configmap/files into the root file system") {
		t.Fatalf("err %v", err)
	}
	if keys := e.store.Keys(ports.BucketContainers); len(keys) != 2 {
		t.Errorf("records %v, want the two good VMs'", keys)
	}
}

// A crash while creating a VM with volumes: the next start releases them.
func TestReconcileReleasesVolumesOfInterruptedCreation(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	cfg := vmContainer(e.pull(t))
	cfg.Mounts = []core.Mount{{ContainerPath: "/s", HostPath: volDir("kubernetes.io~empty-dir", "s")}}
	e.hv.Fail["Define"] = errors.New("the daemon dies here")
	e.store.FailApply = nil
	// The failing Define is undone at once; make the undo fail so that the
	// record stays "creating", as after a crash.
	e.vols.Fail["Release"] = errors.New("plugin down")
	if _, err := e.rt.CreateContainer(context.Background(), sb, cfg); err == nil {
		t.Fatal("no error")
	}
	if len(e.vols.Prepared()) != 1 {
		t.Fatalf("prepared %v", e.vols.Prepared())
	}
	delete(e.hv.Fail, "Define")
	delete(e.vols.Fail, "Release")
	e.start(t)
	eventually(t, "volumes released", func() bool { return len(e.vols.Prepared()) == 0 })
	if keys := e.store.Keys(ports.BucketContainers); len(keys) != 0 {
		t.Errorf("records left: %v", keys)
	}
}

// A creation whose undo fails (the volume plugin was restarting) is undone
// again once the plugin is back, without waiting for a resubscription to
// the hypervisor: nothing of it stays, not even its record.
func TestFailedUndoIsRetried(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	cfg := vmContainer(e.pull(t))
	cfg.Mounts = []core.Mount{{ContainerPath: "/s", HostPath: volDir("kubernetes.io~empty-dir", "s")}}
	e.hv.Fail["Define"] = errors.New("the hypervisor plugin died during the call")
	e.vols.SetFail("Release", &ports.UnavailableError{Plugin: "ninep", Kind: ports.KindVolume, Reason: "restarting"})
	if _, err := e.rt.CreateContainer(context.Background(), sb, cfg); err == nil {
		t.Fatal("no error")
	}
	if len(e.vols.Prepared()) != 1 {
		t.Fatalf("prepared %v", e.vols.Prepared())
	}
	e.vols.SetFail("Release", nil)
	eventually(t, "volumes released", func() bool { return len(e.vols.Prepared()) == 0 })
	eventually(t, "the record dropped", func() bool { return len(e.store.Keys(ports.BucketContainers)) == 0 })
	delete(e.hv.Fail, "Define")
	if id := e.createVM(t, sb); id == "" {
		t.Fatal("no container")
	}
}

// One share mounted twice keeps each mount's read-only flag in the guest
// (the host side is read-only only if every mount is); two hostPaths with
// the same base name are two shares.
func TestSharesMountedTwiceAndSameNamedHostPaths(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	cfg := vmContainer(e.pull(t))
	cache := volDir("kubernetes.io~empty-dir", "cache")
	cfg.Mounts = []core.Mount{
		{ContainerPath: "/cache", HostPath: cache},
		{ContainerPath: "/cache-ro", HostPath: cache, ReadOnly: true},
		{ContainerPath: "/a", HostPath: "/srv/a/data"},
		{ContainerPath: "/b", HostPath: "/srv/b/data", ReadOnly: true},
	}
	id, err := e.rt.CreateContainer(context.Background(), sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if req, _ := e.vols.Request(id, "cache"); req.ReadOnly {
		t.Error("a share with a read-write mount was made read-only on the host")
	}
	if a, _ := e.vols.Request(id, "data"); a.HostPath != "/srv/a/data" {
		t.Errorf("volume data: %+v", a)
	}
	if b, _ := e.vols.Request(id, "data-2"); b.HostPath != "/srv/b/data" || !b.ReadOnly {
		t.Errorf("volume data-2: %+v", b)
	}
	media, _ := e.nc.Media(id)
	ud := string(media.UserData)
	lacks(t, "user-data", ud, "- cache\n  - /cache\n  - 9p\n  - trans=virtio,version=9p2000.L,nofail\n",
		"- cache\n  - /cache-ro\n  - 9p\n  - trans=virtio,version=9p2000.L,nofail,ro\n",
		"- data\n  - /a\n", "- data-2\n  - /b\n  - 9p\n  - trans=virtio,version=9p2000.L,nofail,ro\n")
}

// refusedUnprepared checks that CreateContainer refused a pod with an
// error that is is and names want, before any volume was prepared.
func refusedUnprepared(t *testing.T, e *env, err, is error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("the pod was not refused")
	}
	lacks(t, "error", err.Error(), want...)
	if !errors.Is(err, is) {
		t.Errorf("error %v is not %v", err, is)
	}
	if n := e.vols.Prepares; n != 0 {
		t.Errorf("%d volumes prepared for a refused pod", n)
	}
}
