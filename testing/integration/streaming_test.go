package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/harness"
)

// runningFakeVM makes a VM pod with a running fake VM.
func runningFakeVM(t *testing.T, d *harness.Daemon, c *harness.Crictl, name string) (sb, ctr string) {
	t.Helper()
	pod, ctrCfg := vmPod(t, d, name, nil)
	c.Must(t, "pull", image)
	sb = c.Must(t, "runp", pod)
	ctr = c.Must(t, "create", sb, ctrCfg, pod)
	c.Must(t, "start", ctr)
	return sb, ctr
}

// streamExec runs cmd through the CRI streaming server as kubelet would:
// Exec for a URL, then the stream (SPDY).
func streamExec(t *testing.T, rt runtimeapi.RuntimeServiceClient, ctr string, cmd []string, stdin io.Reader, stdout, stderr io.Writer) error {
	t.Helper()
	resp, err := rt.Exec(context.Background(), &runtimeapi.ExecRequest{ContainerId: ctr, Cmd: cmd,
		Stdin: stdin != nil, Stdout: stdout != nil, Stderr: stderr != nil})
	if err != nil {
		return err
	}
	return streamURL(resp.Url, stdin, stdout, stderr)
}

func streamURL(raw string, stdin io.Reader, stdout, stderr io.Writer) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	ex, err := remotecommand.NewSPDYExecutor(&rest.Config{}, http.MethodPost, u)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}

// Exec and ExecSync through crictl (SPDY and WebSocket) reach the fake
// guest agent: argv, exit code, stdout and stderr apart, stdin, the
// timeout; bad input is refused with the reason.
func TestExecThroughCrictl(t *testing.T) {
	d, c := startDaemon(t)
	_, ctr := runningFakeVM(t, d, c, "exec-vm")

	// crictl exec streams (SPDY; kubelet's streaming library speaks
	// WebSocket only up to protocol v4, and crictl's WebSocket transport
	// asks for v5); crictl exec -s calls ExecSync.
	out, errOut, err := c.Run("exec", ctr, "hostname")
	if err != nil || out != "exec-vm\n" {
		t.Fatalf("hostname: %q %q %v", out, errOut, err)
	}
	out, errOut, err = c.Run("exec", ctr, "sh", "-c", "echo oops >&2")
	if err != nil || out != "" || errOut != "oops\n" {
		t.Fatalf("stderr apart: stdout %q stderr %q %v", out, errOut, err)
	}
	_, errOut, err = c.Run("exec", ctr, "sh", "-c", "exit 3")
	if err == nil || !strings.Contains(errOut, "command terminated with exit code 3") {
		t.Fatalf("exit 3: crictl ended with %v %s", err, errOut)
	}
	out, errOut, err = c.Run("exec", "-s", ctr, "hostname")
	if err != nil || strings.TrimSpace(out) != "exec-vm" {
		t.Fatalf("exec -s hostname: %q %q %v", out, errOut, err)
	}
	_, errOut, err = c.Run("exec", "-s", ctr, "sh", "-c", "exit 3")
	if err == nil || !strings.Contains(errOut, "exited with 3") {
		t.Fatalf("exec -s exit 3: crictl ended with %v %s", err, errOut)
	}
	rt, _ := d.CRI(t)
	res, err := rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"sh", "-c", "echo oops >&2"}})
	if err != nil || len(res.Stdout) != 0 || string(res.Stderr) != "oops\n" || res.ExitCode != 0 {
		t.Fatalf("ExecSync stderr apart: %+v %v", res, err)
	}
	cmd := exec.Command(c.Bin, "--config", "/dev/null", "--runtime-endpoint", c.Endpoint, "exec", "-i", ctr, "cat")
	cmd.Stdin = strings.NewReader("typed into stdin\n")
	if out, err := cmd.Output(); err != nil || string(out) != "typed into stdin\n" {
		t.Fatalf("exec -i cat: %q %v", out, err)
	}
	// The timeout ends the exec, not the command: its time is the timeout
	// plus what an exec (of hostname) takes in this run, far from the
	// command's 60 s.
	start := time.Now()
	if _, errOut, err := c.Run("exec", "-s", ctr, "hostname"); err != nil {
		t.Fatalf("exec -s hostname: %v %s", err, errOut)
	}
	usual := time.Since(start)
	start = time.Now()
	_, errOut, err = c.Run("exec", "-s", "--timeout", "1", ctr, "sleep", "60")
	if took := time.Since(start); err == nil || !strings.Contains(errOut, "did not finish within 1s") || !strings.Contains(errOut, "DeadlineExceeded") || took > time.Second+3*usual+2*time.Second {
		t.Fatalf("sleep 60 with a 1 s timeout: after %s (an exec takes %s): %v %s", took, usual, err, errOut)
	}
	_, errOut, err = c.Run("exec", "-it", ctr, "sh")
	if err == nil || !strings.Contains(errOut, "virtletctl ssh") {
		t.Fatalf("exec -it: %v %s", err, errOut)
	}
	_, err = rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: ctr})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "cmd: the command is empty") {
		t.Fatalf("empty command: %v", err)
	}
	c.Must(t, "stop", ctr)
	_, errOut, err = c.Run("exec", "-s", ctr, "hostname")
	if err == nil || !strings.Contains(errOut, "not running") {
		t.Fatalf("exec in a stopped VM: %v %s", err, errOut)
	}
}

// A guest without an agent: a clear error at once.
func TestExecWithoutGuestAgent(t *testing.T) {
	fake := filepath.Join(bins, "virtlet-fake-plugin")
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), []harness.Plugin{
		{Name: "fake-hypervisor", Kind: "hypervisor", Binary: fake, Args: []string{"hypervisor"}, Config: "{noAgent: true}"},
		{Name: "fake-images", Kind: "image", Binary: fake, Args: []string{"image"}},
		{Name: "nocloud", Kind: "datasource", Binary: filepath.Join(bins, "virtlet-plugin-nocloud")},
	})
	d.Start()
	c := d.Crictl(crictl)
	_, ctr := runningFakeVM(t, d, c, "no-agent")
	// The answer comes long before the exec's timeout: nothing waits for
	// an agent (a loose bound, so that a loaded machine passes).
	start := time.Now()
	_, errOut, err := c.Run("exec", "-s", "--timeout", "120", ctr, "hostname")
	if err == nil || !strings.Contains(errOut, fakehypervisor.NoAgentError) || !strings.Contains(errOut, "FailedPrecondition") || time.Since(start) > 30*time.Second {
		t.Fatalf("no agent: after %s: %v %s", time.Since(start), err, errOut)
	}
}

// Streaming URLs are single-use, as kubelet's.
func TestStreamingURLIsSingleUse(t *testing.T) {
	d, c := startDaemon(t)
	_, ctr := runningFakeVM(t, d, c, "url-vm")
	rt, _ := d.CRI(t)
	resp, err := rt.Exec(context.Background(), &runtimeapi.ExecRequest{ContainerId: ctr, Cmd: []string{"hostname"}, Stdout: true})
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := url.Parse(resp.Url); !strings.HasPrefix(u.Host, "127.0.0.1:") {
		t.Fatalf("streaming URL %s is not on loopback", resp.Url)
	}
	var out bytes.Buffer
	if err := streamURL(resp.Url, nil, &out, nil); err != nil || out.String() != "url-vm\n" {
		t.Fatalf("first use: %q %v", out.String(), err)
	}
	err = streamURL(resp.Url, nil, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("second use of %s: %v, want 404", resp.Url, err)
	}
}

// Attach through crictl: two viewers share the console, Ctrl-] detaches
// one and the VM keeps running; a stopped VM is refused.
func TestAttachThroughCrictl(t *testing.T) {
	d, c := startDaemon(t)
	_, ctr := runningFakeVM(t, d, c, "attach-vm")
	type viewer struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *harness.Screen
	}
	attach := func() viewer {
		cmd := exec.Command(c.Bin, "--config", "/dev/null", "--runtime-endpoint", c.Endpoint, "attach", "-i", ctr)
		in, _ := cmd.StdinPipe()
		out := &harness.Screen{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return viewer{cmd, in, out}
	}
	one := attach()
	two := attach()
	// Both attached once each sees its own typing echoed.
	for i, v := range []viewer{one, two} {
		harness.Eventually(t, 20*time.Second, "viewer attached", func() bool {
			io.WriteString(v.in, "x")
			return strings.Contains(v.out.String(), "x")
		})
		_ = i
	}
	io.WriteString(one.in, "\rhello console\r")
	for _, v := range []viewer{one, two} {
		harness.Eventually(t, 10*time.Second, "both viewers see the answer", func() bool {
			return strings.Contains(v.out.String(), "fake-vm: you typed hello console")
		})
	}
	io.WriteString(one.in, "\x1d")
	done := make(chan error, 1)
	go func() { done <- one.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("crictl attach after Ctrl-]: %v\n%s", err, one.out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Ctrl-] did not end crictl attach")
	}
	var st containerInspect
	c.JSON(t, &st, "inspect", ctr)
	if st.Status.State != "CONTAINER_RUNNING" {
		t.Fatalf("the VM is %s after a detach", st.Status.State)
	}
	io.WriteString(two.in, "\rstill here\r")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(two.out.String(), "fake-vm: you typed still here") {
		if time.Now().After(deadline) {
			t.Fatalf("the other viewer no longer works:\n%s", two.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.Must(t, "stop", ctr)
	_, errOut, err := c.Run("attach", ctr)
	if err == nil || !strings.Contains(errOut, "not running") || !strings.Contains(errOut, "FailedPrecondition") {
		t.Fatalf("attach to a stopped VM: %v %s", err, errOut)
	}
}

// crictl stats and statsp show the fake VM's usage; the pod without a
// network has no port to forward to.
func TestStatsAndPortForwardRefusals(t *testing.T) {
	d, c := startDaemon(t)
	sb, ctr := runningFakeVM(t, d, c, "stats-vm")
	var stats struct {
		Stats []struct {
			Attributes struct{ ID string } `json:"attributes"`
			CPU        struct {
				UsageCoreNanoSeconds struct{ Value string } `json:"usageCoreNanoSeconds"`
			} `json:"cpu"`
			Memory struct {
				WorkingSetBytes struct{ Value string } `json:"workingSetBytes"`
			} `json:"memory"`
		} `json:"stats"`
	}
	time.Sleep(50 * time.Millisecond) // the fake's CPU time grows with uptime
	c.JSON(t, &stats, "stats", "-o", "json")
	if len(stats.Stats) != 1 || stats.Stats[0].Attributes.ID != ctr || stats.Stats[0].CPU.UsageCoreNanoSeconds.Value == "" ||
		stats.Stats[0].CPU.UsageCoreNanoSeconds.Value == "0" || stats.Stats[0].Memory.WorkingSetBytes.Value == "" {
		t.Fatalf("crictl stats: %+v", stats)
	}
	out := c.Must(t, "statsp", "-o", "json")
	if !strings.Contains(out, sb) || !strings.Contains(out, `"workingSetBytes"`) {
		t.Fatalf("crictl statsp: %s", out)
	}
	_, errOut, err := c.Run("port-forward", sb, "0:22")
	if err == nil || !strings.Contains(errOut, "no IP address") {
		t.Fatalf("port-forward to a pod without a network: %v %s", err, errOut)
	}
}

// Virtlet's own commands (virtletctl's) over exec streams.
func TestVirtletctlCommandsOverExec(t *testing.T) {
	d, c := startDaemon(t)
	_, ctr := runningFakeVM(t, d, c, "tools-vm")
	runningFakeVM(t, d, c, "other-vm") // its plugin log lines are not tools-vm's diag's
	rt, _ := d.CRI(t)
	var out, errOut bytes.Buffer
	if err := streamExec(t, rt, ctr, []string{vmtools.Version}, nil, &out, nil); err != nil || !strings.Contains(out.String(), harness.Version) {
		t.Fatalf("version: %q %v", out.String(), err)
	}
	out.Reset()
	if err := streamExec(t, rt, ctr, []string{vmtools.Virsh, "dominfo"}, nil, &out, &errOut); err != nil || !strings.Contains(out.String(), "Name: virtlet-") {
		t.Fatalf("virsh dominfo: %q %q %v", out.String(), errOut.String(), err)
	}
	err := streamExec(t, rt, ctr, []string{vmtools.Virsh, "destroy"}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `command: invalid value "destroy"`) {
		t.Fatalf("virsh destroy: %v", err)
	}
	out.Reset()
	if err := streamExec(t, rt, ctr, []string{vmtools.Diag}, nil, &out, nil); err != nil {
		t.Fatalf("diag: %v", err)
	}
	var diag vmtools.Diagnostics
	if err := json.Unmarshal(out.Bytes(), &diag); err != nil {
		t.Fatalf("diag is not JSON: %v\n%s", err, out.String())
	}
	if diag.Version != harness.Version || len(diag.VMs) != 1 || !bytes.Contains(diag.Records, []byte(ctr)) ||
		!bytes.Contains(diag.Plugins, []byte("fake-hypervisor")) {
		t.Fatalf("diag: %+v", diag)
	}
	// The plugin log lines are this pod's VM's, and no other pod's.
	started := 0
	for _, l := range diag.PluginLogs {
		vm := l.Fields["vm"]
		if !strings.HasSuffix(vm, "-tools-vm") {
			t.Errorf("diag of tools-vm shows a line about another VM or none: %+v", l)
		}
		if l.Message == "fake VM started" {
			started++
		}
	}
	if started != 1 {
		t.Errorf("diag shows %d lines about the VM's start, want 1: %+v", started, diag.PluginLogs)
	}
	// VNC: the exec's stdin and stdout are the display's connection.
	pr, pw := io.Pipe()
	out.Reset()
	vnc := make(chan error, 1)
	sync := &harness.Screen{}
	go func() { vnc <- streamExec(t, rt, ctr, []string{vmtools.VNC}, pr, sync, nil) }()
	harness.Eventually(t, 10*time.Second, "the RFB banner", func() bool { return strings.Contains(sync.String(), fakehypervisor.FakeRFBBanner) })
	io.WriteString(pw, "client hello")
	harness.Eventually(t, 10*time.Second, "the display's echo", func() bool { return strings.Contains(sync.String(), "client hello") })
	pw.Close()
	select {
	case err := <-vnc:
		if err != nil {
			t.Fatalf("vnc: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the VNC exec did not end when its client closed")
	}
	if _, err := os.Stat(d.LogFile); err != nil {
		t.Fatal(err)
	}
}

// goroutines reads the daemon's goroutine count from crictl info.
func goroutines(t *testing.T, c *harness.Crictl) int {
	t.Helper()
	var info struct {
		Goroutines int `json:"goroutines,string"` // crictl prints verbose values that are not objects as strings
	}
	c.JSON(t, &info, "info")
	if info.Goroutines == 0 {
		t.Fatal("crictl info reports no goroutine count")
	}
	return info.Goroutines
}

func fds(pid int) int {
	entries, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	return len(entries)
}

// 1,000 ExecSync calls and 200 exec streams leave no goroutine and no
// file descriptor behind, in the daemon or in the hypervisor plugin.
func TestExecLeaksNothing(t *testing.T) {
	d, c := startDaemon(t)
	_, ctr := runningFakeVM(t, d, c, "leak-vm")
	rt, _ := d.CRI(t)
	plugin := pluginPID(t, d, "hypervisor")
	run := func(syncCalls, streams int) {
		for i := 0; i < syncCalls; i++ {
			res, err := rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"echo", strconv.Itoa(i)}, Timeout: 5})
			if err != nil || string(res.Stdout) != strconv.Itoa(i)+"\n" {
				t.Fatalf("ExecSync %d: %+v %v", i, res, err)
			}
		}
		for i := 0; i < streams; i++ {
			var out bytes.Buffer
			if err := streamExec(t, rt, ctr, []string{"hostname"}, nil, &out, io.Discard); err != nil || out.String() != "leak-vm\n" {
				t.Fatalf("exec stream %d: %q %v", i, out.String(), err)
			}
		}
	}
	run(20, 20) // warm up pools and caches
	time.Sleep(time.Second)
	g0, f0, p0 := goroutines(t, c), fds(d.PID()), fds(plugin)
	run(1000, 200)
	// Closed streams wind down asynchronously.
	var g1, f1, p1 int
	deadline := time.Now().Add(15 * time.Second)
	for {
		g1, f1, p1 = goroutines(t, c), fds(d.PID()), fds(plugin)
		if (g1 <= g0+5 && f1 <= f0+2 && p1 <= p0+2) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("daemon goroutines %d → %d, fds %d → %d; plugin fds %d → %d", g0, g1, f0, f1, p0, p1)
	if g1 > g0+5 || f1 > f0+2 || p1 > p0+2 {
		t.Fatalf("leak after 1,000 ExecSync and 200 exec streams: goroutines %d → %d, daemon fds %d → %d, plugin fds %d → %d", g0, g1, f0, f1, p0, p1)
	}
}

// vmDetails reads the hypervisor's details of the pod's VM through
// virtletctl's diag command.
func vmDetails(t *testing.T, rt runtimeapi.RuntimeServiceClient, ctr string) map[string]string {
	t.Helper()
	var out bytes.Buffer
	if err := streamExec(t, rt, ctr, []string{vmtools.Diag}, nil, &out, nil); err != nil {
		t.Fatalf("diag: %v", err)
	}
	var diag vmtools.Diagnostics
	if err := json.Unmarshal(out.Bytes(), &diag); err != nil {
		t.Fatalf("diag is not JSON: %v", err)
	}
	return diag.VMs[ctr].Details
}

// waitDetail waits until the VM's detail key has the value want.
func waitDetail(t *testing.T, rt runtimeapi.RuntimeServiceClient, ctr, key, want string, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := vmDetails(t, rt, ctr)[key]
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s is %q after %s, want %q", what, key, got, within, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A client that goes away in the middle of a stream ends the session on
// the daemon's side at once: the guest command is killed, the viewer
// leaves the console (a viewer whose input merely ended keeps watching).
// The session's context is the HTTP request's; the streaming server also
// ends it when the hijacked connection goes.
func TestStreamingSessionsEndWithTheirClient(t *testing.T) {
	d, c := startDaemon(t)
	_, ctr := runningFakeVM(t, d, c, "gone-vm")
	rt, _ := d.CRI(t)

	t.Run("exec", func(t *testing.T) {
		cmd := exec.Command(c.Bin, "--config", "/dev/null", "--runtime-endpoint", c.Endpoint, "exec", ctr, "sleep", "60")
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitDetail(t, rt, ctr, "guestProcesses", "1", 10*time.Second, "sleep 60 running")
		cmd.Process.Kill() // the client vanishes (kubectl exec and Ctrl-C)
		cmd.Wait()
		start := time.Now()
		// Well before the command's own 60 s.
		waitDetail(t, rt, ctr, "guestProcesses", "0", 20*time.Second, "after the client left")
		t.Logf("the guest command ended %s after its client left", time.Since(start).Round(time.Millisecond))
	})

	t.Run("attach", func(t *testing.T) {
		cmd := exec.Command(c.Bin, "--config", "/dev/null", "--runtime-endpoint", c.Endpoint, "attach", "-i", ctr)
		in, _ := cmd.StdinPipe()
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitDetail(t, rt, ctr, "consoleViewers", "1", 10*time.Second, "crictl attached")
		// Its input ends (a pipe, without a terminal): it keeps watching
		// the console's output, as kubectl attach -i does.
		in.Close()
		time.Sleep(time.Second)
		if n := vmDetails(t, rt, ctr)["consoleViewers"]; n != "1" {
			t.Fatalf("a viewer whose input ended (no terminal) stopped watching: %s viewers", n)
		}
		cmd.Process.Kill() // then the client vanishes
		cmd.Wait()
		waitDetail(t, rt, ctr, "consoleViewers", "0", 20*time.Second, "after the attached client was killed")
	})
}

// virtletctl stop, start and restart over exec streams: the container
// stays running for kubelet (crictl), its status says the VM is halted,
// the guest cannot be reached meanwhile, and start boots the same VM.
func TestPowerCommandsOverExec(t *testing.T) {
	d, c := startDaemon(t)
	_, ctr := runningFakeVM(t, d, c, "power-vm")
	rt, _ := d.CRI(t)
	var out bytes.Buffer
	if err := streamExec(t, rt, ctr, []string{vmtools.Stop, "0"}, nil, &out, nil); err != nil || !strings.Contains(out.String(), "halted") {
		t.Fatalf("stop: %q %v", out.String(), err)
	}
	var inspect struct {
		Status struct {
			State, Reason, Message string
		} `json:"status"`
	}
	c.JSON(t, &inspect, "inspect", ctr)
	if inspect.Status.State != "CONTAINER_RUNNING" || inspect.Status.Reason != "Halted" || !strings.Contains(inspect.Status.Message, "virtletctl start power-vm") {
		t.Fatalf("crictl inspect of a halted VM's container: %+v", inspect.Status)
	}
	if _, errOut, err := c.Run("exec", "-s", ctr, "hostname"); err == nil || !strings.Contains(errOut, "halted") || !strings.Contains(errOut, "exited with 126") {
		t.Fatalf("exec in a halted VM: %v %s", err, errOut)
	}
	out.Reset()
	if err := streamExec(t, rt, ctr, []string{vmtools.Status}, nil, &out, nil); err != nil {
		t.Fatal(err)
	}
	var st vmtools.VMStatus
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || st.State != "halted" || st.HaltedAt.IsZero() {
		t.Fatalf("status of a halted VM: %+v %v", st, err)
	}
	err := streamExec(t, rt, ctr, []string{vmtools.Stop, "soon"}, nil, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), `grace period: invalid value "soon"`) {
		t.Fatalf("stop with a bad grace period: %v", err)
	}
	out.Reset()
	if err := streamExec(t, rt, ctr, []string{vmtools.Start}, nil, &out, nil); err != nil || !strings.Contains(out.String(), "started") {
		t.Fatalf("start: %q %v", out.String(), err)
	}
	c.JSON(t, &inspect, "inspect", ctr)
	if inspect.Status.State != "CONTAINER_RUNNING" || inspect.Status.Reason == "Halted" {
		t.Fatalf("after start: %+v", inspect.Status)
	}
	c.Must(t, "exec", "-s", ctr, "hostname")
	out.Reset()
	if err := streamExec(t, rt, ctr, []string{vmtools.Restart, "1"}, nil, &out, nil); err != nil || !strings.Contains(out.String(), "restarted") {
		t.Fatalf("restart: %q %v", out.String(), err)
	}
	c.Must(t, "exec", "-s", ctr, "hostname")
}
