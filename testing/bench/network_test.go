package bench

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/virtlet/virtlet/plugins/host"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/harness"
)

// BenchmarkPodNetwork20: the network part of RunPodSandbox and of
// StopPodSandbox for 20 pods, through the real CNI plugin process (network
// namespace, CNI ADD of Debian's bridge + host-local, the links to the VM,
// the DHCP server; and the reverse), one pod after the other, as kubelet
// would. Reports p50 and p99 of each.
func BenchmarkPodNetwork20(b *testing.B) {
	tn := harness.NewTestNetwork(b, harness.NetworkOptions{Index: 60})
	dir := b.TempDir()
	bin := filepath.Join(dir, "virtlet-plugin-cni")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/virtlet/virtlet/cmd/virtlet-plugin-cni").CombinedOutput(); err != nil {
		b.Fatalf("build plugin: %v\n%s", err, out)
	}
	sum, _ := manifest.FileSHA256(bin)
	m := manifest.Manifest{Name: "cni", Kind: ports.KindNetwork, Command: bin, SHA256: sum, File: "bench",
		Config: []byte(fmt.Sprintf(`{"confDir": %q, "binDirs": [%q], "netnsPrefix": %q}`, tn.ConfDir, harness.CNIBinDir, tn.NetNSPrefix))}
	h, err := host.Start(context.Background(), []manifest.Manifest{m}, host.Options{StateDir: filepath.Join(dir, "plugins"), Log: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Shutdown()
	nw := h.Network()
	ctx := context.Background()
	req := func(round, i int) ports.NetworkRequest {
		id := fmt.Sprintf("%x", sha256.Sum256([]byte(fmt.Sprint(round, "/", i)))) // like core.SandboxID
		return ports.NetworkRequest{SandboxID: id, PodName: fmt.Sprintf("pod-%d", i), PodNamespace: "bench", PodUID: id[32:],
			DNS: &ports.DNSConfig{Servers: []string{"198.18.60.53"}}}
	}
	// Warm up: the CNI bridge is made by the first ADD.
	if _, err := nw.Setup(ctx, req(0, 0)); err != nil {
		b.Fatal(err)
	}
	if err := nw.Teardown(ctx, req(0, 0)); err != nil {
		b.Fatal(err)
	}
	var setup, teardown []time.Duration
	b.ResetTimer()
	for round := 1; round <= b.N; round++ {
		for i := 0; i < networkPods; i++ {
			start := time.Now()
			if _, err := nw.Setup(ctx, req(round, i)); err != nil {
				b.Fatal(err)
			}
			setup = append(setup, time.Since(start))
		}
		for i := 0; i < networkPods; i++ {
			start := time.Now()
			if err := nw.Teardown(ctx, req(round, i)); err != nil {
				b.Fatal(err)
			}
			teardown = append(teardown, time.Since(start))
		}
	}
	b.StopTimer()
	report := func(prefix, figure string, d []time.Duration) {
		p50, p99 := quantile(d, 0.5), quantile(d, 0.99)
		b.ReportMetric(float64(p50.Microseconds())/1000, prefix+"p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, prefix+"p99-ms")
		record(Row{Figure: figure, Ours: fmt.Sprintf("%s (%s)", ms(p50), ms(p99)), Target: "none set"})
	}
	report("setup-", fmt.Sprintf("pod network setup (RunPodSandbox: CNI bridge + host-local through the plugin), p50 (p99) of %d pods", networkPods), setup)
	report("teardown-", fmt.Sprintf("pod network teardown (StopPodSandbox), p50 (p99) of %d pods", networkPods), teardown)
	if held := tn.Allocated(); len(held) != 0 {
		b.Fatalf("host-local still holds %v", held)
	}
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}
