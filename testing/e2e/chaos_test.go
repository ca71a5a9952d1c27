package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/adapters/admin"
	"github.com/virtlet/virtlet/testing/harness"
)

// Plugin chaos: 20 VM pods of the tiny guest run on a CNI network while 50
// CRI calls at a time hit the daemon (exec, stats, pulls, containers made
// and removed with cloud-init media, a 9p share and a qcow2 volume, pods run
// and stopped on the network, and reads that need no plugin). Each plugin
// in turn is killed with SIGKILL in the middle of it. Then:
//   - every VM runs on, in the QEMU process it started in;
//   - while the plugin is down, calls that need it fail within a second
//     with an error naming it, and calls that do not need it succeed;
//   - within 2 s of the supervisor reporting it back, calls that need it
//     succeed again (no call started later fails, and the first to succeed
//     starts no later than that plus the time a worker may still be busy
//     in a call begun before);
//   - the daemon's goroutines, descriptors and child processes, and what
//     the node holds for VM pods, are what they were before.
// A table of the outages is printed.

const (
	chaosVMs     = 20
	chaosWave    = 4 // VMs booting at a time: 2 cores boot 4 tiny guests in ~15 s
	chaosScratch = 10
	// chaosKills bounds the kills of one plugin that may miss every call
	// needing it (see the per-plugin subtest).
	chaosKills   = 5
	chaosPodRuns = 4
)

// chaosCall is one CRI call made under the load.
type chaosCall struct {
	name       string
	needs      []string // the plugins the call needs
	start, end time.Time
	err        error
}

// callLog records the load's calls, safe for concurrent use, and the
// load's failures, which the test reports once the load has stopped.
type callLog struct {
	mu       sync.Mutex
	calls    []chaosCall
	failures []string
}

// do makes one call and records it.
func (l *callLog) do(name string, needs []string, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	err := call(ctx)
	l.mu.Lock()
	l.calls = append(l.calls, chaosCall{name: name, needs: needs, start: start, end: time.Now(), err: err})
	l.mu.Unlock()
	return err
}

// succeededSince tells whether a call that needs the plugin, started at
// or after since, has succeeded.
func (l *callLog) succeededSince(plugin string, since time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.calls {
		if c.err == nil && !c.start.Before(since) && slices.Contains(c.needs, plugin) {
			return true
		}
	}
	return false
}

// until repeats a call until it succeeds, as kubelet does with the steps of
// a pod's life (with a short pause, so that the outage sees many calls).
func (l *callLog) until(t *testing.T, name string, needs []string, call func(context.Context) error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := l.do(name, needs, call)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			l.mu.Lock()
			l.failures = append(l.failures, fmt.Sprintf("%s did not succeed within 2 minutes; last error: %v", name, err))
			l.mu.Unlock()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A worker makes calls until stop is closed; a worker that runs a pod's or
// a container's life finishes it first, so that the node is as it was.
type worker func(stop <-chan struct{}, l *callLog)

type chaosRow struct {
	plugin                 string
	noticed, down          time.Duration // kill → seen down, kill → reported back
	needFailed, needOK     int           // calls that need the plugin, started while it was down
	otherFailed, otherOK   int           // the other calls started while it was down
	maxErrLatency          time.Duration // of the calls that needed it and failed while it was down
	firstOK, firstOKEnd    time.Duration // reported back → start (end) of the first good call that needs it
	lateFailed, totalCalls int
	kills                  int // how many kills it took to catch a call inside the plugin
}

// chaosPod is a VM pod's sandbox config for the chaos suite.
func chaosPod(d *harness.Daemon, name string, ann map[string]string) *runtimeapi.PodSandboxConfig {
	all := map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud"}
	for k, v := range ann {
		all[k] = v
	}
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
		Annotations:  all,
		LogDirectory: filepath.Join(d.Dir, "pods", "default_"+name),
	}
}

func chaosContainer(name string, attempt uint32, mounts []*runtimeapi.Mount) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
		Image:    &runtimeapi.ImageSpec{Image: tinyRef},
		LogPath:  fmt.Sprintf("%s/%d.log", name, attempt),
		Linux:    &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 160 << 20}},
		Mounts:   mounts,
	}
}

// pluginState finds a plugin in the admin API's status.
func pluginState(st admin.Status, name string) admin.PluginState {
	for _, p := range st.Plugins {
		if p.Name == name {
			return p
		}
	}
	return admin.PluginState{}
}

func TestPluginChaos(t *testing.T) {
	began := time.Now()
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 91})
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(plugins(), tn.Plugin(bins)))
	d.Translate("test-images.yaml", translation)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	c.Must(t, "pull", tinyRef)
	rt, is := d.CRI(t)
	bg := context.Background()
	// The supervisors' view, from the admin API: it asks no plugin, so it
	// answers at once however busy the CRI is.
	adm, err := admin.Dial(d.AdminSocket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adm.Close() })

	// The 20 VMs, chaosWave of them booting at a time: the next starts as
	// soon as one is ready, so that both cores stay busy.
	type vm struct{ sb, ctr, domain, pid string }
	vms := make([]vm, chaosVMs)
	bootErrs := make([]error, chaosVMs)
	booting := make(chan struct{}, chaosWave)
	var wg sync.WaitGroup
	for i := range vms {
		wg.Add(1)
		booting <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-booting }()
			name := fmt.Sprintf("chaos-vm-%02d", i)
			pod := chaosPod(d, name, nil)
			sb, err := rt.RunPodSandbox(bg, &runtimeapi.RunPodSandboxRequest{Config: pod})
			if err != nil {
				bootErrs[i] = fmt.Errorf("RunPodSandbox %s: %w", name, err)
				return
			}
			ctr, err := rt.CreateContainer(bg, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId,
				Config: chaosContainer(name, 0, nil), SandboxConfig: pod})
			if err != nil {
				bootErrs[i] = fmt.Errorf("CreateContainer %s: %w", name, err)
				return
			}
			if _, err := rt.StartContainer(bg, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
				bootErrs[i] = fmt.Errorf("StartContainer %s: %w", name, err)
				return
			}
			vms[i] = vm{sb: sb.PodSandboxId, ctr: ctr.ContainerId}
			// Every 500 ms, as waitLog: crictl is a process, and four of
			// them polling faster take the CPU the guests boot with.
			for until := time.Now().Add(3 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
				if logs, _, _ := c.Run("logs", ctr.ContainerId); strings.Contains(logs, "@@TINY-READY") {
					break
				}
				if time.Now().After(until) {
					bootErrs[i] = fmt.Errorf("%s: no @@TINY-READY on its console within 3 minutes", name)
					break
				}
			}
		}(i)
	}
	wg.Wait()
	for _, err := range bootErrs {
		if err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	for i := range vms {
		vms[i].domain = inspectCtr(t, c, vms[i].ctr).VM.Name
		vms[i].pid = qemuPID(t, vms[i].domain)
	}
	booted := time.Since(began)

	// The pods whose containers the load makes and removes: cloud-init by
	// NoCloud or ConfigDrive, an emptyDir (a 9p share), half of them a
	// qcow2 flexvolume.
	type scratch struct {
		pod    *runtimeapi.PodSandboxConfig
		sb     string
		mounts []*runtimeapi.Mount
		needs  []string
	}
	scratches := make([]scratch, chaosScratch)
	for i := range scratches {
		name := fmt.Sprintf("chaos-scratch-%02d", i)
		ds := "nocloud"
		if i%2 == 1 {
			ds = "configdrive"
		}
		s := scratch{pod: chaosPod(d, name, map[string]string{"VirtletCloudInitImageType": ds}), needs: []string{"libvirt", ds, "ninep"}}
		k := harness.KubeletPod{Root: filepath.Join(d.Dir, "kubelet"), UID: "uid-" + name}
		emptyDir := k.Volume("kubernetes.io~empty-dir", "scratch")
		if err := os.MkdirAll(emptyDir, 0o777); err != nil {
			t.Fatal(err)
		}
		s.mounts = append(s.mounts, &runtimeapi.Mount{ContainerPath: "/scratch", HostPath: emptyDir})
		if i%3 != 2 {
			disk := flexMount(t, d, k, name, "disk", map[string]string{"type": "qcow2", "capacity": "64MiB"})
			s.mounts = append(s.mounts, &runtimeapi.Mount{ContainerPath: "/data", HostPath: disk})
			s.needs = append(s.needs, "qcow2")
		}
		sb, err := rt.RunPodSandbox(bg, &runtimeapi.RunPodSandboxRequest{Config: s.pod})
		if err != nil {
			t.Fatalf("RunPodSandbox %s: %v", name, err)
		}
		s.sb = sb.PodSandboxId
		scratches[i] = s
	}

	// The load: 50 workers.
	none := []string(nil)
	var workers []worker
	add := func(n int, mk func(i int) worker) {
		for i := 0; i < n; i++ {
			workers = append(workers, mk(i))
		}
	}
	loop := func(name string, needs []string, call func(ctx context.Context, i int) error) func(int) worker {
		return func(i int) worker {
			return func(stop <-chan struct{}, l *callLog) {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if l.do(name, needs, func(ctx context.Context) error { return call(ctx, i) }) != nil {
						time.Sleep(50 * time.Millisecond)
					}
				}
			}
		}
	}
	add(10, loop("ExecSync", []string{"libvirt"}, func(ctx context.Context, i int) error {
		r, err := rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: vms[i%chaosVMs].ctr, Cmd: []string{"true"}, Timeout: 30})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("exit code %d: %s", r.ExitCode, r.Stderr)
		}
		return err
	}))
	add(5, loop("ContainerStats", []string{"libvirt"}, func(ctx context.Context, i int) error {
		_, err := rt.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: vms[(i*4+1)%chaosVMs].ctr})
		return err
	}))
	add(1, loop("ListContainerStats", []string{"libvirt"}, func(ctx context.Context, i int) error {
		_, err := rt.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{})
		return err
	}))
	add(4, loop("PullImage", []string{"images"}, func(ctx context.Context, i int) error {
		_, err := is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: tinyRef}})
		return err
	}))
	add(chaosScratch, func(i int) worker {
		s := scratches[i]
		attempt := uint32(0)
		return func(stop <-chan struct{}, l *callLog) {
			for {
				select {
				case <-stop:
					return
				default:
				}
				attempt++
				var id string
				l.until(t, "CreateContainer", s.needs, func(ctx context.Context) error {
					r, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: s.sb,
						Config: chaosContainer(s.pod.Metadata.Name, attempt, s.mounts), SandboxConfig: s.pod})
					if err == nil {
						id = r.ContainerId
					}
					return err
				})
				if id == "" {
					return
				}
				l.until(t, "RemoveContainer", s.needs, func(ctx context.Context) error {
					_, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
					return err
				})
			}
		}
	})
	add(chaosPodRuns, func(i int) worker {
		n := 0
		return func(stop <-chan struct{}, l *callLog) {
			for {
				select {
				case <-stop:
					return
				default:
				}
				n++
				pod := chaosPod(d, fmt.Sprintf("chaos-net-%d-%d", i, n), nil)
				var id string
				l.until(t, "RunPodSandbox", []string{"cni"}, func(ctx context.Context) error {
					r, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: pod})
					if err == nil {
						id = r.PodSandboxId
					}
					return err
				})
				if id == "" {
					return
				}
				l.until(t, "StopPodSandbox", []string{"cni"}, func(ctx context.Context) error {
					_, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
					return err
				})
				l.until(t, "RemovePodSandbox", none, func(ctx context.Context) error {
					_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
					return err
				})
			}
		}
	})
	// Calls that need no plugin: the records and the image store.
	add(4, loop("ContainerStatus", none, func(ctx context.Context, i int) error {
		_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: vms[(i*5+2)%chaosVMs].ctr})
		return err
	}))
	add(3, loop("PodSandboxStatus", none, func(ctx context.Context, i int) error {
		_, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: vms[(i*7+3)%chaosVMs].sb})
		return err
	}))
	add(3, loop("ListContainers", none, func(ctx context.Context, i int) error {
		_, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		return err
	}))
	add(2, loop("ListPodSandbox", none, func(ctx context.Context, i int) error {
		_, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		return err
	}))
	add(2, loop("ImageStatus", none, func(ctx context.Context, i int) error {
		r, err := is.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: tinyRef}})
		if err == nil && r.Image == nil {
			err = fmt.Errorf("the image is not listed")
		}
		return err
	}))
	add(1, loop("ListImages", none, func(ctx context.Context, i int) error {
		_, err := is.ListImages(ctx, &runtimeapi.ListImagesRequest{})
		return err
	}))
	add(1, loop("Status", none, func(ctx context.Context, i int) error {
		_, err := rt.Status(ctx, &runtimeapi.StatusRequest{})
		return err
	}))
	if len(workers) != 50 {
		t.Fatalf("%d workers, want 50", len(workers))
	}
	runLoad := func(l *callLog) (stopLoad func()) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w(stop, l)
			}()
		}
		return func() {
			close(stop)
			// Every call has a deadline and every retry loop a bound: the
			// workers end; no worker outlives the test.
			wg.Wait()
			for _, f := range l.failures {
				t.Error(f)
			}
		}
	}

	// A round of load before the baseline warms pools and caches, and
	// tells how long each call takes on this machine under this load.
	warm := &callLog{}
	stopWarm := runLoad(warm)
	time.Sleep(5 * time.Second)
	stopWarm()
	time.Sleep(time.Second)
	for _, call := range warm.calls {
		if call.err != nil {
			t.Fatalf("with every plugin up, %s failed: %v", call.name, call.err)
		}
	}
	usual := usualLatencies(warm.calls)
	settled := func() (admin.Status, int, int) {
		st, err := adm.Status(bg)
		if err != nil {
			t.Fatal(err)
		}
		return st, len(fdsOf(d.PID())), len(d.Children())
	}
	st0, fds0, kids0 := settled()
	node0 := snapshotNode(t, d, tn)
	chaosStart := time.Now()

	var rows []chaosRow
	for _, name := range []string{"libvirt", "images", "nocloud", "configdrive", "cni", "ninep", "qcow2"} {
		row := chaosRow{plugin: name}
		t.Run(name, func(t *testing.T) {
			// A plugin that only a step of some calls needs (a datasource
			// builds its ISO in a fraction of CreateContainer) may be down
			// for its ~0.8 s while no call is inside that step: the kill is
			// then repeated, up to chaosKills times, until one is.
			for kill := 1; ; kill++ {
				before, err := adm.Status(bg)
				if err != nil {
					t.Fatal(err)
				}
				ps := pluginState(before, name)
				if ps.State != "running" || !strings.Contains(d.Children()[ps.PID], "virtlet-plugin-"+name) {
					t.Fatalf("plugin %s: %+v; the daemon's children: %v", name, ps, d.Children())
				}
				l := &callLog{}
				stopLoad := runLoad(l)
				time.Sleep(2 * time.Second)
				killed := time.Now()
				if err := syscall.Kill(ps.PID, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				var noticed, back time.Time
				for back.IsZero() {
					if time.Since(killed) > time.Minute {
						stopLoad()
						t.Fatalf("plugin %s not back a minute after SIGKILL", name)
					}
					if st, err := adm.Status(bg); err == nil {
						p := pluginState(st, name)
						switch {
						case p.State != "running" && noticed.IsZero():
							noticed = time.Now()
						case p.State == "running" && p.Restarts == ps.Restarts+1:
							back = time.Now()
						}
					}
					time.Sleep(5 * time.Millisecond)
				}
				// The load runs on for 4 s, and then until a call that
				// needs the plugin, started after it was back, has
				// succeeded: on a slow machine every worker may still be
				// inside a call of several seconds begun before.
				time.Sleep(4 * time.Second)
				harness.EventuallyOK(2*time.Minute, func() bool { return l.succeededSince(name, back) })
				stopLoad()
				row = outage(t, name, l.calls, killed, noticed, back, usual)
				row.kills = kill
				if row.needFailed > 0 {
					return
				}
				if kill == chaosKills {
					t.Errorf("no call that needs plugin %s failed while it was down, in %d kills: the load does not exercise it", name, kill)
					return
				}
				t.Logf("kill %d of plugin %s: no call needing it was inside it; killing it again", kill, name)
			}
		})
		rows = append(rows, row)
	}
	chaosTook := time.Since(chaosStart)

	// The VMs ran through it all, in their QEMU processes.
	for _, v := range vms {
		checkStillRunning(t, c, v.ctr, v.domain, v.pid)
	}

	// Nothing leaks. Slack: a few goroutines come and go with the
	// connections and timers of calls that have just ended (gRPC
	// transports, the plugins' keepalives); one descriptor each way for a
	// socket the daemon is opening or closing at that moment. The children
	// are the plugins: exactly as many.
	const goroutineSlack, fdSlack = 10, 2
	var st1 admin.Status
	var fds1, kids1 int
	var leaks []string
	deadline := time.Now().Add(90 * time.Second)
	for {
		st1, fds1, kids1 = settled()
		leaks = append(snapshotNode(t, d, tn).minus(node0), undoneNever(d)...)
		if (st1.Goroutines <= st0.Goroutines+goroutineSlack && fds1 <= fds0+fdSlack && kids1 == kids0 && len(leaks) == 0) ||
			time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("20 VMs booted in %s; the chaos took %s; the suite %s so far", booted.Round(time.Second), chaosTook.Round(time.Second),
		time.Since(began).Round(time.Second))
	t.Logf("daemon goroutines %d → %d, descriptors %d → %d, child processes %d → %d", st0.Goroutines, st1.Goroutines, fds0, fds1, kids0, kids1)
	t.Logf("usual latencies (p95, every plugin up): %v", usual)
	t.Logf("plugin chaos (50 concurrent CRI calls over %d running VMs):\n%s", chaosVMs, chaosTable(rows))
	if st1.Goroutines > st0.Goroutines+goroutineSlack || fds1 > fds0+fdSlack || kids1 != kids0 {
		t.Errorf("leak after the chaos: goroutines %d → %d, descriptors %d → %d, child processes %d → %d",
			st0.Goroutines, st1.Goroutines, fds0, fds1, kids0, kids1)
	}
	for _, l := range leaks {
		t.Errorf("left after the chaos: %s", l)
	}

	// The pods removed as kubelet removes many: side by side (one by one,
	// each mostly waits: 40 s with the cores idle).
	var sbs []string
	for _, s := range scratches {
		sbs = append(sbs, s.sb)
	}
	for _, v := range vms {
		sbs = append(sbs, v.sb)
	}
	removing := make(chan struct{}, 8)
	var removed sync.WaitGroup
	for _, sb := range sbs {
		removed.Add(1)
		removing <- struct{}{}
		go func() {
			defer removed.Done()
			defer func() { <-removing }()
			c.Run("rmp", "-f", sb)
		}()
	}
	removed.Wait()
	assertNothingLeft(t, d, c)
}

// undoneNever lists the containers whose failed creation could not be
// undone at once (a plugin it needed was down) and has not been undone
// since: their records are hidden from CRI lists, so the log tells.
func undoneNever(d *harness.Daemon) []string {
	pending := map[string]bool{}
	for _, e := range d.LogEntries() {
		id, _ := e["container"].(string)
		switch e["msg"] {
		case "undo VM creation; will retry":
			pending[id] = true
		case "interrupted creation undone":
			delete(pending, id)
		}
	}
	var out []string
	for id := range pending {
		out = append(out, "record of a failed creation: "+id)
	}
	sort.Strings(out)
	return out
}

// outage checks and sums up the calls made around one plugin's outage,
// from its kill to the supervisor reporting it back.
func outage(t *testing.T, plugin string, calls []chaosCall, killed, noticed, back time.Time, usual map[string]time.Duration) chaosRow {
	t.Helper()
	row := chaosRow{plugin: plugin, noticed: noticed.Sub(killed), down: back.Sub(killed), firstOK: -1, firstOKEnd: -1, totalCalls: len(calls)}
	if noticed.IsZero() {
		row.noticed = -1
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].start.Before(calls[j].start) })
	// What each call took in this window's load with every plugin up (it
	// ended before the kill or began after the plugin was back).
	var up []chaosCall
	for _, c := range calls {
		if c.err == nil && (c.end.Before(killed) || !c.start.Before(back)) {
			up = append(up, c)
		}
	}
	loaded := usualLatencies(up)
	var firstOK *chaosCall
	failures := map[string]int{}
	// busy is the longest usual time of a call that needs the plugin: when
	// it is back, a worker may still be that long inside a call it began
	// before, so the first call after it starts that much later.
	var busy time.Duration
	for i := range calls {
		call := &calls[i]
		needs := slices.Contains(call.needs, plugin)
		if needs {
			busy = max(busy, usual[call.name])
		}
		// During the outage: the call ran, at least in part, between the
		// kill and the supervisor's report (calls in flight at the kill
		// count: they are the ones inside the plugin when it died).
		during := call.start.Before(back) && call.end.After(killed)
		switch {
		case call.err != nil && !needs:
			t.Errorf("%s needs no %s plugin and failed (started %s after the kill, took %s): %v",
				call.name, plugin, call.start.Sub(killed).Round(time.Millisecond), call.end.Sub(call.start).Round(time.Millisecond), call.err)
		case call.err != nil && !strings.Contains(call.err.Error(), "plugin "+plugin):
			t.Errorf("%s failed without naming plugin %s (started %s after the kill): %v",
				call.name, plugin, call.start.Sub(killed).Round(time.Millisecond), call.err)
		}
		if call.err != nil {
			failures[call.name]++
		}
		switch {
		case during && needs && call.err != nil:
			row.needFailed++
			// How long the call waited once the plugin was gone.
			latency := call.end.Sub(maxTime(call.start, killed))
			row.maxErrLatency = max(row.maxErrLatency, latency)
			if bound := failBound(call.name, usual, loaded); latency > bound {
				t.Errorf("%s took %s to fail while plugin %s was down (bound %s): %v", call.name, latency.Round(time.Millisecond),
					plugin, bound.Round(time.Millisecond), call.err)
			}
		case during && needs:
			row.needOK++ // it was done with the plugin before the kill, or reached it after the restart
		case during && call.err != nil:
			row.otherFailed++
		case during:
			row.otherOK++
		case needs && !call.start.Before(back):
			if call.err == nil && firstOK == nil {
				firstOK = call
			}
			if call.err != nil {
				row.lateFailed++
				if call.start.Sub(back) > 2*time.Second {
					t.Errorf("%s failed %s after plugin %s was back: %v", call.name, call.start.Sub(back).Round(time.Millisecond), plugin, call.err)
				}
			}
		}
	}
	if firstOK == nil {
		t.Errorf("no call that needs plugin %s succeeded after it was back", plugin)
	} else {
		row.firstOK, row.firstOKEnd = firstOK.start.Sub(back), firstOK.end.Sub(back)
		if bound := 2*time.Second + busy; row.firstOK > bound {
			t.Errorf("the first call that needs plugin %s to succeed started %s after it was back (bound %s: 2 s, and %s that a worker may still spend in a call begun before)",
				plugin, row.firstOK.Round(time.Millisecond), bound.Round(time.Millisecond), busy.Round(time.Millisecond))
		}
	}
	t.Logf("plugin %s: %d calls; failures by call: %v", plugin, len(calls), failures)
	return row
}

// usualLatencies is each call's 95th percentile latency with every plugin
// up.
func usualLatencies(calls []chaosCall) map[string]time.Duration {
	by := map[string][]time.Duration{}
	for _, c := range calls {
		by[c.name] = append(by[c.name], c.end.Sub(c.start))
	}
	out := map[string]time.Duration{}
	for name, ds := range by {
		slices.Sort(ds)
		out[name] = ds[len(ds)*95/100]
	}
	return out
}

// failBound is how long a call may take to fail while a plugin it needs
// is down: two seconds, or twice what the call usually takes when that is
// longer. A CreateContainer on 2 loaded cores records its intent, prepares
// volumes and, failing, undoes them: it takes its usual time plus a
// RemoveContainer's. A RemoveContainer undoes what it can (domain, disks)
// before the missing plugin fails it: one took 1.3 s against a usual
// 0.46 s on 2 busy cores, past the one-second floor this had. Twice:
// "usual" is a 95th percentile of 5 s of warm-up load, which one call in
// twenty passes with every plugin up (a failed CreateContainer once took
// 2.4 s against 1.35 s + 0.66 s here). The warm-up's load is not the
// outage's: ten RemoveContainers of scratch VMs, side by side, failed on
// their volume's release 2.6 s after the kill, all within 30 ms (make
// check on a slow machine; warm-up p95 137 ms): the steps before it
// (domain, disks) had taken that long. So the same call's p95 with every
// plugin up in the outage's own window (loaded) counts too. A call left
// waiting on the plugin would hit its own timeout, 30 s at least.
func failBound(name string, usual, loaded map[string]time.Duration) time.Duration {
	bound := max(usual[name], loaded[name])
	if name == "CreateContainer" {
		bound += max(usual["RemoveContainer"], loaded["RemoveContainer"])
	}
	return max(2*time.Second, 2*bound)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func chaosTable(rows []chaosRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-12s | %-8s | %-8s | %-22s | %-20s | %-13s | %-22s | %s\n", "plugin", "noticed", "down",
		"needing: failed/ok", "others: failed/ok", "max err lat.", "first ok after back", "calls (kills)")
	b.WriteString(strings.Repeat("-", 140) + "\n")
	ms := func(d time.Duration) string {
		if d < 0 {
			return "-"
		}
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	for _, r := range rows {
		fmt.Fprintf(&b, "%-12s | %-8s | %-8s | %-22s | %-20s | %-13s | %-22s | %d (%d)\n", r.plugin, ms(r.noticed), ms(r.down),
			fmt.Sprintf("%d/%d", r.needFailed, r.needOK), fmt.Sprintf("%d/%d", r.otherFailed, r.otherOK), ms(r.maxErrLatency),
			fmt.Sprintf("%s (done %s)", ms(r.firstOK), ms(r.firstOKEnd)), r.totalCalls, r.kills)
	}
	return b.String()
}
