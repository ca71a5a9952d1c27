package core_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/core/presets"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/fakes"
)

type env struct {
	rt      *core.Runtime
	hv      *fakehypervisor.Hypervisor
	store   *fakes.Store
	images  *fakes.ImageSource
	files   *fakes.ImageFiles
	net     *fakes.Network
	nc, cd  *fakes.Datasource
	kube    *fakes.KubeObjects
	vfiles  fakes.ProjectedFiles
	vols    *fakes.Volumes
	vdirs   fakes.VolumeDirs
	dialer  ports.Dialer
	node    ports.NodeInspector
	peers   ports.MigrationPeers
	obs     *observed
	users   *core.VMUsers
	presets *presets.Set
	// limits are the node's limits the runtime starts with.
	limits core.Options
	logDir string
	cancel context.CancelFunc
	// sentBefore is what the fake hypervisor had sent before the runtime
	// of the latest start subscribed (settled).
	sentBefore uint64
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{
		hv: fakehypervisor.New(), store: fakes.NewStore(), images: fakes.NewImageSource(),
		files: fakes.NewImageFiles(dir), net: fakes.NewNetwork(), logDir: t.TempDir(),
		nc: fakes.NewDatasource("nocloud"), cd: fakes.NewDatasource("configdrive"),
		kube: fakes.NewKubeObjects(), vfiles: fakes.ProjectedFiles{},
		vols: fakes.NewVolumes(), vdirs: fakes.VolumeDirs{}, obs: &observed{},
	}
	e.start(t)
	return e
}

// start (re)creates the runtime over the env's ports, as a daemon start does.
func (e *env) start(t *testing.T) {
	t.Helper()
	if e.cancel != nil {
		e.cancel()
		// The stopped runtime's subscription goes before the next one
		// comes, so that settled counts the new runtime's events only.
		eventually(t, "the stopped runtime's watch to end", func() bool { return e.hv.Watchers() == 0 })
	}
	e.sentBefore = e.hv.Sent()
	rt, err := core.New(core.Deps{
		Hypervisor: e.hv, ImageSources: map[string]ports.ImageSource{"https": e.images},
		ImageFiles: e.files, Store: e.store, Network: e.net,
		Datasources: map[string]ports.Datasource{"nocloud": e.nc, "configdrive": e.cd},
		Kube:        e.kube, Files: e.vfiles, VolumeDirs: e.vdirs, Dialer: e.dialer, Observer: e.obs, Node: e.node, Migration: e.peers,
		Volumes: map[string]ports.Volumes{ports.VolumeShare: e.vols, ports.VolumeBlock: e.vols, "qcow2": e.vols, "ceph": e.vols, "sized": e.vols},
	}, core.Options{Log: quietLog(), OperationTimeout: 10 * time.Second, VMUsers: e.users, Presets: e.presets,
		MaxImageBytes: e.limits.MaxImageBytes, MaxVirtualBytes: e.limits.MaxVirtualBytes, KeepFreeBytes: e.limits.KeepFreeBytes,
		NoMemorySharing: e.limits.NoMemorySharing})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := rt.Load(ctx); err != nil {
		t.Fatal(err)
	}
	go rt.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := rt.WaitSynced(wctx); err != nil {
		t.Fatalf("runtime never synced: %v", err)
	}
	e.rt, e.cancel = rt, cancel
}

func vmPod(name string, extra map[string]string) core.SandboxConfig {
	ann := map[string]string{annotations.TargetRuntime: annotations.TargetRuntimeValue}
	for k, v := range extra {
		ann[k] = v
	}
	return core.SandboxConfig{Name: name, Namespace: "default", UID: "uid-" + name, Annotations: ann,
		LogDirectory: "/var/log/pods/default_" + name, Labels: map[string]string{"app": name}}
}

const testImage = "virtlet.cloud/example.com/tiny.qcow2"

func (e *env) pull(t *testing.T) string {
	t.Helper()
	id, err := e.rt.PullImage(context.Background(), testImage, nil)
	if err != nil {
		t.Fatalf("PullImage: %v", err)
	}
	return id
}

func (e *env) runPod(t *testing.T, name string, extra map[string]string) string {
	t.Helper()
	cfg := vmPod(name, extra)
	cfg.LogDirectory = filepath.Join(e.logDir, name)
	id, err := e.rt.RunSandbox(context.Background(), cfg)
	if err != nil {
		t.Fatalf("RunSandbox: %v", err)
	}
	return id
}

func vmContainer(image string) core.ContainerConfig {
	return core.ContainerConfig{Name: "vm", Image: image, UserImage: testImage, LogPath: "vm/0.log",
		MemoryLimitBytes: 256 << 20, Labels: map[string]string{"c": "1"}}
}

func (e *env) createVM(t *testing.T, sandboxID string) string {
	t.Helper()
	img := e.pull(t)
	id, err := e.rt.CreateContainer(context.Background(), sandboxID, vmContainer(img))
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	return id
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// settled waits until the runtime has taken and applied every VM state
// event the fake hypervisor sent it: what a test asserts after it holds
// with the events applied, not only with them still on their way.
func (e *env) settled(t *testing.T) {
	t.Helper()
	eventually(t, "the VM state events to be applied", func() bool {
		received, settled := e.rt.EventsSettled()
		return settled && received == e.hv.Sent()-e.sentBefore
	})
}

func TestRunSandboxVMPodRules(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*core.SandboxConfig)
		wantErr string
		// claimed: a mixed node routes the pod to Virtlet (which may
		// then refuse it) rather than to its container runtime.
		claimed bool
	}{
		{"annotation", func(c *core.SandboxConfig) {}, "", true},
		{"runtime handler only", func(c *core.SandboxConfig) { c.Annotations = nil; c.RuntimeHandler = "virtlet" }, "", true},
		{"neither", func(c *core.SandboxConfig) { c.Annotations = map[string]string{"a": "b"} },
			"neither the annotation kubernetes.io/target-runtime: virtlet.cloud nor the runtime handler \"virtlet\"", false},
		{"other target runtime", func(c *core.SandboxConfig) { c.Annotations[annotations.TargetRuntime] = "docker" }, `is "docker", not "virtlet.cloud"`, false},
		{"other handler", func(c *core.SandboxConfig) { c.RuntimeHandler = "runc" }, `runtime handler "runc" is not "virtlet"`, true},
		{"host network", func(c *core.SandboxConfig) { c.HostNetwork = true }, "hostNetwork is not supported", true},
		{"no uid", func(c *core.SandboxConfig) { c.UID = "" }, "needs name, namespace and uid", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := vmPod("p", nil)
			tt.mutate(&cfg)
			if got := core.ClaimsPod(cfg.Annotations, cfg.RuntimeHandler); got != tt.claimed {
				t.Errorf("ClaimsPod: %v, want %v", got, tt.claimed)
			}
			id, err := e.rt.RunSandbox(context.Background(), cfg)
			if tt.wantErr == "" {
				if err != nil || id == "" {
					t.Fatalf("RunSandbox: %q, %v", id, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ports.ErrInvalidArgument) {
				t.Fatalf("err %v, want invalid argument containing %q", err, tt.wantErr)
			}
			if len(e.store.Keys(ports.BucketSandboxes)) != 0 || len(e.net.Active) != 0 {
				t.Fatal("a refused pod left state behind")
			}
		})
	}
}

func TestRunSandboxIdempotent(t *testing.T) {
	e := newEnv(t)
	cfg := vmPod("p", nil)
	id1, err := e.rt.RunSandbox(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := e.rt.RunSandbox(context.Background(), cfg)
	if err != nil || id2 != id1 {
		t.Fatalf("retry gave %q, %v; want %q", id2, err, id1)
	}
	if len(e.net.Active) != 1 {
		t.Fatalf("network set up %d times", len(e.net.Active))
	}
	cfg.Attempt = 1
	id3, err := e.rt.RunSandbox(context.Background(), cfg)
	if err != nil || id3 == id1 {
		t.Fatalf("new attempt gave %q, %v", id3, err)
	}
	sb, err := e.rt.SandboxStatus(context.Background(), id1[:8])
	if err != nil || sb.ID != id1 || sb.State != core.SandboxReady || len(sb.IPs()) != 1 {
		t.Fatalf("status by prefix: %+v, %v", sb, err)
	}
}

func TestRunSandboxNetworkFailureLeavesNothing(t *testing.T) {
	e := newEnv(t)
	e.net.SetupErr = errors.New("cni: no IP addresses available")
	_, err := e.rt.RunSandbox(context.Background(), vmPod("p", nil))
	if err == nil || !strings.Contains(err.Error(), "no IP addresses available") {
		t.Fatalf("err %v", err)
	}
	if keys := e.store.Keys(ports.BucketSandboxes); len(keys) != 0 {
		t.Fatalf("records left: %v", keys)
	}
	if len(e.net.Teardowns) != 1 {
		t.Fatal("half-made network not torn down")
	}
}

// A slow operation (here a pull) goes on after the caller's deadline; the
// retry returns its result instead of doing the work twice.
func TestSlowOperationsSurviveCallerTimeout(t *testing.T) {
	e := newEnv(t)
	e.images.Delay = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := e.rt.PullImage(ctx, testImage, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first pull: %v", err)
	}
	id, err := e.rt.PullImage(context.Background(), testImage, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.images.Fetches["https://example.com/tiny.qcow2"]; n != 1 {
		t.Fatalf("image fetched %d times", n)
	}
	imgs, _ := e.rt.ListImages(context.Background(), "")
	if len(imgs) != 1 || imgs[0].ID != id {
		t.Fatalf("images %+v", imgs)
	}
}

func TestVMLifecycle(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "cirros-vm", map[string]string{annotations.VCPUCount: "2", annotations.DiskDriver: "virtio", annotations.RootVolumeSize: "1Gi"})
	id := e.createVM(t, sb)
	ctx := context.Background()

	c, err := e.rt.ContainerStatus(ctx, id)
	if err != nil || c.State != core.ContainerCreated {
		t.Fatalf("status %+v %v", c, err)
	}
	spec, ok := e.hv.Spec(id)
	if !ok {
		t.Fatal("VM not defined")
	}
	if spec.VCPUs != 2 || spec.MemoryBytes != 256<<20 || spec.Disks[0].Bus != ports.BusVirtio ||
		spec.Disks[0].Overlay == nil || spec.Disks[0].Overlay.SizeBytes != 1<<30 || spec.PodName != "cirros-vm" ||
		!strings.HasPrefix(spec.Name, "virtlet-"+id[:12]) || spec.UUID != "" {
		t.Fatalf("spec %+v", spec)
	}
	// Without VirtletSystemUUID the hypervisor picks the UUID; the core
	// records it.
	if st, _ := e.hv.Status(ctx, id); c.Spec.UUID == "" || c.Spec.UUID != st.UUID {
		t.Fatalf("the container's UUID %q, the hypervisor's %q", c.Spec.UUID, st.UUID)
	}
	att := e.net.Active[sb]
	if len(spec.NICs) != 1 || spec.NICs[0] != (ports.NIC{Name: "eth0", MAC: att.Interfaces[0].MAC, MTU: 1500, Bridge: att.Interfaces[0].Bridge}) {
		t.Fatalf("NICs %+v, want the pod interface %+v", spec.NICs, att.Interfaces)
	}
	if want := filepath.Join(e.logDir, "cirros-vm", "vm/0.log"); spec.ConsoleLogPath != want {
		t.Fatalf("console log %q, want %q", spec.ConsoleLogPath, want)
	}

	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Fatalf("second start: %v", err)
	}
	log, _ := os.ReadFile(spec.ConsoleLogPath)
	if !strings.Contains(string(log), " stdout F "+fakehypervisor.BootMarker) {
		t.Fatalf("console log %q", log)
	}
	if got := e.rt.ListContainers(core.ContainerFilter{State: core.ContainerRunning}); len(got) != 1 || got[0].ID != id {
		t.Fatalf("running list %+v", got)
	}
	if err := e.rt.StopContainer(ctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	c, _ = e.rt.ContainerStatus(ctx, id)
	if c.State != core.ContainerExited || c.ExitCode != 0 || c.Reason != core.ReasonCompleted || c.FinishedAt.IsZero() || c.StartedAt.IsZero() {
		t.Fatalf("after stop %+v", c)
	}
	if err := e.rt.StopContainer(ctx, id, time.Second); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if err := e.rt.StartContainer(ctx, id); !errors.Is(err, ports.ErrFailedPrecondition) {
		t.Fatalf("start of exited VM: %v", err)
	}
	if err := e.rt.RemoveContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.hv.Spec(id); ok {
		t.Fatal("VM still defined")
	}
	if err := e.rt.RemoveContainer(ctx, id); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if _, err := e.rt.ContainerStatus(ctx, id); !errors.Is(err, ports.ErrNotFound) {
		t.Fatalf("status of removed: %v", err)
	}
	if err := e.rt.StopSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.StopSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if len(e.net.Active) != 0 {
		t.Fatal("network not torn down")
	}
	if err := e.rt.RemoveSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.RemoveSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.StopSandbox(ctx, "no-such-sandbox"); err != nil {
		t.Fatal(err)
	}
	if keys := append(e.store.Keys(ports.BucketSandboxes), e.store.Keys(ports.BucketContainers)...); len(keys) != 0 {
		t.Fatalf("records left: %v", keys)
	}
}

func TestReopenContainerLog(t *testing.T) {
	e := newEnv(t)
	id := e.createVM(t, e.runPod(t, "p", nil))
	ctx := context.Background()
	if err := e.rt.ReopenContainerLog(ctx, id); !errors.Is(err, ports.ErrFailedPrecondition) {
		t.Fatalf("reopen before start: %v", err)
	}
	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.ReopenContainerLog(ctx, id[:8]); err != nil {
		t.Fatal(err)
	}
	if e.hv.Reopened(id) != 1 {
		t.Fatal("the hypervisor was not asked to reopen the log")
	}
	if err := e.rt.ReopenContainerLog(ctx, "nope"); !errors.Is(err, ports.ErrNotFound) {
		t.Fatalf("unknown container: %v", err)
	}
}

func TestStopForcesGuestThatIgnoresShutdown(t *testing.T) {
	e := newEnv(t)
	e.hv.GuestIgnoresShutdown = true
	id := e.createVM(t, e.runPod(t, "p", nil))
	ctx := context.Background()
	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := e.rt.StopContainer(ctx, id, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	c, _ := e.rt.ContainerStatus(ctx, id)
	if c.ExitCode != 137 || c.Reason != core.ReasonKilled || time.Since(begin) < 200*time.Millisecond {
		t.Fatalf("after forced stop %+v", c)
	}
}

func TestGuestExitsFollowEvents(t *testing.T) {
	for _, tt := range []struct {
		name   string
		act    func(*fakehypervisor.Hypervisor, string) error
		code   int32
		reason string
	}{
		{"poweroff", (*fakehypervisor.Hypervisor).PowerOff, 0, "Completed"},
		{"crash", (*fakehypervisor.Hypervisor).Crash, 1, "Crashed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			id := e.createVM(t, e.runPod(t, "p", nil))
			if err := e.rt.StartContainer(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			if err := tt.act(e.hv, id); err != nil {
				t.Fatal(err)
			}
			eventually(t, "exit recorded", func() bool {
				c, _ := e.rt.ContainerStatus(context.Background(), id)
				return c.State == core.ContainerExited && c.ExitCode == tt.code && c.Reason == tt.reason
			})
		})
	}
}

func TestCreateContainerRefusals(t *testing.T) {
	tests := []struct {
		name    string
		ann     map[string]string
		mutate  func(*core.ContainerConfig)
		kind    error
		wantErr []string
	}{
		{"bad vcpus", map[string]string{annotations.VCPUCount: "lots"}, nil, ports.ErrInvalidArgument,
			[]string{"annotation VirtletVCPUCount", `"lots"`, "1 to 255"}},
		{"bad disk driver", map[string]string{annotations.DiskDriver: "ide"}, nil, ports.ErrInvalidArgument,
			[]string{"annotation VirtletDiskDriver", `"ide"`}},
		{"bad root volume", map[string]string{annotations.RootVolumeSize: "big"}, nil, ports.ErrInvalidArgument,
			[]string{"annotation VirtletRootVolumeSize", `"big"`}},
		{"root volume smaller than the image", map[string]string{annotations.RootVolumeSize: "1Mi"}, nil, ports.ErrInvalidArgument,
			[]string{"annotation VirtletRootVolumeSize", `"1Mi"`, "smaller than the image's virtual size (33554432 bytes)"}},
		{"memory dumps not enabled by the operator", map[string]string{annotations.Watchdog: "i6300esb", annotations.WatchdogAction: "dump"}, nil, ports.ErrInvalidArgument,
			[]string{"annotation VirtletWatchdogAction", `"dump"`, "has not enabled memory dumps (the daemon's allowWatchdogDump)"}},
		{"bad user-data", map[string]string{annotations.CloudInitUserData: "users: [\n"}, nil, ports.ErrInvalidArgument,
			[]string{"annotation VirtletCloudInitUserData", "cannot parse"}},
		{"bad ssh key source", map[string]string{annotations.SSHKeySource: "mysecret"}, nil, ports.ErrInvalidArgument,
			[]string{"annotation VirtletSSHKeySource", "kind/name[/key]"}},
		{"container image", nil, func(c *core.ContainerConfig) { c.UserImage = "nginx:1.27" }, ports.ErrInvalidArgument,
			[]string{`image: invalid value "nginx:1.27"`, "not a VM image", "virtlet.cloud/"}},
		{"image not pulled", nil, func(c *core.ContainerConfig) { c.Image = "virtlet.cloud/example.com/other.img"; c.UserImage = "" }, ports.ErrNotFound,
			[]string{"virtlet.cloud/example.com/other.img is not in the image store"}},
		{"too little memory", nil, func(c *core.ContainerConfig) { c.MemoryLimitBytes = 16 << 20 }, ports.ErrInvalidArgument,
			[]string{"resources.limits.memory", "at least 32Mi"}},
		{"hugepages below the VM's memory", nil, func(c *core.ContainerConfig) {
			c.MemoryLimitBytes, c.HugepageLimits = 128<<20, []core.HugepageLimit{{PageSize: "2MB", Bytes: 64 << 20}}
		}, ports.ErrInvalidArgument, []string{"resources.limits.hugepages-2Mi", "67108864 bytes", "less than the VM's memory (134217728 bytes", "at least 134217728 bytes"}},
		{"hugepages of two sizes", nil, func(c *core.ContainerConfig) {
			c.MemoryLimitBytes = 1 << 30
			c.HugepageLimits = []core.HugepageLimit{{PageSize: "2MB", Bytes: 1 << 30}, {PageSize: "1GB", Bytes: 1 << 30}}
		}, ports.ErrInvalidArgument, []string{"hugepages-2Mi and hugepages-1Gi", "pages of one size"}},
		{"memory not a whole number of hugepages", nil, func(c *core.ContainerConfig) {
			c.MemoryLimitBytes, c.HugepageLimits = 1536<<20, []core.HugepageLimit{{PageSize: "1GB", Bytes: 2 << 30}}
		}, ports.ErrInvalidArgument, []string{"resources.limits.memory", "not a whole number of the 1GB hugepages", "a multiple of 1073741824 bytes"}},
		{"hugepages of an unknown size", nil, func(c *core.ContainerConfig) {
			c.MemoryLimitBytes, c.HugepageLimits = 128<<20, []core.HugepageLimit{{PageSize: "3MB", Bytes: 128 << 20}}
		}, ports.ErrInvalidArgument, []string{"resources.limits.hugepages-3Mi", `"3MB"`, "not a power of two"}},
		{"max memory below the memory", map[string]string{"VirtletMaxMemory": "64Mi"}, func(c *core.ContainerConfig) { c.MemoryLimitBytes = 128 << 20 },
			ports.ErrInvalidArgument, []string{"annotation VirtletMaxMemory", `"64Mi"`, "below the VM's memory (134217728 bytes"}},
		{"max memory with hugepages", map[string]string{"VirtletMaxMemory": "256Mi"}, func(c *core.ContainerConfig) {
			c.MemoryLimitBytes, c.HugepageLimits = 128<<20, []core.HugepageLimit{{PageSize: "2MB", Bytes: 128 << 20}}
		}, ports.ErrInvalidArgument, []string{"annotation VirtletMaxMemory", "backed by hugepages cannot be resized"}},
		{"max memory not a quantity", map[string]string{"VirtletMaxMemory": "lots"}, nil, ports.ErrInvalidArgument,
			[]string{"annotation VirtletMaxMemory", `"lots"`, "4Gi"}},
		{"cpuset not a CPU list", nil, func(c *core.ContainerConfig) { c.CPUSet = "1-a" }, ports.ErrInvalidArgument,
			[]string{"resources cpuset_cpus", `"1-a"`, "a CPU list such as 1,3-5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			sb := e.runPod(t, "p", tt.ann)
			cfg := vmContainer(e.pull(t))
			if tt.mutate != nil {
				tt.mutate(&cfg)
			}
			_, err := e.rt.CreateContainer(context.Background(), sb, cfg)
			if err == nil || !errors.Is(err, tt.kind) {
				t.Fatalf("err %v, want %v", err, tt.kind)
			}
			lacks(t, "message", err.Error(), tt.wantErr...)
			if keys := e.store.Keys(ports.BucketContainers); len(keys) != 0 {
				t.Fatalf("container records left: %v", keys)
			}
			if vms, _ := e.hv.List(context.Background()); len(vms) != 0 {
				t.Fatalf("VMs left: %v", vms)
			}
		})
	}
}

func TestOneContainerPerVMPod(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	id := e.createVM(t, sb)
	ctx := context.Background()
	cfg := vmContainer(e.pull(t))
	again, err := e.rt.CreateContainer(ctx, sb, cfg)
	if err != nil || again != id {
		t.Fatalf("retry of the same create: %q, %v; want %q", again, err, id)
	}
	second := cfg
	second.Name = "sidecar"
	if _, err := e.rt.CreateContainer(ctx, sb, second); err == nil || !strings.Contains(err.Error(), `exactly one container, and it already has "vm"; refusing container "sidecar"`) {
		t.Fatalf("second container: %v", err)
	}
	next := cfg
	next.Attempt = 1
	if _, err := e.rt.CreateContainer(ctx, sb, next); !errors.Is(err, ports.ErrFailedPrecondition) {
		t.Fatalf("new attempt while the VM exists: %v", err)
	}
	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.StopContainer(ctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	restarted, err := e.rt.CreateContainer(ctx, sb, next)
	if err != nil || restarted == id {
		t.Fatalf("restart after exit: %q, %v", restarted, err)
	}
}

func TestSystemUUIDMustBeUnique(t *testing.T) {
	e := newEnv(t)
	ann := map[string]string{annotations.SystemUUID: "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d"}
	id := e.createVM(t, e.runPod(t, "a", ann))
	if spec, _ := e.hv.Spec(id); spec.UUID != "4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d" {
		t.Fatalf("uuid %q", spec.UUID)
	}
	sb := e.runPod(t, "b", ann)
	_, err := e.rt.CreateContainer(context.Background(), sb, vmContainer(e.pull(t)))
	if err == nil || !strings.Contains(err.Error(), "used by the VM of pod default/a") {
		t.Fatalf("err %v", err)
	}
}

func TestDefineFailureCleansUp(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	e.hv.Fail["Define"] = errors.New("no space left on device")
	_, err := e.rt.CreateContainer(context.Background(), sb, vmContainer(e.pull(t)))
	if err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("err %v", err)
	}
	if keys := e.store.Keys(ports.BucketContainers); len(keys) != 0 {
		t.Fatalf("records left: %v", keys)
	}
}

func TestRemoveSandboxRemovesVM(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	id := e.createVM(t, sb)
	ctx := context.Background()
	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.StopSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if c, _ := e.rt.ContainerStatus(ctx, id); c.State != core.ContainerExited {
		t.Fatalf("StopSandbox left the VM %s", c.State)
	}
	if err := e.rt.RemoveSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if vms, _ := e.hv.List(ctx); len(vms) != 0 {
		t.Fatalf("VMs left: %+v", vms)
	}
	if len(e.store.Keys(ports.BucketContainers)) != 0 {
		t.Fatal("container records left")
	}
}

func TestImages(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	id, err := e.rt.PullImage(ctx, "virtlet.cloud/example.com/tiny.qcow2", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.images.DigestFor("https://example.com/tiny.qcow2"); id != want {
		t.Fatalf("id %s, want the content digest %s", id, want)
	}
	// kubelet adds :latest; tags are ignored for URL images.
	for _, spec := range []string{testImage, testImage + ":latest", id, id[7:19], "sha256:" + id[7:19]} {
		img, err := e.rt.ImageStatus(ctx, spec)
		if err != nil || img.ID != id {
			t.Errorf("ImageStatus(%q) = %+v, %v", spec, img, err)
		}
	}
	img, _ := e.rt.ImageStatus(ctx, id)
	if fmt.Sprint(img.RepoTags()) != "[virtlet.cloud/example.com/tiny.qcow2:latest]" ||
		fmt.Sprint(img.RepoDigests()) != "[virtlet.cloud/example.com/tiny.qcow2@"+id+"]" || img.Size == 0 {
		t.Fatalf("image %+v tags %v digests %v", img, img.RepoTags(), img.RepoDigests())
	}
	if _, err := e.rt.ImageStatus(ctx, "virtlet.cloud/example.com/absent"); !errors.Is(err, ports.ErrNotFound) {
		t.Fatalf("absent: %v", err)
	}
	u, err := e.rt.ImageFsInfo(ctx)
	if err != nil || u.UsedBytes != uint64(img.Size) {
		t.Fatalf("fs info %+v %v", u, err)
	}

	// A re-pull that finds new content moves the name and drops the old image.
	e.images.Content["https://example.com/tiny.qcow2"] = []byte("new content")
	id2, err := e.rt.PullImage(ctx, testImage+":v2", nil)
	if err != nil || id2 == id {
		t.Fatalf("re-pull %s %v", id2, err)
	}
	imgs, _ := e.rt.ListImages(ctx, "")
	if len(imgs) != 1 || imgs[0].ID != id2 {
		t.Fatalf("images %+v", imgs)
	}
	if digests, _ := e.files.List(ctx); len(digests) != 1 {
		t.Fatalf("data files %v", digests)
	}

	// In use: refused.
	sb := e.runPod(t, "p", nil)
	cid, err := e.rt.CreateContainer(ctx, sb, vmContainer(id2))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rt.RemoveImage(ctx, testImage); err == nil || !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "in use by the VM of pod default/p") {
		t.Fatalf("remove in use: %v", err)
	}
	if err := e.rt.RemoveContainer(ctx, cid); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.RemoveImage(ctx, testImage); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.RemoveImage(ctx, testImage); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if digests, _ := e.files.List(ctx); len(digests) != 0 {
		t.Fatalf("data left %v", digests)
	}
}

func TestPullErrors(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.images.Fail["https://example.com/missing.img"] = fmt.Errorf("GET https://example.com/missing.img: 404 Not Found: %w", ports.ErrNotFound)
	for _, tt := range []struct {
		name, image string
		kind        error
		want        string
	}{
		{"container image", "nginx", ports.ErrInvalidArgument, "not a VM image"},
		{"bad reference", "virtlet.cloud/Example/UPPER", ports.ErrInvalidArgument, "invalid value"},
		{"dotdot", "virtlet.cloud/example.com/../etc/passwd", ports.ErrInvalidArgument, "invalid value"},
		{"404", "virtlet.cloud/example.com/missing.img", ports.ErrNotFound, "404 Not Found"},
		{"digest mismatch", "virtlet.cloud/example.com/x.img@sha256:" + strings.Repeat("0", 64), ports.ErrInvalidArgument, "digest mismatch"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.rt.PullImage(ctx, tt.image, nil)
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want %v containing %q", err, tt.kind, tt.want)
			}
		})
	}
	if imgs, _ := e.rt.ListImages(ctx, ""); len(imgs) != 0 {
		t.Fatalf("images left %+v", imgs)
	}
	if digests, _ := e.files.List(ctx); len(digests) != 0 {
		t.Fatalf("files left %v", digests)
	}
	noSources, _ := core.New(core.Deps{Hypervisor: e.hv, ImageFiles: e.files, Store: e.store}, core.Options{Log: quietLog()})
	if _, err := noSources.PullImage(ctx, testImage, nil); !errors.Is(err, ports.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no image plugin handles https://") {
		t.Fatalf("no source: %v", err)
	}
}

func TestConcurrentPullsFetchOnce(t *testing.T) {
	e := newEnv(t)
	e.images.Delay = 100 * time.Millisecond
	var wg sync.WaitGroup
	ids := make([]string, 5)
	for i := range ids {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ids[i], _ = e.rt.PullImage(context.Background(), testImage, nil)
		}(i)
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("ids %v", ids)
		}
	}
	if n := e.images.Fetches["https://example.com/tiny.qcow2"]; n != 1 {
		t.Fatalf("fetched %d times", n)
	}
}

func TestStatePersistsAcrossRestart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "p", nil)
	id := e.createVM(t, sb)
	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	e.start(t) // a daemon restart: same store, same hypervisor
	pods := e.rt.ListSandboxes(core.SandboxFilter{})
	ctrs := e.rt.ListContainers(core.ContainerFilter{})
	if len(pods) != 1 || pods[0].ID != sb || pods[0].State != core.SandboxReady ||
		len(ctrs) != 1 || ctrs[0].ID != id || ctrs[0].State != core.ContainerRunning {
		t.Fatalf("after restart: pods %+v containers %+v", pods, ctrs)
	}
	imgs, _ := e.rt.ListImages(ctx, "")
	if len(imgs) != 1 {
		t.Fatalf("images %+v", imgs)
	}
}

func TestReconcileAfterCrash(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "p", nil)
	running := e.createVM(t, sb)
	if err := e.rt.StartContainer(ctx, running); err != nil {
		t.Fatal(err)
	}
	// While the daemon is down: the VM powers off; a creation was cut short
	// (record "creating", VM defined); a sandbox creation was cut short; and
	// a VM of ours lost its record.
	if err := e.hv.PowerOff(running); err != nil {
		t.Fatal(err)
	}
	e.cancel()
	halfVM := ports.VMSpec{ID: strings.Repeat("a", 64), Name: "virtlet-aaaaaaaaaaaa-p", VCPUs: 1, MemoryBytes: 1 << 20}
	if err := e.hv.Define(ctx, halfVM); err != nil {
		t.Fatal(err)
	}
	rec := fmt.Sprintf(`{"id":%q,"sandboxID":%q,"name":"vm","state":"creating","spec":{"ID":%q}}`, halfVM.ID, sb, halfVM.ID)
	pending := `{"id":"pending-sandbox","name":"q","namespace":"default","uid":"u","state":"pending"}`
	orphan := ports.VMSpec{ID: strings.Repeat("b", 64), Name: "virtlet-bbbbbbbbbbbb-x", VCPUs: 1, MemoryBytes: 1 << 20}
	if err := e.hv.Define(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	e.store.Apply(ctx, ports.Put(ports.BucketContainers, halfVM.ID, []byte(rec)),
		ports.Put(ports.BucketSandboxes, "pending-sandbox", []byte(pending)))

	e.start(t)
	c, err := e.rt.ContainerStatus(ctx, running)
	if err != nil || c.State != core.ContainerExited || c.ExitCode != 0 || c.Reason != "Completed" {
		t.Fatalf("powered-off VM: %+v %v", c, err)
	}
	if vms, _ := e.hv.List(ctx); len(vms) != 1 || vms[0].ID != running {
		t.Fatalf("VMs after reconcile: %+v", vms)
	}
	if keys := e.store.Keys(ports.BucketContainers); len(keys) != 1 || keys[0] != running {
		t.Fatalf("container records: %v", keys)
	}
	if keys := e.store.Keys(ports.BucketSandboxes); len(keys) != 1 || keys[0] != sb {
		t.Fatalf("sandbox records: %v", keys)
	}
	if e.net.Teardowns["pending-sandbox"] != 1 {
		t.Fatal("interrupted sandbox's network not torn down")
	}
}

func TestVanishedVMIsLost(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	id := e.createVM(t, e.runPod(t, "p", nil))
	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	e.cancel()
	e.hv.Vanish(id)
	e.start(t)
	c, _ := e.rt.ContainerStatus(ctx, id)
	if c.State != core.ContainerExited || c.ExitCode != 255 || c.Reason != core.ReasonLost {
		t.Fatalf("vanished VM: %+v", c)
	}
}

// slowList is a hypervisor whose first List answers with what it had
// when asked, once released: a reconciliation's list that a creation
// overtakes. Later lists answer at once.
type slowList struct {
	*fakehypervisor.Hypervisor
	listed, release chan struct{}
	first           atomic.Bool
}

func (h *slowList) List(ctx context.Context) ([]ports.VMStatus, error) {
	vms, err := h.Hypervisor.List(ctx)
	if h.first.CompareAndSwap(false, true) {
		h.listed <- struct{}{} // blocks until the test has seen it
		<-h.release
	}
	return vms, err
}

// The daemon serves CRI while it reconciles: a VM created after the
// reconciliation listed the VMs is not taken for one that vanished.
func TestCreationDuringResyncIsNotLost(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "p", nil)
	img := e.pull(t)
	e.cancel()
	hv := &slowList{Hypervisor: e.hv, listed: make(chan struct{}), release: make(chan struct{})}
	rt, err := core.New(core.Deps{
		Hypervisor: hv, ImageSources: map[string]ports.ImageSource{"https": e.images},
		ImageFiles: e.files, Store: e.store, Network: e.net,
		Datasources: map[string]ports.Datasource{"nocloud": e.nc, "configdrive": e.cd},
		Kube:        e.kube, Files: e.vfiles, VolumeDirs: e.vdirs, Observer: e.obs,
		Volumes: map[string]ports.Volumes{ports.VolumeShare: e.vols, ports.VolumeBlock: e.vols, "qcow2": e.vols},
	}, core.Options{Log: quietLog(), OperationTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Load(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go rt.Run(runCtx)
	<-hv.listed // the reconciliation has its list, without the VM to come
	id, err := rt.CreateContainer(ctx, sb, vmContainer(img))
	if err != nil {
		t.Fatal(err)
	}
	close(hv.release)
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := rt.WaitSynced(wctx); err != nil {
		t.Fatal(err)
	}
	if c, _ := rt.ContainerStatus(ctx, id); c.State != core.ContainerCreated {
		t.Fatalf("a VM created during the reconciliation: %+v", c)
	}
}

func TestStatus(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	st := e.rt.Status(ctx)
	if !st.Runtime.Ready || !st.Network.Ready || st.Hypervisor.Name != "fake" {
		t.Fatalf("status %+v", st)
	}
	e.hv.Fail["Capabilities"] = fmt.Errorf("plugin fake (hypervisor) is unavailable: restarting: %w", ports.ErrUnavailable)
	e.net.NotReady = "no CNI config in /etc/cni/net.d"
	st = e.rt.Status(ctx)
	if st.Runtime.Ready || st.Runtime.Reason != "HypervisorUnavailable" || !strings.Contains(st.Runtime.Message, "restarting") ||
		st.Network.Ready || !strings.Contains(st.Network.Message, "no CNI config") {
		t.Fatalf("status %+v", st)
	}
	noNet, _ := core.New(core.Deps{Hypervisor: e.hv, ImageFiles: e.files, Store: e.store}, core.Options{Log: quietLog()})
	if st := noNet.Status(ctx); st.Network.Ready || st.Network.Reason != "NoNetworkPlugin" {
		t.Fatalf("no network: %+v", st.Network)
	}
}

func TestListFilters(t *testing.T) {
	e := newEnv(t)
	a := e.runPod(t, "a", nil)
	b := e.runPod(t, "b", nil)
	ca := e.createVM(t, a)
	e.createVM(t, b)
	if got := e.rt.ListSandboxes(core.SandboxFilter{LabelSelector: map[string]string{"app": "a"}}); len(got) != 1 || got[0].ID != a {
		t.Fatalf("by label %+v", got)
	}
	if got := e.rt.ListSandboxes(core.SandboxFilter{ID: b[:6]}); len(got) != 1 || got[0].ID != b {
		t.Fatalf("by id prefix %+v", got)
	}
	if got := e.rt.ListContainers(core.ContainerFilter{SandboxID: a}); len(got) != 1 || got[0].ID != ca {
		t.Fatalf("by sandbox %+v", got)
	}
	if got := e.rt.ListContainers(core.ContainerFilter{State: core.ContainerRunning}); len(got) != 0 {
		t.Fatalf("running %+v", got)
	}
	if got := e.rt.ListSandboxes(core.SandboxFilter{State: core.SandboxNotReady}); len(got) != 0 {
		t.Fatalf("notready %+v", got)
	}
}

// A re-pulled name never changes a VM's base: the old content stays while
// the VM exists, and goes with it.
func TestRepullKeepsARunningVMsBase(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "p", nil)
	old := e.pull(t)
	id, err := e.rt.CreateContainer(ctx, sb, vmContainer(old))
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := e.hv.Spec(id)
	base := spec.Disks[0].Overlay.BasePath
	e.images.Content["https://example.com/tiny.qcow2"] = []byte("new content")
	fresh := e.pull(t)
	if fresh == old {
		t.Fatal("the re-pull returned the old image")
	}
	if data, err := os.ReadFile(base); err != nil || strings.Contains(string(data), "new content") {
		t.Fatalf("the VM's base changed: %q %v", data, err)
	}
	if img, err := e.rt.ImageStatus(ctx, testImage); err != nil || img.ID != fresh {
		t.Fatalf("the name should now be the new image: %+v %v", img, err)
	}
	if imgs, _ := e.rt.ListImages(ctx, ""); len(imgs) != 2 {
		t.Fatalf("the old image must stay while its VM exists: %+v", imgs)
	}
	if err := e.rt.RemoveContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	if imgs, _ := e.rt.ListImages(ctx, ""); len(imgs) != 1 || imgs[0].ID != fresh {
		t.Fatalf("the nameless old image should go with its last VM: %+v", imgs)
	}
	if _, err := os.Stat(base); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the old data file stays: %v", err)
	}
}

// lacks reports each of wants that text (named what) does not contain.
func lacks(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}

// The node's limits reach the image plugin with each pull and hold a
// plugin that ignores them: a larger image or a larger virtual disk is
// refused and nothing stored; a root volume larger than maxVirtualSize is
// refused at CreateContainer.
func TestNodeLimits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	image := "virtlet.cloud/example.com/disk.img"
	for _, tt := range []struct {
		name   string
		limits core.Options
		want   string
	}{
		{"image size", core.Options{MaxImageBytes: 3}, "more than the 3 the node allows an image (maxImageSize)"},
		{"virtual size", core.Options{MaxVirtualBytes: fakes.FakeVirtualSize - 1}, fmt.Sprintf("its disk's virtual size is %d bytes, more than the %d the node allows (maxVirtualSize)", fakes.FakeVirtualSize, fakes.FakeVirtualSize-1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e.limits = tt.limits
			e.limits.KeepFreeBytes = 1 << 30
			e.start(t)
			_, err := e.rt.PullImage(ctx, image, nil)
			if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("pull: %v, want %q", err, tt.want)
			}
			req := e.images.Requests[len(e.images.Requests)-1]
			if req.MaxBytes != tt.limits.MaxImageBytes || req.KeepFreeBytes != 1<<30 {
				t.Errorf("the plugin was asked for %+v", req)
			}
			if imgs, _ := e.rt.ListImages(ctx, ""); len(imgs) != 0 {
				t.Errorf("images after the refusal: %+v", imgs)
			}
			if entries, _ := os.ReadDir(e.files.Dir); len(entries) != 0 {
				t.Errorf("image files after the refusal: %v", entries)
			}
		})
	}
	e.limits = core.Options{MaxVirtualBytes: 64 << 20}
	e.start(t)
	sb := e.runPod(t, "big", map[string]string{annotations.RootVolumeSize: "1Gi"})
	_, err := e.rt.CreateContainer(ctx, sb, vmContainer(e.pull(t)))
	if !errors.Is(err, ports.ErrInvalidArgument) {
		t.Fatalf("a root volume above maxVirtualSize: %v", err)
	}
	lacks(t, "message", err.Error(), "annotation VirtletRootVolumeSize", `"1Gi"`, "more than the 67108864 bytes the node allows a disk (maxVirtualSize)")

	// The space kept free bounds the root disk's overlay too: the
	// hypervisor is told.
	e.limits = core.Options{KeepFreeBytes: 5 << 30}
	e.start(t)
	id := e.createVM(t, e.runPod(t, "kept", nil))
	if spec, _ := e.hv.Spec(id); spec.Disks[0].Overlay == nil || spec.Disks[0].Overlay.KeepFreeBytes != 5<<30 {
		t.Errorf("the root disk's overlay: %+v, want KeepFreeBytes %d", spec.Disks[0].Overlay, 5<<30)
	}
}

// A URL image's digest names it in its own repository only.
func TestURLImageDigestNamesItsRepositoryOnly(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	id, err := e.rt.PullImage(ctx, "virtlet.cloud/example.com/disk.img", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.ImageStatus(ctx, "virtlet.cloud/example.com/disk.img@"+id); err != nil {
		t.Errorf("its own repository, pinned: %v", err)
	}
	if _, err := e.rt.ImageStatus(ctx, "virtlet.cloud/other.example/x.img@"+id); !errors.Is(err, ports.ErrNotFound) {
		t.Errorf("another repository with its digest: %v, want not found", err)
	}
}
