package plugins_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/virtlet/virtlet/plugins/datasource"
	"github.com/virtlet/virtlet/plugins/image"
	"github.com/virtlet/virtlet/plugins/network"
	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/plugins/volume"
	"github.com/virtlet/virtlet/ports"
)

// echo records what crossed the wire and answers with fixed values, for
// every kind without a real adapter yet; it checks the shims lose nothing.
type echo struct {
	kind ports.PluginKind
	got  interface{}
}

func (e *echo) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "echo", Kind: e.kind, Version: "1", Handles: []string{"x"}, RootfsTypes: []string{"x"}}
}

var (
	disk = ports.Disk{Name: "vol-ceph", Device: ports.DeviceDisk, Bus: ports.BusSCSI, ReadOnly: true, Serial: "s1",
		Source: ports.DiskSource{Type: ports.SourceNetwork, Format: "raw", Protocol: "rbd", Name: "pool/img",
			Hosts: []ports.NetworkHost{{Name: "127.0.0.1", Port: "6789"}}, Auth: &ports.DiskAuth{Username: "admin", SecretType: "ceph", Secret: []byte("k")}}}
	slice = ports.Disk{Name: "root", Device: ports.DeviceDisk, Bus: ports.BusVirtio, Boot: true,
		Source: ports.DiskSource{Type: ports.SourceBlock, Path: "/dev/loop3", Format: "raw", Offset: 1 << 20, Size: 1 << 30}}
	rbdRoot = ports.Disk{Name: "root", Device: ports.DeviceDisk, Bus: ports.BusVirtio, Boot: true,
		Source: ports.DiskSource{Type: ports.SourceNetwork, Format: "raw", Protocol: "rbd", Name: "pool/root", Offset: 1 << 20, Size: 3 << 30,
			Hosts: []ports.NetworkHost{{Name: "127.0.0.1", Port: "6789"}}, Auth: &ports.DiskAuth{Username: "admin", SecretType: "ceph", Secret: []byte("k")}}}
	fsys       = ports.Filesystem{Source: "/var/lib/kubelet/pods/u/volumes/x", Tag: "x", AccessMode: "squash", ReadOnly: true}
	attachment = ports.NetworkAttachment{NetNSPath: "/var/run/netns/p", DNS: &ports.DNSConfig{Servers: []string{"198.18.0.10"}, Searches: []string{"svc"}, Options: []string{"ndots:5"}},
		Interfaces: []ports.NetworkInterface{{Name: "eth0", MAC: "52:54:00:00:00:01", MTU: 1450, Bridge: "vlb-0123456789a",
			IPs: []ports.IPConfig{{Address: "198.18.0.5/24", Gateway: "198.18.0.1"}, {Address: "fd00::5/64", Gateway: "fd00::1"}}}},
		Routes: []ports.Route{{Destination: "0.0.0.0/0", Gateway: "198.18.0.1"}}}
)

func (e *echo) Fetch(ctx context.Context, req ports.FetchRequest) (ports.FetchResult, error) {
	e.got = req
	return ports.FetchResult{Digest: "sha256:ab", Size: 7, Format: "raw", VirtualSize: 1 << 20}, nil
}
func (e *echo) Validate(ctx context.Context, req ports.VolumeRequest) (map[string]string, error) {
	e.got = req
	return map[string]string{"kept": "yes"}, nil
}
func (e *echo) Forget(ctx context.Context, req ports.VolumeRequest) error { e.got = req; return nil }
func (e *echo) Prepare(ctx context.Context, req ports.VolumeRequest) (ports.VolumeAttachment, error) {
	e.got = req
	return ports.VolumeAttachment{Disks: []ports.Disk{disk, slice, rbdRoot}, Filesystems: []ports.Filesystem{fsys}, Format: "ext4", FormatUUID: "u-1"}, nil
}
func (e *echo) Release(ctx context.Context, req ports.VolumeRequest) error { e.got = req; return nil }
func (e *echo) BuildMedia(ctx context.Context, req ports.MediaRequest) (ports.Disk, error) {
	e.got = req
	return disk, nil
}
func (e *echo) RemoveMedia(ctx context.Context, id string) error { e.got = id; return nil }
func (e *echo) Ready(ctx context.Context) (ports.NetworkReadiness, error) {
	return ports.NetworkReadiness{Reason: "NoConfig", Message: "no CNI config"}, nil
}
func (e *echo) Setup(ctx context.Context, req ports.NetworkRequest) (ports.NetworkAttachment, error) {
	e.got = req
	return attachment, nil
}
func (e *echo) Teardown(ctx context.Context, req ports.NetworkRequest) error { e.got = req; return nil }

func same(t *testing.T, what string, got, want interface{}) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s changed in transit:\n got %#v\nwant %#v", what, got, want)
	}
}

func TestImageShim(t *testing.T) {
	e := &echo{kind: ports.KindImage}
	c := image.NewClient(sdktest.Conn(t, e))
	req := ports.FetchRequest{Name: "virtlet.cloud/x", Location: "https://x", Transport: "t", TransportConfig: []byte(`{"a":1}`),
		Auth: &ports.RegistryAuth{Username: "u", Password: "p", Auth: "a", ServerAddress: "s", IdentityToken: "i", RegistryToken: "r"},
		Dest: "/tmp/d", ExpectedDigest: "sha256:cd"}
	res, err := c.Fetch(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "request", e.got, req)
	same(t, "result", res, ports.FetchResult{Digest: "sha256:ab", Size: 7, Format: "raw", VirtualSize: 1 << 20})
}

func TestVolumeShim(t *testing.T) {
	e := &echo{kind: ports.KindVolume}
	c := volume.NewClient(sdktest.Conn(t, e))
	req := ports.VolumeRequest{VMID: "vm", PodUID: "u", PodNamespace: "ns", PodName: "p", Name: "data", Type: "ceph",
		Options: map[string]string{"pool": "rbd"}, HostPath: "/h", ReadOnly: true, Chown: true,
		Rootfs: &ports.RootfsRequest{ImagePath: "/i", ImageFormat: "qcow2", ImageDigest: "sha256:ab", ImageName: "virtlet.cloud/x",
			ImageVirtualSize: 1 << 30, Reinitialize: true}}
	att, err := c.Prepare(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "request", e.got, req)
	same(t, "attachment", att, ports.VolumeAttachment{Disks: []ports.Disk{disk, slice, rbdRoot}, Filesystems: []ports.Filesystem{fsys}, Format: "ext4", FormatUUID: "u-1"})
	// The types that may hold a persistent root come from the plugin's
	// PluginInfo.
	if types, err := c.RootfsTypes(context.Background()); err != nil || len(types) != 1 || types[0] != "x" {
		t.Fatalf("RootfsTypes: %v %v", types, err)
	}
	kept, err := c.Validate(context.Background(), req)
	if err != nil || kept["kept"] != "yes" {
		t.Fatalf("Validate: %v %v", kept, err)
	}
	same(t, "validate request", e.got, req)
	if err := c.Forget(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	same(t, "forget request", e.got, req)
	if err := c.Release(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	same(t, "release request", e.got, req)
}

func TestDatasourceShim(t *testing.T) {
	e := &echo{kind: ports.KindDatasource}
	c := datasource.NewClient(sdktest.Conn(t, e))
	req := ports.MediaRequest{VMID: "vm", Datasource: "nocloud", MetaData: []byte(`{"a":1}`), UserData: []byte("#cloud-config\n"),
		NetworkConfig: []byte("version: 1\n"), Network: &attachment}
	d, err := c.BuildMedia(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "request", e.got, req)
	same(t, "disk", d, disk)
	if err := c.RemoveMedia(context.Background(), "vm"); err != nil || e.got != "vm" {
		t.Fatalf("RemoveMedia: %v %v", e.got, err)
	}
}

func TestNetworkShim(t *testing.T) {
	e := &echo{kind: ports.KindNetwork}
	c := network.NewClient(sdktest.Conn(t, e))
	req := ports.NetworkRequest{SandboxID: "sb", PodName: "p", PodNamespace: "ns", PodUID: "u",
		DNS: &ports.DNSConfig{Servers: []string{"1.1.1.1"}}, PortMappings: []ports.PortMapping{{Protocol: "TCP", ContainerPort: 22, HostPort: 2222, HostIP: "127.0.0.1"}},
		Annotations: map[string]string{"a": "b"}}
	att, err := c.Setup(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "request", e.got, req)
	same(t, "attachment", att, attachment)
	r, err := c.Ready(context.Background())
	if err != nil || r.Ready || r.Reason != "NoConfig" || r.Message != "no CNI config" {
		t.Fatalf("Ready %+v %v", r, err)
	}
	if err := c.Teardown(context.Background(), req); err != nil {
		t.Fatal(err)
	}
}
