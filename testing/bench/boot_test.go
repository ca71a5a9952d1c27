package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/harness"
	"github.com/virtlet/virtlet/testing/imageserver"
)

const bootRuns = 5

// phases collects the daemon path's steps, for the report.
var phases = map[string][]time.Duration{}

// BenchmarkP1BootOverhead: RunPodSandbox → the tiny guest's first console
// line through the daemon, against a bare qemu-system-x86_64 booting the
// same image (same accelerator, machine type, vCPUs and memory) to the
// same line; medians of 5 runs each. Target: ratio ≤ 1.10. Run it alone,
// with -benchtime 1x (make bench does).
func BenchmarkP1BootOverhead(b *testing.B) {
	tiny, d, rt, pulled := tinyDaemon(b)
	ctx := context.Background()
	accel := "tcg"
	if st, err := rt.Status(ctx, &runtimeapi.StatusRequest{Verbose: true}); err == nil && strings.Contains(st.Info["hypervisor"], `"Accelerator":"kvm"`) {
		accel = "kvm"
	}

	b.ResetTimer()
	var daemon, bare []time.Duration
	for i := 0; i < bootRuns; i++ {
		daemon = append(daemon, bootThroughDaemon(b, rt, d.Dir, pulled.ImageRef, i))
		bare = append(bare, bootBare(b, tiny, accel))
	}
	b.StopTimer()
	md, mb := median(daemon), median(bare)
	ratio := float64(md) / float64(mb)
	b.ReportMetric(float64(md.Milliseconds()), "daemon-ms")
	b.ReportMetric(float64(mb.Milliseconds()), "bare-qemu-ms")
	b.ReportMetric(ratio, "ratio")
	fmt.Printf("P1 boot to first console line (%s, median of %d): through virtlet %s, bare QEMU %s, ratio %.2f (target <= 1.10)\n   runs: virtlet %v\n         bare    %v\n",
		accel, bootRuns, md.Round(time.Millisecond), mb.Round(time.Millisecond), ratio, round(daemon), round(bare))
	for _, p := range []string{"run", "create", "start", "first-line"} {
		fmt.Printf("   virtlet %-10s median %s\n", p, median(phases[p]).Round(time.Millisecond))
	}
}

// bootThroughDaemon runs a VM pod and waits for its first console line in
// the CRI log; then it removes the pod.
func bootThroughDaemon(b *testing.B, rt runtimeapi.RuntimeServiceClient, dir, image string, i int) time.Duration {
	ctx := context.Background()
	name := fmt.Sprintf("boot-%d", i)
	logDir := filepath.Join(dir, "pods", name)
	podCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: fmt.Sprintf("uid-%d-%d", i, time.Now().UnixNano())},
		Annotations:  map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud", "VirtletDiskDriver": "virtio"},
		LogDirectory: logDir,
	}
	start := time.Now()
	phase := start
	mark := func(name string) {
		phases[name] = append(phases[name], time.Since(phase))
		phase = time.Now()
	}
	sb, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podCfg})
	mark("run")
	if err != nil {
		b.Fatal(err)
	}
	ctr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: podCfg,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name}, Image: &runtimeapi.ImageSpec{Image: image},
			LogPath: "vm.log", Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 128 << 20}}}})
	if err != nil {
		b.Fatal(err)
	}
	mark("create")
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		b.Fatal(err)
	}
	mark("start")
	logFile := filepath.Join(logDir, "vm.log")
	for time.Since(start) < 2*time.Minute {
		if data, err := os.ReadFile(logFile); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				// <time> stdout F|P <content>
				if f := strings.SplitN(line, " ", 4); len(f) == 4 && strings.TrimSpace(f[3]) != "" {
					took := time.Since(start)
					mark("first-line")
					rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId})
					return took
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.Fatalf("no console line in %s", logFile)
	return 0
}

// bootBare runs QEMU directly on the same image and waits for its first
// serial console line.
func bootBare(b *testing.B, image, accel string) time.Duration {
	start := time.Now()
	cmd := exec.Command("qemu-system-x86_64", "-accel", accel, "-machine", "pc", "-m", "128", "-smp", "1",
		"-nodefaults", "-display", "none", "-snapshot", "-drive", "file="+image+",format=qcow2,if=virtio",
		"-serial", "stdio", "-no-reboot")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			return time.Since(start)
		}
	}
	b.Fatalf("bare QEMU printed no console line: %v", sc.Err())
	return 0
}

var (
	buildOnce sync.Once
	binsDir   string
	buildErr  error
)

// tinyDaemon serves the tiny guest image, starts a real daemon that
// translates virtlet.cloud/tiny to it, and pulls it.
func tinyDaemon(b *testing.B) (image string, d *harness.Daemon, rt runtimeapi.RuntimeServiceClient, pulled *runtimeapi.PullImageResponse) {
	image, translation := serveGuest(b, "tiny", "tiny")
	d = realDaemon(b)
	d.Translate("bench.yaml", translation)
	d.Start()
	rt, img := d.CRI(b)
	pulled, err := img.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "virtlet.cloud/tiny"}})
	if err != nil {
		b.Fatal(err)
	}
	return image, d, rt, pulled
}

// realDaemon prepares a daemon with the shipped plugins (built once per run).
func realDaemon(b *testing.B) *harness.Daemon {
	dir := builtBinaries(b)
	return harness.NewDaemon(b, filepath.Join(dir, "virtlet"), harness.Shipped(dir))
}

// builtBinaries builds the daemon and the shipped plugins once.
func builtBinaries(b *testing.B) string {
	if err := harness.EnsureLibvirt(); err != nil {
		b.Fatal(err)
	}
	buildOnce.Do(func() {
		if binsDir, buildErr = os.MkdirTemp("", "virtlet-bench-bin-"); buildErr != nil {
			return
		}
		buildErr = harness.Build(binsDir, harness.ShippedPlugins)
	})
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	return binsDir
}

// serveGuest builds a test guest image ("tiny" or "cloud") and serves it
// on loopback; it returns the image's path and the translation naming it
// virtlet.cloud/<name>.
func serveGuest(b *testing.B, kind, name string) (image, translation string) {
	image, err := harness.GuestImage(kind)
	if err != nil {
		b.Fatal(err)
	}
	www := b.TempDir()
	if err := os.Symlink(image, filepath.Join(www, kind+".qcow2")); err != nil {
		b.Fatal(err)
	}
	srv, err := imageserver.Start(www, "127.0.0.1:0", www)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	translation, err = srv.Translation(map[string]string{name: kind + ".qcow2"})
	if err != nil {
		b.Fatal(err)
	}
	return image, translation
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func round(d []time.Duration) []time.Duration {
	out := make([]time.Duration, len(d))
	for i, v := range d {
		out[i] = v.Round(time.Millisecond)
	}
	return out
}
