// Package harness runs the real daemon for end-to-end tests: it builds the
// binaries, writes plugin manifests, starts and stops `virtlet` as a
// separate process, and drives it with the real crictl.
package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/plugins/manifest"
)

// Version is stamped into the daemon the harness builds.
const Version = "v0.0.0-harness"

// RepoRoot is the project's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// RunEnv names the id of the test run (testing/check.sh sets it, and
// TMPDIR to RunDir(id), for each make check): every name a run makes on the
// host carries it (its temporary directories, which hold the VMs' disks,
// the daemons' state and the kubelets' directories; its bridges and their
// firewall rules; its CNI networks), so that testing/hostcheck finds what
// a killed run left, by that tag and nothing else.
const RunEnv = "VIRTLET_RUN"

var (
	runOnce sync.Once
	runID   string
)

// RunID is the run's id: six hex digits, RunEnv's, or for a go test of
// its own, one of the process's.
func RunID() string {
	runOnce.Do(func() {
		runID = os.Getenv(RunEnv)
		if !validRunID(runID) {
			var b [3]byte
			rand.Read(b[:])
			runID = hex.EncodeToString(b[:])
		}
	})
	return runID
}

func validRunID(id string) bool {
	if len(id) != 6 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.ToLower(id) == id
}

// RunDir is the temporary directory of the run with this id: TMPDIR of
// each make check, so that every t.TempDir and os.MkdirTemp of its
// tests is below it.
func RunDir(id string) string { return "/tmp/vt-" + id }

// RunBridgePrefix is how the names of a run's test bridges begin
// (NewTestNetwork): "vt", the run's id.
func RunBridgePrefix(id string) string { return "vt" + id }

// CacheDir is where the suites keep what they build or download once per
// content (Debian packages, images, tools), shared by every checkout on the
// machine so that CI's fresh clone reuses an earlier run's: VIRTLET_CACHE,
// or /var/cache/virtlet-build as root, or the user's cache directory. The
// build scripts read the same place (testing/cache.sh).
func CacheDir() string {
	if d := os.Getenv("VIRTLET_CACHE"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/cache/virtlet-build"
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "virtlet-build")
	}
	return filepath.Join(RepoRoot(), ".cache")
}

// Build compiles the daemon and the given extra binaries (name → package)
// into dir, with go build's extra flags (e.g. -race).
func Build(dir string, extra map[string]string, flags ...string) error {
	pkgs := map[string]string{"virtlet": "github.com/virtlet/virtlet/cmd/virtlet"}
	for k, v := range extra {
		pkgs[k] = v
	}
	// Two builds at a time: linking is most of a build whose packages
	// are in go's cache, and it keeps one core busy.
	var g errgroup.Group
	g.SetLimit(2)
	for name, pkg := range pkgs {
		// pacific: go-ceph against Debian 12's Ceph 16 (the ceph plugin).
		// A "-failpoints" binary is the crash tests' (core's failpoints armed).
		tags := "pacific"
		if strings.HasSuffix(name, "-failpoints") {
			tags += ",failpoints"
		}
		// Every binary carries the harness's version, as make stamps
		// the build's: the plugins report it.
		args := append([]string{"build", "-tags", tags, "-o", filepath.Join(dir, name),
			"-ldflags", "-X github.com/virtlet/virtlet/plugins/buildinfo.version=" + Version}, flags...)
		g.Go(func() error {
			cmd := exec.Command("go", append(args, pkg)...)
			cmd.Dir = RepoRoot()
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("build %s: %v\n%s", pkg, err, out)
			}
			return nil
		})
	}
	return g.Wait()
}

// Tool finds a test tool built by testing/tools/build.sh (or named by the
// environment variable env).
func Tool(name, env string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	p := filepath.Join(RepoRoot(), "bin", "tools", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found at %s: run `make tools` (or set %s)", name, p, env)
	}
	return p, nil
}

// ShippedPlugins are the plugin binaries shipped with the daemon, by
// binary name, with their packages (for Build).
var ShippedPlugins = map[string]string{
	"virtlet-plugin-libvirt":     "github.com/virtlet/virtlet/cmd/virtlet-plugin-libvirt",
	"virtlet-plugin-images":      "github.com/virtlet/virtlet/cmd/virtlet-plugin-images",
	"virtlet-plugin-nocloud":     "github.com/virtlet/virtlet/cmd/virtlet-plugin-nocloud",
	"virtlet-plugin-configdrive": "github.com/virtlet/virtlet/cmd/virtlet-plugin-configdrive",
	"virtlet-plugin-cni":         "github.com/virtlet/virtlet/cmd/virtlet-plugin-cni",
	"virtlet-plugin-qcow2":       "github.com/virtlet/virtlet/cmd/virtlet-plugin-qcow2",
	"virtlet-plugin-raw":         "github.com/virtlet/virtlet/cmd/virtlet-plugin-raw",
	"virtlet-plugin-ninep":       "github.com/virtlet/virtlet/cmd/virtlet-plugin-ninep",
	"virtlet-plugin-ceph":        "github.com/virtlet/virtlet/cmd/virtlet-plugin-ceph",
}

// Shipped returns the manifests of the shipped plugins built into dir, as
// the daemon's embedded defaults name them, but for the network plugin: a
// test that runs pods on a network adds TestNetwork.Plugin (its own CNI
// config), the others run pods without a network.
//
// VIRTLET_E2E_POOL=N gives the libvirt plugin a pool of N pre-launched
// domains, so that any real-VM suite can run with VMs claimed from it.
func Shipped(dir string) []Plugin {
	return []Plugin{
		{Name: "libvirt", Kind: "hypervisor", Binary: filepath.Join(dir, "virtlet-plugin-libvirt"), Config: PoolConfig(os.Getenv("VIRTLET_E2E_POOL"))},
		{Name: "images", Kind: "image", Binary: filepath.Join(dir, "virtlet-plugin-images")},
		{Name: "nocloud", Kind: "datasource", Binary: filepath.Join(dir, "virtlet-plugin-nocloud")},
		{Name: "configdrive", Kind: "datasource", Binary: filepath.Join(dir, "virtlet-plugin-configdrive")},
		{Name: "qcow2", Kind: "volume", Binary: filepath.Join(dir, "virtlet-plugin-qcow2")},
		{Name: "raw", Kind: "volume", Binary: filepath.Join(dir, "virtlet-plugin-raw")},
		{Name: "ninep", Kind: "volume", Binary: filepath.Join(dir, "virtlet-plugin-ninep")},
		{Name: "ceph", Kind: "volume", Binary: filepath.Join(dir, "virtlet-plugin-ceph")},
	}
}

// PoolConfig is the libvirt plugin's config for a pool of size
// pre-launched domains ("" or "0": none).
func PoolConfig(size string) string {
	if size == "" || size == "0" {
		return ""
	}
	return "{pool: {size: " + size + "}}"
}

// WithConfig returns plugins with the named one's config set to config.
func WithConfig(plugins []Plugin, name, config string) []Plugin {
	out := append([]Plugin(nil), plugins...)
	for i := range out {
		if out[i].Name == name {
			out[i].Config = config
		}
	}
	return out
}

// Plugin is a plugin the daemon under test runs.
type Plugin struct {
	Name, Kind, Binary string
	Args               []string
	Handles            []string
	Config             string // YAML flow mapping, e.g. "{a: 1}"
}

// Daemon is a virtlet process under test.
type Daemon struct {
	t        testing.TB
	Bin      string // the virtlet binary
	Dir      string // scratch directory: state, manifests, socket, logs
	Socket   string
	StateDir string
	LogFile  string
	// Env is added to the daemon's environment at its next Start.
	Env []string
	// Wrap runs it on a Node (Node.Wrap) at its next Start.
	Wrap []string
	// VMUsers and PoolUsers are the daemon's VM users (--vm-users) and
	// its libvirt plugin's pool users: ranges of their own, so that two
	// daemons of a run never give one user to two VMs (each plugin
	// instance revokes its own users' grants on libvirtd's directories).
	VMUsers, PoolUsers UserRange
	cmd                *exec.Cmd
	exited             chan struct{}
}

// UserRange is a range of host user IDs.
type UserRange struct{ First, Last int }

func (r UserRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// Contains tells whether uid is in the range.
func (r UserRange) Contains(uid int) bool { return uid >= r.First && uid <= r.Last }

var daemonSeq atomic.Int64

// TestUsers holds every range userRanges hands out: only test daemons'
// VMs run as these users (hostcheck removes their leftover grants).
var TestUsers = UserRange{First: 2000200000, Last: 2000200000 + 64000*2000 - 1}

// UserRanges gives a daemon (or a plugin a test runs alone) of this
// process its VM and pool users: 1000 each, from the process ID and a
// counter, above the daemon's and the pool's default ranges, so that what
// one revokes at its end is no other's.
func UserRanges() (vm, pool UserRange) {
	slot := (os.Getpid()%1000)*64 + int(daemonSeq.Add(1)%64)
	first := 2000200000 + slot*2000
	return UserRange{first, first + 999}, UserRange{first + 1000, first + 1999}
}

// WithPoolUsers sets pool.users in a libvirt plugin config that has a
// pool and names none.
func WithPoolUsers(config string, users UserRange) (string, error) {
	if config == "" {
		return "", nil
	}
	var m map[string]interface{}
	if err := yaml.Unmarshal([]byte(config), &m); err != nil {
		return "", fmt.Errorf("libvirt plugin config %q: %w", config, err)
	}
	pool, ok := m["pool"].(map[string]interface{})
	if !ok {
		return config, nil
	}
	if _, set := pool["users"]; !set {
		pool["users"] = users.String()
	}
	out, err := json.Marshal(m)
	return string(out), err
}

// NewDaemon prepares a daemon with the given plugins (manifests written to
// Dir/plugins.d with their real checksums).
func NewDaemon(t testing.TB, bin string, plugins []Plugin) *Daemon {
	t.Helper()
	// QEMU runs as its own user and must reach the disks below; mounts
	// the daemon's plugins and the flexvolume driver made below it go
	// with it (VMDir).
	dir := VMDir(t)
	d := &Daemon{t: t, Bin: bin, Dir: dir, Socket: filepath.Join(dir, "virtlet.sock"),
		StateDir: filepath.Join(dir, "state"), LogFile: filepath.Join(dir, "virtlet.log")}
	d.VMUsers, d.PoolUsers = UserRanges()
	// After its domains go (CleanupDomains, registered by VMDir), what
	// its VM users were granted on libvirtd's directories goes too: a
	// daemon killed with VMs running leaves it, as its plugin would
	// remove at its next start.
	t.Cleanup(func() { RevokeUsers(d.VMUsers, d.PoolUsers) })
	mdir := filepath.Join(dir, "plugins.d")
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(d.KubeDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, p := range plugins {
		sum, err := manifest.FileSHA256(p.Binary)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "name: %s\nkind: %s\ncommand: %s\nsha256: %s\n", p.Name, p.Kind, p.Binary, sum)
		if len(p.Args) > 0 {
			fmt.Fprintf(&b, "args: [%s]\n", strings.Join(p.Args, ", "))
		}
		if len(p.Handles) > 0 {
			fmt.Fprintf(&b, "handles: [%s]\n", strings.Join(p.Handles, ", "))
		}
		config := p.Config
		if p.Name == "libvirt" {
			if config, err = WithPoolUsers(config, d.PoolUsers); err != nil {
				t.Fatal(err)
			}
		}
		if config != "" {
			fmt.Fprintf(&b, "config: %s\n", config)
		}
		if err := os.WriteFile(filepath.Join(mdir, fmt.Sprintf("%02d-%s.yaml", i, p.Name)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(d.Kill)
	t.Cleanup(func() {
		if log := d.Log(); strings.Contains(log, "pool of pre-launched domains on") {
			t.Logf("libvirt plugin's pool: %d VMs claimed pool domains, %d started cold", strings.Count(log, "VM claimed a pool domain"),
				strings.Count(log, "cold start: "))
		}
	})
	return d
}

// Start runs the daemon and waits until its socket answers.
func (d *Daemon) Start(extraArgs ...string) {
	d.t.Helper()
	logf, err := os.OpenFile(d.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		d.t.Fatal(err)
	}
	args := []string{"--listen", "unix://" + d.Socket, "--admin-socket", d.AdminSocket(), "--state-dir", d.StateDir,
		"--plugins-dir", filepath.Join(d.Dir, "plugins.d"), "--image-translations-dir", d.TranslationsDir(),
		"--log-format", "json", "--log-level", "debug"}
	// ConfigMaps and Secrets come from manifests unless the test names an
	// API server.
	if !slices.Contains(extraArgs, "--kubeconfig") {
		args = append(args, "--kube-objects-dir", d.KubeDir())
	}
	if !slices.Contains(extraArgs, "--vm-users") {
		args = append(args, "--vm-users", d.VMUsers.String())
	}
	args = append(args, extraArgs...)
	argv := append(append(append([]string(nil), d.Wrap...), d.Bin), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(d.Env) > 0 {
		cmd.Env = append(os.Environ(), d.Env...)
	}
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.cmd = cmd
	d.exited = make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(d.exited)
	}()
	// The daemon listens once its plugins are up, each allowed a minute.
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", d.Socket); err == nil {
			c.Close()
			return
		}
		select {
		case <-d.exited:
			d.t.Fatalf("virtlet exited during start-up:\n%s", d.Log())
		case <-time.After(50 * time.Millisecond):
		}
	}
	d.t.Fatalf("virtlet did not open %s:\n%s", d.Socket, d.Log())
}

// AdminSocket is where the daemon serves its admin API.
func (d *Daemon) AdminSocket() string { return filepath.Join(d.Dir, "admin.sock") }

// KubeDir is where the daemon reads ConfigMap and Secret manifests.
func (d *Daemon) KubeDir() string { return filepath.Join(d.Dir, "kube") }

// KubeObjects writes manifests (YAML documents) for the daemon to read.
func (d *Daemon) KubeObjects(name, manifests string) {
	d.t.Helper()
	if err := os.WriteFile(filepath.Join(d.KubeDir(), name), []byte(manifests), 0o600); err != nil {
		d.t.Fatal(err)
	}
}

// ProjectedVolume lays out files as kubelet's atomic writer does for a
// ConfigMap or Secret volume ("configmap", "secret"), with mode, and
// returns the host path kubelet would mount.
func (d *Daemon) ProjectedVolume(kind, name string, files map[string]string, mode os.FileMode) string {
	d.t.Helper()
	dir := filepath.Join(d.Dir, "kubelet", "pods", "uid", "volumes", "kubernetes.io~"+kind, name)
	data := filepath.Join(dir, "..2026_11_22_00_00_00.000000001")
	if err := os.MkdirAll(data, 0o755); err != nil {
		d.t.Fatal(err)
	}
	for n, v := range files {
		p := filepath.Join(data, n)
		if err := os.WriteFile(p, []byte(v), mode); err != nil {
			d.t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			d.t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", n), filepath.Join(dir, n)); err != nil {
			d.t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		d.t.Fatal(err)
	}
	return dir
}

// TranslationsDir is the daemon's image translations directory.
func (d *Daemon) TranslationsDir() string { return filepath.Join(d.Dir, "images.d") }

// Translate writes an image translation file for the daemon.
func (d *Daemon) Translate(name, yaml string) {
	d.t.Helper()
	if err := os.MkdirAll(d.TranslationsDir(), 0o755); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.TranslationsDir(), name), []byte(yaml), 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// PID is the daemon's process ID.
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Stop sends SIGTERM and waits for the daemon to exit.
func (d *Daemon) Stop() {
	d.t.Helper()
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.t.Fatalf("virtlet did not stop on SIGTERM:\n%s", d.Log())
	}
	d.cmd = nil
}

// Kill sends SIGKILL (a crash) and waits for the process to go.
func (d *Daemon) Kill() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Kill()
	<-d.exited
	d.cmd = nil
}

// Exited tells whether the daemon exits within wait (it may kill itself
// at a failpoint); it then forgets the process.
func (d *Daemon) Exited(wait time.Duration) bool {
	if d.cmd == nil {
		return true
	}
	select {
	case <-d.exited:
		d.cmd = nil
		return true
	case <-time.After(wait):
		return false
	}
}

// DumpGoroutines makes the daemon print every goroutine's stack and exit
// (SIGQUIT), and returns what it printed: the evidence of a deadlock.
func (d *Daemon) DumpGoroutines() string {
	if d.cmd == nil {
		return ""
	}
	before := len(d.Log())
	d.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
	}
	d.cmd = nil
	log := d.Log()
	if len(log) < before {
		return log
	}
	return log[before:]
}

// Log returns the daemon's log so far.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(d.LogFile)
	return string(b)
}

// LogEntries returns the daemon's JSON log lines.
func (d *Daemon) LogEntries() []map[string]interface{} { return LogEntries(d.Log()) }

// LogEntries returns the JSON lines of a log (logrus's JSON formatter).
func LogEntries(log string) []map[string]interface{} {
	var out []map[string]interface{}
	for _, line := range strings.Split(log, "\n") {
		var m map[string]interface{}
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// PoolLaunches are the pool domains whose launch a libvirt plugin's JSON
// log reports: each ready for a claim.
func PoolLaunches(log string) map[string]bool {
	launched := map[string]bool{}
	for _, e := range LogEntries(log) {
		if name, ok := e["domain"].(string); ok && e["msg"] == "pool: domain launched paused" {
			launched[name] = true
		}
	}
	return launched
}

// Children returns the daemon's child processes (its plugins): pid → cmdline.
func (d *Daemon) Children() map[int]string {
	return ChildrenOf(d.PID())
}

// ChildrenOf lists the live child processes of pid.
func ChildrenOf(pid int) map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command name (which may hold spaces): state ppid ...
		s := string(stat)
		rest := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(rest) < 2 || rest[0] == "Z" || rest[1] != strconv.Itoa(pid) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out[child] = strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return out
}

// Alive reports whether pid is a live (non-zombie) process.
func Alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	rest := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(rest) > 0 && rest[0] != "Z"
}

// Crictl runs the real crictl against a daemon.
type Crictl struct {
	Bin      string
	Endpoint string
	Timeout  time.Duration
	// Wrap runs it on a Node (Node.Wrap): exec, attach and port-forward
	// reach the daemon's loopback streaming server there.
	Wrap []string
}

// Crictl returns a crictl bound to the daemon's socket.
func (d *Daemon) Crictl(bin string) *Crictl {
	return &Crictl{Bin: bin, Endpoint: "unix://" + d.Socket, Timeout: 60 * time.Second}
}

// Run runs crictl with args and returns stdout, stderr and the error.
func (c *Crictl) Run(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout+10*time.Second)
	defer cancel()
	full := append([]string{"--config", "/dev/null", "--runtime-endpoint", c.Endpoint, "--image-endpoint", c.Endpoint,
		"--timeout", c.Timeout.String()}, args...)
	argv := append(append(append([]string(nil), c.Wrap...), c.Bin), full...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// Must runs crictl and fails the test if it fails; it returns stdout.
func (c *Crictl) Must(t testing.TB, args ...string) string {
	t.Helper()
	out, errOut, err := c.Run(args...)
	if err != nil {
		t.Fatalf("crictl %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return strings.TrimSpace(out)
}

// JSON runs crictl and decodes its JSON output.
func (c *Crictl) JSON(t testing.TB, v interface{}, args ...string) {
	t.Helper()
	out := c.Must(t, args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("crictl %s: decode %q: %v", strings.Join(args, " "), out, err)
	}
}

// WriteJSON writes v as JSON to a file in dir and returns its path.
func WriteJSON(t testing.TB, dir, name string, v interface{}) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Eventually polls cond until it holds or the timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !EventuallyOK(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// EventuallyOK polls cond until it holds (true) or timeout passes (false),
// for callers that say themselves what went wrong.
func EventuallyOK(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return cond()
}

// Screen collects what a process prints, safe for concurrent use.
type Screen struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
