package core_test

import (
	"context"
	"errors"
	"testing"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/core/presets"
	"github.com/virtlet/virtlet/ports"
)

// In-place resize: the memory moves within the VM's range and the record
// keeps it; what the VM cannot do is refused naming the field.
func TestUpdateContainerResources(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", map[string]string{"VirtletMaxMemory": "256Mi"})
	cfg := vmContainer(e.pull(t))
	cfg.MemoryLimitBytes, cfg.CPUSet = 128<<20, "1"
	ctx := context.Background()
	id, err := e.rt.CreateContainer(ctx, sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	// kubelet sends every resource: unchanged ones pass.
	if err := e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{MemoryLimitBytes: 128 << 20, CPUSet: "1"}); err != nil {
		t.Fatalf("nothing changed: %v", err)
	}
	if err := e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{MemoryLimitBytes: 192 << 20, CPUSet: "1"}); err != nil {
		t.Fatalf("grow to 192Mi: %v", err)
	}
	c, _ := e.rt.ContainerStatus(ctx, id)
	hvSpec, _ := e.hv.Spec(id)
	if c.Spec.MemoryBytes != 192<<20 || hvSpec.MemoryBytes != 192<<20 {
		t.Errorf("after the resize: record %d, hypervisor %d", c.Spec.MemoryBytes, hvSpec.MemoryBytes)
	}
	for _, tt := range []struct {
		name string
		res  core.ContainerResources
		want []string
	}{
		{"above the maximum", core.ContainerResources{MemoryLimitBytes: 512 << 20}, []string{"resources.limits.memory", "536870912 bytes", "33554432 to 268435456 bytes", "VirtletMaxMemory"}},
		{"too little", core.ContainerResources{MemoryLimitBytes: 16 << 20}, []string{"resources.limits.memory", "16777216 bytes"}},
		{"another CPU set", core.ContainerResources{CPUSet: "0-1"}, []string{"resources cpuset_cpus", `"0-1"`, "fixed while the VM runs"}},
	} {
		err := e.rt.UpdateContainerResources(ctx, id, tt.res)
		if !errors.Is(err, ports.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", tt.name, err)
			continue
		}
		lacks(t, tt.name, err.Error(), tt.want...)
	}
	c, _ = e.rt.ContainerStatus(ctx, id)
	hvSpec, _ = e.hv.Spec(id)
	if c.Spec.MemoryBytes != 192<<20 || hvSpec.MemoryBytes != 192<<20 {
		t.Errorf("a refused resize changed the VM: record %d, hypervisor %d", c.Spec.MemoryBytes, hvSpec.MemoryBytes)
	}
}

// Without VirtletMaxMemory the ceiling is the memory limit the pod was
// created with: a VM shrunk below it can grow back.
func TestResizeBackToTheFirstLimit(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	cfg := vmContainer(e.pull(t))
	cfg.MemoryLimitBytes = 256 << 20
	ctx := context.Background()
	id, err := e.rt.CreateContainer(ctx, sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []int64{128 << 20, 256 << 20} {
		if err := e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{MemoryLimitBytes: m}); err != nil {
			t.Fatalf("resize to %d: %v", m, err)
		}
	}
	err = e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{MemoryLimitBytes: 257 << 20})
	if !errors.Is(err, ports.ErrInvalidArgument) {
		t.Fatalf("above the first limit: %v", err)
	}
	lacks(t, "message", err.Error(), "33554432 to 268435456 bytes")
}

// A VM backed by hugepages has no balloon to resize it with.
func TestHugepageVMIsNotResized(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	cfg := vmContainer(e.pull(t))
	cfg.MemoryLimitBytes, cfg.HugepageLimits = 128<<20, []core.HugepageLimit{{PageSize: "2MB", Bytes: 256 << 20}}
	ctx := context.Background()
	id, err := e.rt.CreateContainer(ctx, sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{MemoryLimitBytes: 64 << 20})
	if !errors.Is(err, ports.ErrInvalidArgument) {
		t.Fatalf("resize of a hugepage VM: %v", err)
	}
	lacks(t, "message", err.Error(), "resources.limits.memory", "backed by hugepages cannot be resized")
	if hvSpec, _ := e.hv.Spec(id); hvSpec.MemoryBytes != 128<<20 {
		t.Errorf("the hypervisor's VM after a refused resize: %d", hvSpec.MemoryBytes)
	}
}

// A preset's memory is held to a VM's minimum like a container's limit.
func TestPresetMemoryMinimum(t *testing.T) {
	e := newEnv(t)
	set, err := presets.Load(map[string][]byte{"tiny.yaml": []byte("name: tiny\nmemory: 1Mi\n")})
	if err != nil {
		t.Fatal(err)
	}
	e.presets = set
	e.start(t)
	sb := e.runPod(t, "p", map[string]string{"VirtletPreset": "tiny"})
	cfg := vmContainer(e.pull(t))
	cfg.MemoryLimitBytes = 0
	_, err = e.rt.CreateContainer(context.Background(), sb, cfg)
	if !errors.Is(err, ports.ErrInvalidArgument) {
		t.Fatalf("a 1Mi preset: %v", err)
	}
	lacks(t, "message", err.Error(), "the presets' memory", "1048576 bytes", "at least 32Mi")
}

// With VirtletMaxVCPUCount the vCPUs follow the CPU limit, rounded up,
// from VirtletVCPUCount to the maximum: at creation and on a resize.
// Without it a CPU limit changes nothing, as before.
func TestVCPUsFollowTheCPULimit(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.runPod(t, "p", map[string]string{"VirtletVCPUCount": "2", "VirtletMaxVCPUCount": "4"})
	cfg := vmContainer(e.pull(t))
	cfg.CPUQuota, cfg.CPUPeriod = 150_000, 100_000 // 1500m: 2 vCPUs, also VirtletVCPUCount's floor
	id, err := e.rt.CreateContainer(ctx, sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := e.hv.Spec(id)
	if spec.VCPUs != 2 || spec.MaxVCPUs != 4 || spec.MinVCPUs != 2 {
		t.Fatalf("created with vCPUs %d, max %d, min %d; want 2, 4, 2", spec.VCPUs, spec.MaxVCPUs, spec.MinVCPUs)
	}
	for _, tt := range []struct {
		name         string
		quota, vcpus int
	}{
		{"grow to 3.5 CPUs", 350_000, 4},
		{"the same limit (a memory resize sends it again)", 350_000, 4},
		{"no limit: unchanged", 0, 4},
		{"shrink to 1 CPU: the floor", 100_000, 2},
		{"3 CPUs", 300_000, 3},
	} {
		res := core.ContainerResources{CPUQuota: int64(tt.quota), CPUPeriod: 100_000, MemoryLimitBytes: 256 << 20}
		if err := e.rt.UpdateContainerResources(ctx, id, res); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		c, _ := e.rt.ContainerStatus(ctx, id)
		hv, _ := e.hv.Spec(id)
		if c.Spec.VCPUs != tt.vcpus || hv.VCPUs != tt.vcpus {
			t.Fatalf("%s: record %d, hypervisor %d vCPUs; want %d", tt.name, c.Spec.VCPUs, hv.VCPUs, tt.vcpus)
		}
	}
	// Refused before anything changes: neither the vCPUs nor the memory.
	for _, res := range []core.ContainerResources{
		{CPUQuota: 450_000, CPUPeriod: 100_000, MemoryLimitBytes: 128 << 20},
		{CPUQuota: 100_000, CPUPeriod: 100_000, MemoryLimitBytes: 1 << 40},
	} {
		if err := e.rt.UpdateContainerResources(ctx, id, res); !errors.Is(err, ports.ErrInvalidArgument) {
			t.Fatalf("resize %+v: %v", res, err)
		}
		if hv, _ := e.hv.Spec(id); hv.VCPUs != 3 || hv.MemoryBytes != 256<<20 {
			t.Fatalf("a refused resize changed the VM: %d vCPUs, %d bytes", hv.VCPUs, hv.MemoryBytes)
		}
	}
	err = e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{CPUQuota: 450_000, CPUPeriod: 100_000})
	lacks(t, "message", err.Error(), "resources.limits.cpu", `"4500m"`, "5 vCPUs", "at most 4 CPUs", "VirtletMaxVCPUCount")

	// A limit above the maximum at creation.
	sb2 := e.runPod(t, "q", map[string]string{"VirtletMaxVCPUCount": "2"})
	cfg.CPUQuota = 300_000
	_, err = e.rt.CreateContainer(ctx, sb2, cfg)
	if !errors.Is(err, ports.ErrInvalidArgument) {
		t.Fatalf("a CPU limit above VirtletMaxVCPUCount: %v", err)
	}
	lacks(t, "message", err.Error(), "resources.limits.cpu", "3 vCPUs", "at most 2 CPUs")

	// Without VirtletMaxVCPUCount the CPU limit is not applied.
	sb3 := e.runPod(t, "r", map[string]string{"VirtletVCPUCount": "2"})
	id3, err := e.rt.CreateContainer(ctx, sb3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rt.UpdateContainerResources(ctx, id3, core.ContainerResources{CPUQuota: 800_000, CPUPeriod: 100_000}); err != nil {
		t.Fatal(err)
	}
	if hv, _ := e.hv.Spec(id3); hv.VCPUs != 2 || hv.MaxVCPUs != 0 {
		t.Fatalf("a VM without VirtletMaxVCPUCount: %d vCPUs (max %d)", hv.VCPUs, hv.MaxVCPUs)
	}
}

// A container's CPU request and limit are its VM's weight and limit (the
// whole VM's quota per period); a resize changes them, and what a resize
// leaves out stays. kubelet's shares for no request (2) keep the default
// weight.
func TestCPULimits(t *testing.T) {
	e := newEnv(t)
	sb := e.runPod(t, "p", nil)
	cfg := vmContainer(e.pull(t))
	cfg.CPUShares, cfg.CPUQuota, cfg.CPUPeriod = 512, 50_000, 100_000
	ctx := context.Background()
	id, err := e.rt.CreateContainer(ctx, sb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, want ports.CPULimits) {
		t.Helper()
		c, _ := e.rt.ContainerStatus(ctx, id)
		hvSpec, _ := e.hv.Spec(id)
		if c.Spec.CPULimits != want || hvSpec.CPULimits != want {
			t.Errorf("%s: record %+v, hypervisor %+v, want %+v", what, c.Spec.CPULimits, hvSpec.CPULimits, want)
		}
	}
	check("created", ports.CPULimits{Shares: 512, Period: 100_000, Quota: 50_000})
	if err := e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{CPUQuota: 25_000, CPUPeriod: 100_000}); err != nil {
		t.Fatal(err)
	}
	check("limit resized", ports.CPULimits{Shares: 512, Period: 100_000, Quota: 25_000})
	if err := e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{CPUShares: 1024, MemoryLimitBytes: cfg.MemoryLimitBytes}); err != nil {
		t.Fatal(err)
	}
	check("request resized", ports.CPULimits{Shares: 1024, Period: 100_000, Quota: 25_000})
	// kubelet's resize to no request and no limit: its least shares, and
	// no quota per its period.
	if err := e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{CPUShares: 2, CPUPeriod: 100_000, MemoryLimitBytes: cfg.MemoryLimitBytes}); err != nil {
		t.Fatal(err)
	}
	check("request and limit removed", ports.CPULimits{})
	if err := e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{CPUQuota: 30_000, CPUPeriod: 100_000}); err != nil {
		t.Fatal(err)
	}
	check("limit again", ports.CPULimits{Period: 100_000, Quota: 30_000})
	if err := e.rt.UpdateContainerResources(ctx, id, core.ContainerResources{CPUQuota: -1}); err != nil {
		t.Fatal(err)
	}
	check("limit -1", ports.CPULimits{})

	sb2 := e.runPod(t, "q", nil)
	cfg.CPUShares, cfg.CPUQuota, cfg.CPUPeriod = 2, 0, 0
	id2, err := e.rt.CreateContainer(ctx, sb2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if hvSpec, _ := e.hv.Spec(id2); hvSpec.CPULimits != (ports.CPULimits{}) {
		t.Errorf("no request, no limit: %+v", hvSpec.CPULimits)
	}
}

// Memory sharing: a pod opts out with VirtletMemorySharing: "false"; a node
// whose operator turned it off keeps every VM out, whatever its pod says.
func TestMemorySharing(t *testing.T) {
	for _, tc := range []struct {
		name       string
		nodeOff    bool
		annotation string
		want       bool // NoMemorySharing
	}{
		{"default", false, "", false},
		{"pod opts out", false, "false", true},
		{"node off", true, "", true},
		{"node off, pod asks", true, "true", true},
	} {
		e := newEnv(t)
		e.limits.NoMemorySharing = tc.nodeOff
		e.start(t)
		ann := map[string]string{}
		if tc.annotation != "" {
			ann["VirtletMemorySharing"] = tc.annotation
		}
		sb := e.runPod(t, "p", ann)
		id, err := e.rt.CreateContainer(context.Background(), sb, vmContainer(e.pull(t)))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if spec, _ := e.hv.Spec(id); spec.NoMemorySharing != tc.want {
			t.Errorf("%s: NoMemorySharing %v, want %v", tc.name, spec.NoMemorySharing, tc.want)
		}
	}
}
