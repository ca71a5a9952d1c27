package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/harness"
)

// Twenty real VM pods (the tiny guest, on a CNI pod network) created at
// once and removed at once, twice, through a daemon and plugins built
// with the race detector: no race, no deadlock, every call answered, and
// nothing left after each round. The latency of each CRI method is
// printed (p50, p99).
func TestConcurrentVMPods(t *testing.T) {
	const pods, rounds = 20, 2
	race := t.TempDir()
	if err := harness.Build(race, harness.ShippedPlugins, "-race"); err != nil {
		t.Fatal(err)
	}
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 87})
	d := harness.NewDaemon(t, filepath.Join(race, "virtlet"), append(harness.Shipped(race), tn.Plugin(race)))
	d.Translate("test-images.yaml", translation)
	d.Start()
	rt, img := d.CRI(t)
	ctx := context.Background()
	pulled, err := img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: tinyRef}})
	if err != nil {
		t.Fatal(err)
	}
	base := snapshotNode(t, d, tn)

	var mu sync.Mutex
	latency := map[string][]time.Duration{}
	call := func(method string, f func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, 4*time.Minute) // a call that never returns is a deadlock
		defer cancel()
		start := time.Now()
		err := f(cctx)
		mu.Lock()
		latency[method] = append(latency[method], time.Since(start))
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
		return nil
	}
	all := func(what string, f func(i int) error) {
		t.Helper()
		errs := make([]error, pods)
		var wg sync.WaitGroup
		for i := 0; i < pods; i++ {
			wg.Add(1)
			go func(i int) { defer wg.Done(); errs[i] = f(i) }(i)
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("%s, pod %d: %v", what, i, err)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	for round := 1; round <= rounds; round++ {
		sandboxes, containers := make([]string, pods), make([]string, pods)
		all("run, create and start", func(i int) error {
			name := fmt.Sprintf("conc-%d-%02d", round, i)
			podCfg := &runtimeapi.PodSandboxConfig{
				Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
				Annotations:  map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud"},
				LogDirectory: filepath.Join(d.Dir, "pods", name),
			}
			if err := call("RunPodSandbox", func(ctx context.Context) error {
				r, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podCfg})
				if err == nil {
					sandboxes[i] = r.PodSandboxId
				}
				return err
			}); err != nil {
				return err
			}
			if err := call("CreateContainer", func(ctx context.Context) error {
				r, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxes[i], SandboxConfig: podCfg,
					Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name}, Image: &runtimeapi.ImageSpec{Image: pulled.ImageRef},
						LogPath: "vm.log", Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 96 << 20}}}})
				if err == nil {
					containers[i] = r.ContainerId
				}
				return err
			}); err != nil {
				return err
			}
			return call("StartContainer", func(ctx context.Context) error {
				_, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: containers[i]})
				return err
			})
		})
		// Lists and statuses while they run.
		all("status and lists", func(i int) error {
			if err := call("ContainerStatus", func(ctx context.Context) error {
				st, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: containers[i]})
				if err == nil && st.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
					err = fmt.Errorf("state %s", st.Status.State)
				}
				return err
			}); err != nil {
				return err
			}
			return call("ListContainers", func(ctx context.Context) error {
				r, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
				if err == nil && len(r.Containers) != pods {
					err = fmt.Errorf("%d containers listed, want %d", len(r.Containers), pods)
				}
				return err
			})
		})
		all("stop and remove", func(i int) error {
			steps := []struct {
				method string
				f      func(context.Context) error
			}{
				{"StopContainer", func(ctx context.Context) error {
					_, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: containers[i]})
					return err
				}},
				{"RemoveContainer", func(ctx context.Context) error {
					_, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: containers[i]})
					return err
				}},
				{"StopPodSandbox", func(ctx context.Context) error {
					_, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxes[i]})
					return err
				}},
				{"RemovePodSandbox", func(ctx context.Context) error {
					_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxes[i]})
					return err
				}},
			}
			for _, s := range steps {
				if err := call(s.method, s.f); err != nil {
					return err
				}
			}
			return nil
		})
		if left := snapshotNode(t, d, tn).minus(base); len(left) > 0 {
			t.Errorf("round %d left: %v", round, left)
		}
	}
	log := d.Log()
	for _, sign := range []string{"WARNING: DATA RACE", "panic:"} {
		if i := strings.Index(log, sign); i >= 0 {
			// The report itself, not the log's end: the first one and what follows.
			t.Errorf("the daemon or a plugin raced or panicked (%d reports):\n%s", strings.Count(log, sign), head(log[i:], 12000))
		}
	}
	var b strings.Builder
	methods := make([]string, 0, len(latency))
	for m := range latency {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	for _, m := range methods {
		l := latency[m]
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		fmt.Fprintf(&b, "%-18s %3d calls  p50 %8s  p99 %8s\n", m, len(l), l[len(l)/2].Round(time.Millisecond), l[len(l)*99/100].Round(time.Millisecond))
	}
	t.Logf("%d VM pods at once, %d rounds (daemon and plugins built with -race):\n%s", pods, rounds, b.String())
}
