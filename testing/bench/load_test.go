package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/harness"
)

// loadPods is how many VM pods BenchmarkP5HundredVMPods runs at once.
var loadPods = size(100, 3)

const (
	// loadPodMemory is each load pod's memory limit.
	loadPodMemory = 128 << 20
	// loadGuard is the host's available memory under which the limit
	// search stops adding pods: Virtlet does not refuse a VM for its
	// node's memory (kubelet's admission does, by requests, and its
	// max-pods, 110 by default), and the kernel's OOM killer would end it.
	loadGuard = 3 << 30
	// loadAddresses is how many pods the /24 pod network can address
	// (host-local gives .2 to .254; the bridge holds .1).
	loadAddresses = 253
	// loadLibvirtConfig is the libvirt plugin as installs ship it: the
	// pool of two, each TCG VM's translation cache sized by its memory
	// (16 MiB for these; BenchmarkTCGTranslationCache weighs the cap
	// against boot time).
	loadLibvirtConfig = "{pool: {size: 2}}"
)

// BenchmarkP5HundredVMPods: 100 tiny VM pods of 128 MiB at once, on the
// pod network (the CNI plugin process: Debian's bridge + host-local), on
// this 2-core, 24 GiB machine. The pods start five at a time through the
// CRI, as kubelet would start them, with the libvirt plugin as shipped
// (loadLibvirtConfig) and the first pod keeping its pages to
// itself (VirtletMemorySharing: "false"). It reports the time until all
// are at their ready marker; the host's memory in use at rest (MemTotal −
// MemAvailable, beside the same before the first pod), without KSM and
// with the install's KSM tuning settled; ListPodSandbox/ListContainers
// p99 and RunPodSandbox p99 at that load (20 more pods' sandboxes, one
// after another, each removed again); then the limit: pods added ten at a
// time until a start fails, the host's available memory falls under
// loadGuard, or the pod network's addresses run out, naming which and
// with what error. Targets (issue 26): all ready, ≤ 8 GiB in use at rest,
// List* p99 ≤ 2 ms, RunPodSandbox p99 ≤ 100 ms. Run with -benchtime 1x;
// the full run takes about half an hour.
func BenchmarkP5HundredVMPods(b *testing.B) {
	tn := harness.NewTestNetwork(b, harness.NetworkOptions{Index: 63})
	_, translation := serveGuest(b, "tiny", "tiny")
	dir := builtBinaries(b)
	d := harness.NewDaemon(b, filepath.Join(dir, "virtlet"),
		append(harness.WithConfig(harness.Shipped(dir), "libvirt", loadLibvirtConfig), tn.Plugin(dir)))
	rt, pulled := startPullingTiny(b, d, translation)
	ctx := context.Background()
	var mu sync.Mutex
	var pods []tinyPod
	defer func() {
		// Every pod goes, ten at a time, whatever happened.
		sem := make(chan struct{}, 10)
		var wg sync.WaitGroup
		for _, p := range pods {
			wg.Add(1)
			sem <- struct{}{}
			go func(sb string) { defer wg.Done(); defer func() { <-sem }(); removePod(ctx, rt, sb) }(p.sandbox)
		}
		wg.Wait()
	}()
	// start starts n more pods, five at a time, each to its ready marker;
	// it returns their RunPodSandbox times and the first error.
	start := func(n int) ([]time.Duration, error) {
		first := len(pods)
		runs := make([]time.Duration, n)
		errs := make([]error, n)
		sem := make(chan struct{}, 5)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func(i int) {
				defer wg.Done()
				defer func() { <-sem }()
				var ann map[string]string
				if first+i == 0 {
					ann = map[string]string{"VirtletMemorySharing": "false"}
				}
				p, run, err := runTinyPodTimed(rt, d.Dir, pulled.ImageRef, fmt.Sprintf("load-%03d", first+i), ann, loadPodMemory)
				runs[i], errs[i] = run, err
				if p.sandbox != "" {
					mu.Lock()
					pods = append(pods, p)
					mu.Unlock()
				}
				if err == nil {
					errs[i] = waitReady(p, 10*time.Minute)
				}
			}(i)
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return runs, err
			}
		}
		return runs, nil
	}

	before := hostMemInUse()
	b.ResetTimer()
	began := time.Now()
	starting, err := start(loadPods)
	if err != nil {
		b.Fatalf("%d pods: %v", loadPods, err)
	}
	allReady := time.Since(began)
	b.StopTimer()
	fmt.Printf("P5 load: %d tiny VM pods (128 MiB, pod network) all at their ready marker in %s (5 started at a time); RunPodSandbox while they started: p50 %s, p99 %s\n",
		loadPods, allReady.Round(time.Second), ms(quantile(starting, 0.5)), ms(quantile(starting, 0.99)))
	time.Sleep(30 * time.Second) // at rest: the guests idle
	atRest := hostMemInUse()
	fmt.Printf("   host memory in use: %s before the first pod, %s at rest with %d (%.0f MiB a pod)\n",
		gib(before), gib(atRest), loadPods, mibOf(atRest-before)/float64(loadPods))

	listP99 := listsP99(b, rt)
	// RunPodSandbox at that load: 20 more sandboxes (a network each), one
	// after another, each removed again.
	var runs []time.Duration
	for i := 0; i < size(20, 2); i++ {
		cfg := benchPod(d.Dir, fmt.Sprintf("load-extra-%02d", i), nil)
		t0 := time.Now()
		sb, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		runs = append(runs, time.Since(t0))
		if err != nil {
			b.Fatalf("RunPodSandbox at %d pods: %v", loadPods, err)
		}
		removePod(ctx, rt, sb.PodSandboxId)
	}
	runP99 := quantile(runs, 0.99)
	fmt.Printf("   at that load: ListPodSandbox/ListContainers p99 %s, RunPodSandbox p99 %s (p50 %s) over %d sandboxes\n",
		ms(listP99), ms(runP99), ms(quantile(runs, 0.5)), len(runs))
	rows := []Row{
		{Figure: fmt.Sprintf("P5 load: %d tiny VM pods (128 MiB, pod network on) at once, all at their ready marker (5 started at a time)", loadPods),
			Ours: ms(allReady), Target: "all ready", Met: "met"},
		{Figure: fmt.Sprintf("P5 load: host memory in use at rest with %d (MemTotal − MemAvailable; libvirt plugin %s), KSM off", loadPods, loadLibvirtConfig),
			Ours: gib(atRest), Floor: gib(before) + " before the first pod", Target: "≤ 8 GiB", Met: met(atRest <= 8<<30)},
		{Figure: fmt.Sprintf("P5 load: ListPodSandbox/ListContainers p99 at %d pods", loadPods), Ours: ms(listP99), Target: "≤ 2 ms", Met: met(listP99 <= 2*time.Millisecond)},
		{Figure: fmt.Sprintf("P5 load: RunPodSandbox p99 at %d pods (%d more sandboxes, one after another; while the %d started: %s)", loadPods, len(runs), loadPods, ms(quantile(starting, 0.99))),
			Ours: ms(runP99), Target: "≤ 100 ms", Met: met(runP99 <= 100*time.Millisecond)},
	}
	if smoke {
		// Beside make check's other suites: KSM's scanning would take their
		// CPU, and the limit is far off.
		for i := range rows {
			rows[i].Met = ""
		}
		record(rows...)
		return
	}
	var domains []string
	for _, p := range pods[1:] {
		domains = append(domains, p.domain)
	}
	ksm, err := measureKSM(b, domains, pods[0].domain)
	if err != nil {
		fmt.Printf("   KSM: %v\n", err)
	} else {
		fmt.Printf("   with KSM settled (%s, %d pages sharing): host memory in use %s; PSS per pod %.1f MiB without, %.1f MiB with\n",
			ksm.settled.Round(time.Second), ksm.sharing, gib(ksm.hostInUse), mibOf(ksm.pssOff)/float64(len(domains)), mibOf(ksm.pssOn)/float64(len(domains)))
		rows = append(rows, Row{Figure: fmt.Sprintf("P5 load: host memory in use at rest with %d, KSM on (the install's tuning, settled)", loadPods),
			Ours: gib(ksm.hostInUse), Floor: gib(before) + " before the first pod", Target: "≤ 8 GiB", Met: met(ksm.hostInUse <= 8<<30)})
	}

	// The limit: ten more pods at a time until something gives (KSM off,
	// as measureKSM leaves it).
	limit := ""
	for limit == "" {
		avail := hostMemAvailable()
		switch {
		case len(pods)+10 > loadAddresses:
			limit = fmt.Sprintf("no start failed up to %d pods; the /24 pod network has no address for 10 more", len(pods))
		case avail < loadGuard:
			limit = fmt.Sprintf("no start failed up to %d pods; the bench stopped with %s available on the host (Virtlet does not refuse a VM for its node's memory: kubelet's admission by requests and its max-pods, 110 by default, do)", len(pods), gib(avail))
		default:
			if _, err := start(10); err != nil {
				limit = fmt.Sprintf("a start failed at %d pods: %v", len(pods), err)
			}
		}
	}
	fmt.Printf("   the limit: %s\n", limit)
	first, _, _ := strings.Cut(limit, "\n") // a console's tail follows
	rows = append(rows, Row{Figure: "P5 load: the limit (pods added ten at a time until a start fails; KSM off)", Ours: first, Target: "found"})
	record(rows...)
}

// hostMemInUse is the host's memory in use: MemTotal − MemAvailable.
func hostMemInUse() int64 {
	m := meminfo()
	return m["MemTotal"] - m["MemAvailable"]
}

// hostMemAvailable is the host's MemAvailable.
func hostMemAvailable() int64 { return meminfo()["MemAvailable"] }

// meminfo reads /proc/meminfo, in bytes.
func meminfo() map[string]int64 {
	m := map[string]int64{}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
			m[name] = n << 10 // kB
		}
	}
	return m
}

func gib(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }
