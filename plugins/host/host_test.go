package host_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/plugins/host"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
)

var bins string // directory with the plugin binaries built for the tests

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "virtlet-host-test-")
	if err != nil {
		panic(err)
	}
	bins = dir
	for out, pkg := range map[string]string{
		"virtlet-fake-plugin":     "github.com/virtlet/virtlet/testing/fakeplugin",
		"virtlet-example-scratch": "github.com/virtlet/virtlet/examples/scratch-volume",
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, out), pkg)
		if b, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, b)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func sum(t *testing.T, p string) string {
	t.Helper()
	s, err := manifest.FileSHA256(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// standard returns the manifests of the fake hypervisor and the example
// plugin, by file name.
func standard(t *testing.T) map[string]string {
	fake := filepath.Join(bins, "virtlet-fake-plugin")
	scratch := filepath.Join(bins, "virtlet-example-scratch")
	return map[string]string{
		"10-hypervisor.yaml": fmt.Sprintf("name: fake-hypervisor\nkind: hypervisor\ncommand: %s\nargs: [hypervisor]\nsha256: %s\n", fake, sum(t, fake)),
		"20-scratch.yaml":    fmt.Sprintf("name: scratch\nkind: volume\ncommand: %s\nsha256: %s\nhandles: [scratch]\nconfig: {defaultSize: 1048576}\n", scratch, sum(t, scratch)),
	}
}

// load writes manifest files and loads them as the daemon does.
func load(t *testing.T, files map[string]string) []manifest.Manifest {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ms, err := manifest.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// manifests loads the standard set plus extra files.
func manifests(t *testing.T, extra map[string]string) []manifest.Manifest {
	t.Helper()
	files := standard(t)
	for k, v := range extra {
		files[k] = v
	}
	return load(t, files)
}

func start(t *testing.T, ms []manifest.Manifest, log logrus.FieldLogger) *host.Host {
	t.Helper()
	if log == nil {
		log = quiet()
	}
	h, err := host.Start(context.Background(), ms, host.Options{StateDir: t.TempDir(), Log: log, InitialBackoff: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Shutdown)
	return h
}

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	// A zombie is not alive: read the process state.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

func status(h *host.Host, name string) host.PluginStatus {
	for _, st := range h.Status() {
		if st.Name == name {
			return st
		}
	}
	return host.PluginStatus{}
}

func TestPluginsServeTheirPorts(t *testing.T) {
	h := start(t, manifests(t, nil), nil)
	ctx := context.Background()
	caps, err := h.Hypervisor().Capabilities(ctx)
	if err != nil || caps.Name != "fake" {
		t.Fatalf("capabilities %+v %v", caps, err)
	}
	// The third-party plugin, loaded from its manifest, serves its volume type.
	vol, ok := h.Volumes()["scratch"]
	if !ok {
		t.Fatalf("volumes %v", h.Volumes())
	}
	req := ports.VolumeRequest{VMID: "vm1", Name: "data", Type: "scratch", Options: map[string]string{"size": "2097152"}}
	att, err := vol.Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(att.Disks[0].Source.Path)
	if err != nil || info.Size() != 2<<20 || att.Disks[0].Source.Format != "raw" {
		t.Fatalf("scratch disk %+v %v", info, err)
	}
	if err := vol.Release(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(att.Disks[0].Source.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("scratch disk not removed")
	}
	// Its errors cross the process boundary with their kind and the plugin's name.
	_, err = vol.Prepare(ctx, ports.VolumeRequest{VMID: "../etc", Name: "x", Type: "scratch"})
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "plugin scratch (volume)") || !strings.Contains(err.Error(), "volume vmID") {
		t.Fatalf("invalid request: %v", err)
	}
	for _, st := range h.Status() {
		if st.State != host.Running || !alive(st.PID) || st.Version == "" {
			t.Fatalf("status %+v", st)
		}
	}
	// Each call the daemon makes is counted: three more volume calls are
	// three more calls of the scratch plugin.
	calls := func(name string) uint64 {
		for _, st := range h.Status() {
			if st.Name == name {
				return st.Calls
			}
		}
		return 0
	}
	before := calls("scratch")
	for i := 0; i < 3; i++ {
		vol.Validate(ctx, ports.VolumeRequest{VMID: "vm1", Name: "data", Type: "scratch", Options: map[string]string{"size": "1"}})
	}
	if got := calls("scratch") - before; before == 0 || got != 3 {
		t.Errorf("scratch plugin calls: %d before, %d more after 3 calls", before, got)
	}
	if h.Network() != nil {
		t.Fatal("a network port without a network plugin")
	}
}

func TestKilledPluginIsRestartedAndCallsInTheGapFailFast(t *testing.T) {
	// The plugin is relaunched a whole backoff after its crash: a call that
	// waited for it instead of failing would take that long.
	const backoff = 3 * time.Second
	h, err := host.Start(context.Background(), manifests(t, nil), host.Options{StateDir: t.TempDir(), Log: quiet(), InitialBackoff: backoff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Shutdown)
	ctx := context.Background()
	hv := h.Hypervisor()
	spec := ports.VMSpec{ID: strings.Repeat("c", 64), Name: "vm-c", VCPUs: 1, MemoryBytes: 64 << 20}
	if err := hv.Define(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := hv.Start(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	before := status(h, "fake-hypervisor")
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Calls while the plugin is down fail at once, naming the plugin.
	var gapErr error
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		begin := time.Now()
		_, err := hv.Status(ctx, spec.ID)
		if took := time.Since(begin); err != nil && took > backoff/2 {
			t.Fatalf("call in the gap took %s: it waited for the plugin's relaunch (%s after the crash)", took, backoff)
		}
		if err != nil {
			gapErr = err
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !errors.Is(gapErr, ports.ErrUnavailable) || !strings.Contains(gapErr.Error(), "plugin fake-hypervisor (hypervisor) is unavailable") {
		t.Fatalf("error in the gap: %v", gapErr)
	}
	// It comes back, as a new process, and knows the VM it had.
	var after host.PluginStatus
	deadline = time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if after = status(h, "fake-hypervisor"); after.State == host.Running && after.PID != before.PID {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if after.State != host.Running || after.Restarts != 1 || after.PID == before.PID || !alive(after.PID) {
		t.Fatalf("after restart %+v (before %+v)", after, before)
	}
	st, err := hv.Status(ctx, spec.ID)
	if err != nil || st.State != ports.VMRunning {
		t.Fatalf("VM after plugin restart: %+v %v", st, err)
	}
	if alive(before.PID) {
		t.Fatal("old plugin process still alive")
	}
}

// The plugins' sockets live in the daemon's state directory, one
// directory per process: a dead plugin's goes with it, a shutdown leaves
// none, and what a daemon killed by SIGKILL left is removed at the next
// start.
func TestPluginSocketsStayInTheStateDir(t *testing.T) {
	stateDir := t.TempDir()
	stale := filepath.Join(stateDir, ".sockets", "1234567890")
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "plugin987"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ms := manifests(t, nil)
	h, err := host.Start(context.Background(), ms, host.Options{StateDir: stateDir, Log: quiet(), InitialBackoff: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Shutdown()
	sockets := func() []string {
		found, _ := filepath.Glob(filepath.Join(stateDir, ".sockets", "*", "plugin*"))
		return found
	}
	if got := sockets(); len(got) != len(ms) || slices.Contains(got, filepath.Join(stale, "plugin987")) {
		t.Fatalf("sockets of %d plugins: %v", len(ms), got)
	}
	before := status(h, "fake-hypervisor")
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if after := status(h, "fake-hypervisor"); after.State == host.Running && after.PID != before.PID {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := sockets(); len(got) != len(ms) {
		t.Fatalf("sockets after a plugin's restart: %v", got)
	}
	h.Shutdown()
	if left, _ := os.ReadDir(filepath.Join(stateDir, ".sockets")); len(left) != 0 {
		t.Fatalf("left after shutdown in %s: %v", filepath.Join(stateDir, ".sockets"), left)
	}
	// A state directory made here stays traversable: QEMU opens the
	// hypervisor plugin's files below it.
	fresh := filepath.Join(t.TempDir(), "plugins")
	h2, err := host.Start(context.Background(), ms, host.Options{StateDir: fresh, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	h2.Shutdown()
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o711 {
		t.Fatalf("a new plugins' state directory: %v %v, want mode 0711", fi.Mode(), err)
	}
}

func TestShutdownLeavesNoPluginProcess(t *testing.T) {
	ms := manifests(t, nil)
	h, err := host.Start(context.Background(), ms, host.Options{StateDir: t.TempDir(), Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, st := range h.Status() {
		pids = append(pids, st.PID)
	}
	h.Shutdown()
	for _, pid := range pids {
		if alive(pid) {
			t.Fatalf("plugin process %d survived shutdown", pid)
		}
	}
	_, err = h.Hypervisor().Capabilities(context.Background())
	if !errors.Is(err, ports.ErrUnavailable) || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("call after shutdown: %v", err)
	}
}

func TestBadPluginsStopStartup(t *testing.T) {
	fake := filepath.Join(bins, "virtlet-fake-plugin")
	scratch := filepath.Join(bins, "virtlet-example-scratch")
	notPlugin := filepath.Join(t.TempDir(), "not-a-plugin")
	os.WriteFile(notPlugin, []byte("#!/bin/sh\necho hello\nexit 1\n"), 0o755)
	tests := []struct {
		name  string
		yaml  string
		wants []string
	}{
		{"not a plugin", fmt.Sprintf("name: bogus\nkind: volume\ncommand: %s\nsha256: %s\n", notPlugin, sum(t, notPlugin)),
			[]string{"plugin bogus", "30-bad.yaml", "start " + notPlugin}},
		{"wrong kind", fmt.Sprintf("name: liar\nkind: volume\ncommand: %s\nargs: [image]\nsha256: %s\n", fake, sum(t, fake)),
			[]string{"plugin liar", "does not serve a volume plugin"}},
		{"handles what it cannot", fmt.Sprintf("name: images\nkind: image\ncommand: %s\nargs: [image]\nsha256: %s\nhandles: [https, ftp]\n", fake, sum(t, fake)),
			[]string{"30-bad.yaml", "field handles[1]", `does not handle "ftp"`}},
		{"claims a taken volume type", fmt.Sprintf("name: scratch-two\nkind: volume\ncommand: %s\nsha256: %s\n", scratch, sum(t, scratch)),
			[]string{"field handles[0]", `volume "scratch" is already handled by plugin scratch`}},
		{"config rejected", fmt.Sprintf("name: scratch-cfg\nkind: volume\ncommand: %s\nsha256: %s\nconfig: {defaultSise: 1}\n", scratch, sum(t, scratch)),
			[]string{"plugin scratch-cfg", "30-bad.yaml: field config.defaultSise: no such key (keys: defaultSize)"}},
		{"built against the previous API", fmt.Sprintf("name: old-hypervisor\nkind: hypervisor\ncommand: %s\nargs: [hypervisor-previous-api]\nsha256: %s\n", fake, sum(t, fake)),
			[]string{"plugin old-hypervisor", fmt.Sprintf("%s speaks version %d of the hypervisor plugin API, this daemon version %d: rebuild the plugin against this daemon's plugin SDK",
				fake, base.APIVersions[ports.KindHypervisor]-1, base.APIVersions[ports.KindHypervisor])}},
		{"config of the wrong type", fmt.Sprintf("name: scratch-cfg\nkind: volume\ncommand: %s\nsha256: %s\nconfig: {defaultSize: big}\n", scratch, sum(t, scratch)),
			[]string{"plugin scratch-cfg", "30-bad.yaml: field config.defaultSize: got string, want integer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string]string{"10-hypervisor.yaml": standard(t)["10-hypervisor.yaml"], "30-bad.yaml": tt.yaml}
			if strings.Contains(tt.yaml, "kind: hypervisor") {
				delete(files, "10-hypervisor.yaml") // one hypervisor a node
			}
			if tt.name == "claims a taken volume type" {
				files["20-scratch.yaml"] = standard(t)["20-scratch.yaml"]
			}
			ms := load(t, files)
			_, err := host.Start(context.Background(), ms, host.Options{StateDir: t.TempDir(), Log: quiet(), StartTimeout: 5 * time.Second})
			if err == nil {
				t.Fatal("started")
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestChangedBinaryIsNotRestarted(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "hv")
	data, _ := os.ReadFile(filepath.Join(bins, "virtlet-fake-plugin"))
	os.WriteFile(bin, data, 0o755)
	yaml := fmt.Sprintf("name: fake-hypervisor\nkind: hypervisor\ncommand: %s\nargs: [hypervisor]\nsha256: %s\n", bin, sum(t, bin))
	os.WriteFile(filepath.Join(dir, "hv.yaml"), []byte(yaml), 0o644)
	ms, err := manifest.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, ms, nil)
	pid := status(h, "fake-hypervisor").PID
	// Someone replaces the binary, then the plugin dies.
	os.Remove(bin)
	os.WriteFile(bin, append(data, 0), 0o755)
	syscall.Kill(pid, syscall.SIGKILL)
	var st host.PluginStatus
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if st = status(h, "fake-hypervisor"); strings.Contains(st.LastError, "no longer matches") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.State != host.Restarting || !strings.Contains(st.LastError, "no longer matches the manifest's sha256") {
		t.Fatalf("status %+v", st)
	}
	_, err = h.Hypervisor().Capabilities(context.Background())
	if !errors.Is(err, ports.ErrUnavailable) || !strings.Contains(err.Error(), "no longer matches") {
		t.Fatalf("call: %v", err)
	}
}

func TestPluginLogsReachTheDaemonLog(t *testing.T) {
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	h := start(t, manifests(t, nil), log)
	_, err := h.Volumes()["scratch"].Prepare(context.Background(), ports.VolumeRequest{VMID: "vm9", Name: "logs", Type: "scratch"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range hook.AllEntries() {
			if e.Message == "scratch disk ready" && e.Level == logrus.InfoLevel &&
				e.Data["plugin"] == "scratch" && e.Data["vm"] == "vm9" && e.Data["volume"] == "logs" {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, e := range hook.AllEntries() {
		t.Logf("%s %s %v", e.Level, e.Message, e.Data)
	}
	t.Fatal("the plugin's log line did not reach the daemon's log with its fields")
}

// A plugin process gets PATH and go-plugin's handshake, not the daemon's
// environment (credentials, kubeconfig, proxies).
func TestPluginsDoNotInheritTheDaemonsEnvironment(t *testing.T) {
	t.Setenv("VIRTLET_TEST_DAEMON_SECRET", "s3cret")
	h := start(t, manifests(t, nil), nil)
	pid := status(h, "fake-hypervisor").PID
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	hasPath := false
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "PATH":
			hasPath = true
		case strings.HasPrefix(name, "PLUGIN_") || name == base.Handshake.MagicCookieKey:
		case name == "TMPDIR": // its own (TestPluginsGetAPrivateTMPDIR)
		default:
			t.Errorf("the plugin inherited %s", name)
		}
	}
	if !hasPath {
		t.Errorf("the plugin has no PATH: %q", env)
	}
}

// Each plugin process gets a TMPDIR of its own, in its private state
// directory and emptied at every launch: what a plugin stages there (the
// ISO plugins: cloud-init data, secrets included) stays out of the shared
// /tmp and does not outlive a crash.
func TestPluginsGetAPrivateTMPDIR(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir()) // the daemon's, not inherited
	state := t.TempDir()
	tmp := filepath.Join(state, "fake-hypervisor", "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(tmp, "left-by-a-crash")
	if err := os.WriteFile(leftover, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := host.Start(context.Background(), manifests(t, nil), host.Options{StateDir: state, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Shutdown)
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", status(h, "fake-hypervisor").PID))
	if err != nil {
		t.Fatal(err)
	}
	if env := strings.Split(string(raw), "\x00"); !slices.Contains(env, "TMPDIR="+tmp) {
		t.Fatalf("the plugin's environment %q has no TMPDIR=%s", env, tmp)
	}
	if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file left in the plugin's TMPDIR survived the launch: %v", err)
	}
	if info, err := os.Stat(tmp); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("the plugin's TMPDIR: %v %v", info.Mode(), err)
	}
}

// A plugin that crashes leaves its last words in the daemon's log at the
// default level: the panic at error level, bare stderr lines (printed by
// Go code on os.Stderr, or by C code on descriptor 2) as warnings, each
// with the plugin's name.
func TestPluginCrashOutputReachesTheLog(t *testing.T) {
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.InfoLevel)
	fake := filepath.Join(bins, "virtlet-fake-plugin")
	ms := load(t, map[string]string{
		"10-hypervisor.yaml": fmt.Sprintf("name: buggy-hypervisor\nkind: hypervisor\ncommand: %s\nargs: [hypervisor-panicking]\nsha256: %s\n", fake, sum(t, fake)),
	})
	h := start(t, ms, log)
	ctx := context.Background()
	spec := ports.VMSpec{ID: strings.Repeat("d", 64), Name: "vm-d", VCPUs: 1, MemoryBytes: 64 << 20}
	if err := h.Hypervisor().Define(ctx, spec); err != nil {
		t.Fatal(err)
	}
	var panicked, goStderr, cStderr bool
	// Define's os.Stderr line travels over gRPC from a goroutine of the
	// plugin: it arrives a moment after the call returns, and would be
	// lost if the plugin died first. The crash waits for it.
	seen := func(deadline time.Time, done func() bool) {
		for time.Now().Before(deadline) && !done() {
			for _, e := range hook.AllEntries() {
				if e.Data["plugin"] != "buggy-hypervisor" {
					continue
				}
				panicked = panicked || e.Level == logrus.ErrorLevel && strings.Contains(e.Message, "panic: fake plugin bug in Start")
				goStderr = goStderr || e.Level == logrus.WarnLevel && e.Message == "fake: about to do something unwise"
				cStderr = cStderr || e.Level == logrus.WarnLevel && e.Message == "libfake: warning from C"
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	seen(time.Now().Add(5*time.Second), func() bool { return goStderr })
	if err := h.Hypervisor().Start(ctx, spec.ID); err == nil {
		t.Fatal("Start of the panicking plugin succeeded")
	}
	seen(time.Now().Add(5*time.Second), func() bool { return panicked && goStderr && cStderr })
	if !panicked || !goStderr || !cStderr {
		for _, e := range hook.AllEntries() {
			t.Logf("%s %q %v", e.Level, e.Message, e.Data)
		}
		t.Fatalf("crash output in the log: panic at error level %v; as warnings: os.Stderr line %v, fd 2 line %v", panicked, goStderr, cStderr)
	}
}
