package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/harness"
)

const (
	stormPods       = 50
	stormWorkers    = 200 // calls in flight at once
	stormRounds     = 3   // sandbox attempts of each pod
	stormRacerCalls = 30  // calls of each racing worker
	// stormCallDeadline is what one call may take before the suite calls
	// it a deadlock.
	stormCallDeadline = 30 * time.Second
)

// stormPod is one VM pod of the storm: its current attempt and the IDs
// the calls made so far returned.
type stormPod struct {
	name, logDir string

	mu           sync.Mutex
	attempt      uint32
	sandbox, ctr string
}

// configs are the pod's configs as kubelet sends them for its current
// attempt.
func (p *stormPod) configs() (*runtimeapi.PodSandboxConfig, *runtimeapi.ContainerConfig) {
	p.mu.Lock()
	attempt := p.attempt
	p.mu.Unlock()
	sb := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: p.name, Namespace: "default", Uid: "uid-" + p.name, Attempt: attempt},
		Annotations:  map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud", "VirtletVCPUCount": "1"},
		Labels:       map[string]string{"app": p.name},
		LogDirectory: p.logDir,
	}
	ctr := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: p.name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		LogPath:  fmt.Sprintf("%s/%d.log", p.name, attempt),
		Linux:    &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 160 << 20}},
	}
	return sb, ctr
}

// nextAttempt is kubelet recreating the pod's sandbox.
func (p *stormPod) nextAttempt() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempt++
}

func (p *stormPod) ids() (sandbox, ctr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sandbox, p.ctr
}

func (p *stormPod) set(sandbox, ctr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sandbox != "" {
		p.sandbox = sandbox
	}
	if ctr != "" {
		p.ctr = ctr
	}
}

// storm records every call: its latency and how it ended.
type storm struct {
	rt       runtimeapi.RuntimeServiceClient
	inFlight atomic.Int32
	maxIn    atomic.Int32

	mu        sync.Mutex
	latencies map[string][]time.Duration
	codes     map[string]map[codes.Code]int
	failures  []string
	stuck     bool
}

// call runs one CRI call under the deadline. Success, NotFound and
// FailedPrecondition are the answers a call racing others on the same pod
// may get; anything else fails the suite.
func (s *storm) call(method string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), stormCallDeadline)
	defer cancel()
	raiseTo(&s.maxIn, s.inFlight.Add(1))
	start := time.Now()
	err := f(ctx)
	took := time.Since(start)
	s.inFlight.Add(-1)
	code := status.Code(err)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latencies[method] = append(s.latencies[method], took)
	if s.codes[method] == nil {
		s.codes[method] = map[codes.Code]int{}
	}
	s.codes[method][code]++
	switch code {
	case codes.OK, codes.NotFound, codes.FailedPrecondition:
	case codes.DeadlineExceeded:
		s.stuck = true
		s.failures = append(s.failures, fmt.Sprintf("%s did not return within %s", method, stormCallDeadline))
	default:
		s.failures = append(s.failures, fmt.Sprintf("%s: %v", method, err))
	}
	return err
}

func (s *storm) runSandbox(p *stormPod) {
	cfg, _ := p.configs()
	s.call("RunPodSandbox", func(ctx context.Context) error {
		r, err := s.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		if err == nil {
			p.set(r.PodSandboxId, "")
		}
		return err
	})
}

func (s *storm) createContainer(p *stormPod) {
	sb, _ := p.ids()
	if sb == "" {
		s.listSandboxes(p)
		return
	}
	sbCfg, ctrCfg := p.configs()
	s.call("CreateContainer", func(ctx context.Context) error {
		r, err := s.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb, Config: ctrCfg, SandboxConfig: sbCfg})
		if err == nil {
			p.set("", r.ContainerId)
		}
		return err
	})
}

// containerCall calls f with the pod's container; before there is one, it
// lists containers instead, as kubelet would to find it.
func (s *storm) containerCall(p *stormPod, method string, f func(ctx context.Context, id string) error) {
	if _, c := p.ids(); c != "" {
		s.call(method, func(ctx context.Context) error { return f(ctx, c) })
	} else {
		s.listContainers(p)
	}
}

// sandboxCall calls f with the pod's sandbox; before there is one, it
// lists sandboxes instead.
func (s *storm) sandboxCall(p *stormPod, method string, f func(ctx context.Context, id string) error) {
	if sb, _ := p.ids(); sb != "" {
		s.call(method, func(ctx context.Context) error { return f(ctx, sb) })
	} else {
		s.listSandboxes(p)
	}
}

func (s *storm) startContainer(p *stormPod) {
	s.containerCall(p, "StartContainer", func(ctx context.Context, id string) error {
		_, err := s.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
		return err
	})
}

func (s *storm) stopContainer(p *stormPod) {
	s.containerCall(p, "StopContainer", func(ctx context.Context, id string) error {
		_, err := s.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 1})
		return err
	})
}

func (s *storm) removeContainer(p *stormPod) {
	s.containerCall(p, "RemoveContainer", func(ctx context.Context, id string) error {
		_, err := s.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
		return err
	})
}

func (s *storm) stopSandbox(p *stormPod) {
	s.sandboxCall(p, "StopPodSandbox", func(ctx context.Context, id string) error {
		_, err := s.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
		return err
	})
}

func (s *storm) removeSandbox(p *stormPod) {
	s.sandboxCall(p, "RemovePodSandbox", func(ctx context.Context, id string) error {
		_, err := s.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
		return err
	})
}

func (s *storm) sandboxStatus(p *stormPod) {
	s.sandboxCall(p, "PodSandboxStatus", func(ctx context.Context, id string) error {
		r, err := s.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
		if err == nil && r.Status.Id != id {
			s.fail("PodSandboxStatus of %s returned sandbox %s", id, r.Status.Id)
		}
		return err
	})
}

func (s *storm) containerStatus(p *stormPod) {
	s.containerCall(p, "ContainerStatus", func(ctx context.Context, id string) error {
		r, err := s.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err == nil && r.Status.Id != id {
			s.fail("ContainerStatus of %s returned container %s", id, r.Status.Id)
		}
		return err
	})
}

func (s *storm) listSandboxes(p *stormPod) {
	s.call("ListPodSandbox", func(ctx context.Context) error {
		_, err := s.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		return err
	})
}

func (s *storm) listContainers(p *stormPod) {
	sb, _ := p.ids()
	s.call("ListContainers", func(ctx context.Context) error {
		r, err := s.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb}})
		for _, c := range r.GetContainers() {
			if sb != "" && c.PodSandboxId != sb {
				s.fail("ListContainers filtered by sandbox %s returned container %s of sandbox %s", sb, c.Id, c.PodSandboxId)
			}
		}
		return err
	})
}

func (s *storm) fail(format string, args ...interface{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, fmt.Sprintf(format, args...))
}

// TestConcurrentCRICalls: kubelet's calls for many pods at once, and its
// retries racing them. 200 CRI calls in flight over 50 VM pods against a
// daemon and fake hypervisor built with -race: each pod's own lifecycle,
// through three sandbox attempts (run, create, start, then stop and
// remove, or not at the last), races status and list calls and calls that
// stop, remove, create again or run again the same pod. No data race;
// every call answered within its deadline (else the daemon's goroutines
// are dumped into the test log); every answer a success or
// NotFound/FailedPrecondition; no container outlives its sandbox, every
// container has its VM and nothing else does; and removing what is left
// leaves no pod, container or VM.
func TestConcurrentCRICalls(t *testing.T) {
	raceBins := t.TempDir()
	built := time.Now()
	if err := harness.Build(raceBins, map[string]string{"virtlet-fake-plugin": "github.com/virtlet/virtlet/testing/fakeplugin"}, "-race"); err != nil {
		t.Fatal(err)
	}
	t.Logf("daemon and fake plugin built with -race in %s", time.Since(built).Round(time.Millisecond))
	for _, bin := range []string{"virtlet", "virtlet-fake-plugin"} {
		if out, err := exec.Command("go", "version", "-m", filepath.Join(raceBins, bin)).Output(); err != nil || !strings.Contains(string(out), "-race=true") {
			t.Fatalf("%s is not built with the race detector: %v\n%s", bin, err, out)
		}
	}
	began := time.Now()
	fake := filepath.Join(raceBins, "virtlet-fake-plugin")
	d := harness.NewDaemon(t, filepath.Join(raceBins, "virtlet"), []harness.Plugin{
		{Name: "fake-hypervisor", Kind: "hypervisor", Binary: fake, Args: []string{"hypervisor"}},
		{Name: "fake-images", Kind: "image", Binary: fake, Args: []string{"image"}},
		{Name: "nocloud", Kind: "datasource", Binary: filepath.Join(bins, "virtlet-plugin-nocloud")},
	})
	d.Start()
	rt, images := d.CRI(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}); err != nil {
		t.Fatal(err)
	}

	pods := make([]*stormPod, stormPods)
	for i := range pods {
		name := fmt.Sprintf("storm-%02d", i)
		pods[i] = &stormPod{name: name, logDir: filepath.Join(d.Dir, "pods", "default_"+name)}
	}
	s := &storm{rt: rt, latencies: map[string][]time.Duration{}, codes: map[string]map[codes.Code]int{}}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	// The first stormPods workers each own a pod's lifecycle, through
	// stormRounds sandbox attempts; the others race them, three to a pod.
	racerOps := []func(*stormPod){
		s.sandboxStatus, s.sandboxStatus, s.containerStatus, s.containerStatus, s.listSandboxes, s.listContainers,
		s.runSandbox, s.createContainer, s.startContainer, s.stopContainer, s.removeContainer, s.stopSandbox, s.removeSandbox,
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < stormWorkers; w++ {
		p := pods[w%stormPods]
		rnd := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if w >= stormPods {
				for range stormRacerCalls {
					racerOps[rnd.IntN(len(racerOps))](p)
					time.Sleep(time.Duration(rnd.IntN(3)) * time.Millisecond)
				}
				return
			}
			for round := range stormRounds {
				if round > 0 {
					p.nextAttempt()
				}
				s.runSandbox(p)
				s.createContainer(p)
				s.startContainer(p)
				switch {
				case round < stormRounds-1 || w%3 == 0: // kubelet deletes the pod
					s.stopContainer(p)
					s.removeContainer(p)
					s.stopSandbox(p)
					s.removeSandbox(p)
				case w%3 == 1: // the VM was stopped, the pod not yet removed
					s.stopContainer(p)
					s.stopSandbox(p)
				}
			}
		}()
	}
	stormStart := time.Now()
	close(start)
	wg.Wait()
	stormTook := time.Since(stormStart)

	if s.stuck {
		t.Logf("a call hit its deadline; the daemon's goroutines:\n%s", d.DumpGoroutines())
	}
	for i, f := range s.failures {
		if i == 20 {
			t.Errorf("... and %d more", len(s.failures)-i)
			break
		}
		t.Error(f)
	}
	if s.stuck {
		t.FailNow()
	}
	total := 0
	var methods []string
	for m := range s.latencies {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	for _, m := range methods {
		l := s.latencies[m]
		slices.Sort(l)
		total += len(l)
		t.Logf("%-17s %4d calls  p50 %8s  p99 %8s  max %8s  codes %v", m, len(l), pct(l, 50), pct(l, 99), l[len(l)-1].Round(time.Microsecond), s.codes[m])
	}
	t.Logf("%d calls in %s, up to %d in flight", total, stormTook.Round(time.Millisecond), s.maxIn.Load())
	if got := s.maxIn.Load(); got < stormWorkers*9/10 {
		t.Errorf("only %d calls were in flight at once", got)
	}

	// What the storm left is consistent: each container in a listed
	// sandbox, each with its VM, and no other VM.
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sandboxes, containers := listAll(ctx, t, rt)
	known := map[string]bool{}
	for _, sb := range sandboxes {
		known[sb.Id] = true
	}
	var ctrIDs []string
	for _, c := range containers {
		if !known[c.PodSandboxId] {
			t.Errorf("container %s outlives its sandbox %s", c.Id, c.PodSandboxId)
		}
		ctrIDs = append(ctrIDs, c.Id)
	}
	slices.Sort(ctrIDs)
	if vms := fakeVMs(t, d); !slices.Equal(vms, ctrIDs) {
		t.Errorf("fake hypervisor VMs %v, containers %v", vms, ctrIDs)
	}
	t.Logf("left by the storm: %d sandboxes, %d containers", len(sandboxes), len(containers))

	// Removing everything converges to nothing.
	for _, c := range containers {
		if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: c.Id, Timeout: 1}); err != nil {
			t.Errorf("stop container %s: %v", c.Id, err)
		}
		if _, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.Id}); err != nil {
			t.Errorf("remove container %s: %v", c.Id, err)
		}
	}
	for _, sb := range sandboxes {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			t.Errorf("stop sandbox %s: %v", sb.Id, err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			t.Errorf("remove sandbox %s: %v", sb.Id, err)
		}
	}
	if sandboxes, containers := listAll(ctx, t, rt); len(sandboxes)+len(containers) != 0 {
		t.Errorf("after removing everything: %d sandboxes, %d containers", len(sandboxes), len(containers))
	}
	if vms := fakeVMs(t, d); len(vms) != 0 {
		t.Errorf("after removing everything the fake hypervisor has VMs %v", vms)
	}

	d.Stop()
	log := d.Log()
	for _, bad := range []string{"WARNING: DATA RACE", "panic:"} {
		if i := strings.Index(log, bad); i >= 0 {
			t.Errorf("the daemon's log has %q:\n%s", bad, log[i:min(len(log), i+8000)])
		}
	}
	t.Logf("suite ran in %s (without the build)", time.Since(began).Round(time.Millisecond))
}

// raiseTo makes a at least n.
func raiseTo(a *atomic.Int32, n int32) {
	for {
		if m := a.Load(); n <= m || a.CompareAndSwap(m, n) {
			return
		}
	}
}

func pct(sorted []time.Duration, p int) time.Duration {
	return sorted[(len(sorted)-1)*p/100].Round(time.Microsecond)
}

func listAll(ctx context.Context, t *testing.T, rt runtimeapi.RuntimeServiceClient) ([]*runtimeapi.PodSandbox, []*runtimeapi.Container) {
	t.Helper()
	sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ctrs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return sbs.Items, ctrs.Containers
}

// fakeVMs lists the IDs of the VMs the fake hypervisor plugin keeps.
func fakeVMs(t *testing.T, d *harness.Daemon) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(d.StateDir, "plugins", "fake-hypervisor", "vms.json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var vms map[string]json.RawMessage
	if err := json.Unmarshal(data, &vms); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for id := range vms {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
