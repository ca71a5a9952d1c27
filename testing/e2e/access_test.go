package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/harness"
)

// Subnets 198.18.80-89.0/24 (fd00:198:18:8x::/64) belong to the suites
// that reach into VMs.

// consolePassword is the cloud guest's default user's password, set by
// cloud-init for the console login.
const consolePassword = "virtlet-e2e"

// crictlProc runs a long-lived crictl (attach, port-forward).
type crictlProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *harness.Screen
	exited chan struct{} // closed when the process ended
	err    error         // its exit status, once exited is closed
}

func startCrictl(t *testing.T, c *harness.Crictl, args ...string) *crictlProc {
	t.Helper()
	cmd := exec.Command(c.Bin, append([]string{"--config", "/dev/null", "--runtime-endpoint", c.Endpoint}, args...)...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &crictlProc{cmd: cmd, in: in, out: &harness.Screen{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-p.exited })
	return p
}

func (p *crictlProc) waitFor(t *testing.T, what string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.out.String(), what) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q after %s in crictl's output:\n%s", what, timeout, p.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func fdsOf(pid int) []os.DirEntry {
	entries, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return entries
}

// sshVia runs a command in the guest through a local port (a port-forward).
func sshVia(key string, port int, command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ssh", "-i", key, "-p", strconv.Itoa(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR", "debian@127.0.0.1", command).CombinedOutput()
	return string(out), err
}

func sshKey(t *testing.T) (key, pub string) {
	t.Helper()
	key = filepath.Join(t.TempDir(), "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e@virtlet", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	b, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return key, string(b)
}

// cloudVMPod writes the configs of a cloud-image VM pod with the test's
// SSH key and the console password.
func cloudVMPod(t *testing.T, d *harness.Daemon, name, pub string) (pod, ctr string) {
	t.Helper()
	pod, _ = vmPod(t, d, name, map[string]string{"VirtletVCPUCount": "1", "VirtletSSHKeys": pub,
		"VirtletCloudInitUserData": fmt.Sprintf(`{"password": %q, "chpasswd": {"expire": false}}`, consolePassword)}, 512<<20)
	ctr = harness.WriteJSON(t, d.Dir, name+"-ctr.json", map[string]interface{}{
		"metadata": map[string]string{"name": name}, "image": map[string]string{"image": "virtlet.cloud/debian-cloud"},
		"log_path": name + "/0.log", "linux": map[string]interface{}{"resources": map[string]interface{}{"memory_limit_in_bytes": 512 << 20}},
		"tty": true, "stdin": true,
	})
	return pod, ctr
}

// waitAgent waits until the guest agent runs commands.
func waitAgent(t *testing.T, c *harness.Crictl, ctr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, errOut, err := c.Run("exec", "-s", "--timeout", "10", ctr, "true")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			logs, _, _ := c.Run("logs", ctr)
			t.Fatalf("the guest agent never answered: %v %s %s\nconsole:\n%s", err, out, errOut, logs)
		}
		time.Sleep(2 * time.Second)
	}
}

type usage struct {
	cpu, workingSet uint64
}

func containerUsage(t *testing.T, c *harness.Crictl, ctr string) usage {
	t.Helper()
	var stats struct {
		Stats []struct {
			Attributes struct{ ID string } `json:"attributes"`
			CPU        struct {
				UsageCoreNanoSeconds struct {
					Value uint64 `json:"value,string"`
				} `json:"usageCoreNanoSeconds"`
			} `json:"cpu"`
			Memory struct {
				WorkingSetBytes struct {
					Value uint64 `json:"value,string"`
				} `json:"workingSetBytes"`
			} `json:"memory"`
		} `json:"stats"`
	}
	c.JSON(t, &stats, "stats", "-o", "json", "--id", ctr)
	for _, s := range stats.Stats {
		if s.Attributes.ID == ctr {
			return usage{s.CPU.UsageCoreNanoSeconds.Value, s.Memory.WorkingSetBytes.Value}
		}
	}
	t.Fatalf("crictl stats has no entry for %s: %+v", ctr, stats)
	return usage{}
}

// The cloud VM on a dual-stack pod network, reached every way a user
// reaches a pod: exec through its guest agent, its serial console through
// attach (two viewers, Ctrl-] to leave), port-forward to sshd over IPv4
// and IPv6, stats that follow the guest's CPU; and an agent that stops
// answering. The tiny VM, told to run no agent, has an exec wait for one
// while it boots (the libvirt plugin's agentWait, 15 s here), then gets
// the clear error at once.
func TestReachTheVM(t *testing.T) {
	parallel(t)
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 80, DualStack: true})
	cloudTr := cloudTranslation(t)
	const agentWait = 15 * time.Second
	ps := harness.WithConfig(plugins(), "libvirt", fmt.Sprintf("{agentWait: %s}", agentWait))
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(ps, tn.Plugin(bins)))
	d.Translate("test-images.yaml", translation)
	d.Translate("cloud.yaml", cloudTr)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	c.Must(t, "pull", tinyRef)
	c.Must(t, "pull", "virtlet.cloud/debian-cloud")
	key, pub := sshKey(t)

	cloudPod, cloudCfg := cloudVMPod(t, d, "reach-cloud", pub)
	tinyPod, tinyCfg := vmPod(t, d, "reach-tiny", map[string]string{"VirtletForceDHCPNetworkConfig": "true",
		"VirtletCloudInitMetaData": "tiny: virtlet-tiny-no-agent"}, 160<<20)
	cloudSB := c.Must(t, "runp", cloudPod)
	tinySB := c.Must(t, "runp", tinyPod)
	t.Cleanup(func() { c.Run("rmp", "-f", cloudSB, tinySB) })
	ips := c.PodNetwork(t, cloudSB).IPs
	if len(ips) != 2 {
		t.Fatalf("cloud pod IPs %v: want IPv4 and IPv6", ips)
	}
	ip4, ip6 := ips[0], ips[1]
	cloud := c.Must(t, "create", cloudSB, cloudCfg, cloudPod)
	c.Must(t, "start", cloud)
	booted := time.Now()
	tiny := c.Must(t, "create", tinySB, tinyCfg, tinyPod)
	c.Must(t, "start", tiny)
	tinyStarted := time.Now()

	t.Run("a VM without a guest agent", func(t *testing.T) {
		// While the VM boots an exec waits for its agent, up to the exec's
		// own timeout, and says so.
		start := time.Now()
		_, errOut, err := c.Run("exec", "-s", "--timeout", "2", tiny, "hostname")
		took := time.Since(start)
		if err == nil || !strings.Contains(errOut, "has not connected yet") || took > 20*time.Second {
			t.Fatalf("exec in the booting tiny VM: %v after %s: %s", err, took, errOut)
		}
		waitLog(t, c, tiny, "@@AGENT off", 3*time.Minute)
		waitLog(t, c, tiny, "@@TINY-READY", 3*time.Minute)
		time.Sleep(time.Until(tinyStarted.Add(agentWait + time.Second)))
		// Past agentWait the answer must not wait for an agent: it comes
		// long before the exec's timeout (a loose bound, so a loaded
		// machine passes; the figure is logged).
		start = time.Now()
		_, errOut, err = c.Run("exec", "-s", "--timeout", "120", tiny, "hostname")
		took = time.Since(start)
		if err == nil || !strings.Contains(errOut, "has no guest agent") || !strings.Contains(errOut, "virtletctl ssh") || took > 30*time.Second {
			t.Fatalf("exec in the tiny VM: %v after %s: %s", err, took, errOut)
		}
		t.Logf("no-agent error after %s", took.Round(time.Millisecond))
		u := containerUsage(t, c, tiny)
		if u.cpu == 0 || u.workingSet == 0 {
			t.Errorf("tiny VM stats (host view, no balloon driver in the guest): %+v", u)
		}
		c.Must(t, "stop", "--timeout", "0", tiny)
		_, errOut, err = c.Run("attach", tiny)
		if err == nil || !strings.Contains(errOut, "not running") {
			t.Fatalf("attach to a stopped VM: %v %s", err, errOut)
		}
	})

	waitAgent(t, c, cloud, 8*time.Minute)
	t.Logf("the guest agent answers %s after start", time.Since(booted).Round(time.Second))
	// The console password is set by cloud-init: wait until it is done.
	long := *c
	long.Timeout = 11 * time.Minute // crictl's own deadline, past the exec's 600 s
	if out, errOut, err := long.Run("exec", "-s", "--timeout", "600", cloud, "cloud-init", "status", "--wait"); err != nil {
		t.Fatalf("cloud-init status --wait: %v %s %s", err, out, errOut)
	}
	t.Logf("cloud-init done %s after start", time.Since(booted).Round(time.Second))

	t.Run("exec through the guest agent", func(t *testing.T) {
		out, errOut, err := c.Run("exec", "-s", cloud, "hostname")
		if err != nil || strings.TrimSpace(out) != "reach-cloud" {
			t.Fatalf("hostname: %q %q %v", out, errOut, err)
		}
		out, errOut, err = c.Run("exec", cloud, "sh", "-c", "echo to-stdout; echo to-stderr >&2")
		if err != nil || out != "to-stdout\n" || errOut != "to-stderr\n" {
			t.Fatalf("stdout and stderr apart: %q %q %v", out, errOut, err)
		}
		_, errOut, err = c.Run("exec", "-s", cloud, "sh", "-c", "exit 3")
		if err == nil || !strings.Contains(errOut, "exited with 3") {
			t.Fatalf("exit 3: %v %s", err, errOut)
		}
		// The timeout ends the call long before the command would: after
		// its 2 s, the kill runs through the agent (a command of its
		// own, each agent call bounded by 5 s), which a slow machine
		// takes seconds over.
		const timedOut = 2*time.Second + 10*time.Second
		start := time.Now()
		_, errOut, err = c.Run("exec", "-s", "--timeout", "2", cloud, "sleep", "60")
		took := time.Since(start)
		t.Logf("sleep 60 with a 2 s timeout: ended after %s", took.Round(time.Millisecond))
		if err == nil || !strings.Contains(errOut, "did not finish within 2s") || !strings.Contains(errOut, "was killed") || took > timedOut {
			t.Fatalf("sleep 60 with a 2 s timeout: after %s: %v %s", took, err, errOut)
		}
		// A command whose children outlive it holds the agent's output
		// pipes: its whole tree is killed, and the timeout still ends
		// the call promptly.
		start = time.Now()
		_, errOut, err = c.Run("exec", "-s", "--timeout", "2", cloud, "sh", "-c", "sleep 61 & (sleep 62 & sleep 63; wait) & sleep 64; wait")
		took = time.Since(start)
		t.Logf("a shell with grandchildren and a 2 s timeout: ended after %s", took.Round(time.Millisecond))
		if err == nil || !strings.Contains(errOut, "did not finish within 2s") || !strings.Contains(errOut, "was killed") || took > timedOut {
			t.Fatalf("a shell with grandchildren and a 2 s timeout: after %s: %v %s", took, err, errOut)
		}
		out, _, err = c.Run("exec", "-s", cloud, "sh", "-c", `for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sleep ] && echo still-running; done; true`)
		if err != nil || strings.Contains(out, "still-running") {
			t.Fatalf("the timed-out sleep still runs in the guest: %q %v", out, err)
		}
	})

	t.Run("attach to the serial console", func(t *testing.T) {
		one := startCrictl(t, c, "attach", "-i", cloud)
		two := startCrictl(t, c, "attach", "-i", cloud)
		// A viewer sees the console from when it attached: Enter is
		// pressed until both have seen a login prompt.
		harness.Eventually(t, time.Minute, "both viewers to see a login prompt", func() bool {
			io.WriteString(one.in, "\r")
			time.Sleep(2 * time.Second)
			return strings.Contains(one.out.String(), "login:") && strings.Contains(two.out.String(), "login:")
		})
		io.WriteString(one.in, "debian\r")
		one.waitFor(t, "Password:", 30*time.Second)
		io.WriteString(one.in, consolePassword+"\r")
		one.waitFor(t, "debian@reach-cloud", time.Minute) // the shell's prompt
		io.WriteString(two.in, "echo marker-$((6*7))\r")
		for _, v := range []*crictlProc{one, two} {
			v.waitFor(t, "marker-42", 60*time.Second)
		}
		io.WriteString(one.in, "exit\r\x1d")
		select {
		case <-one.exited:
			if one.err != nil {
				t.Fatalf("crictl attach after Ctrl-]: %v\n%s", one.err, one.out.String())
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Ctrl-] did not end the attach")
		}
		if st := inspectCtr(t, c, cloud).Status.State; st != "CONTAINER_RUNNING" {
			t.Fatalf("the VM is %s after a detach", st)
		}
		// The console kept reaching the CRI log while viewers were attached.
		waitLog(t, c, cloud, "marker-42", 30*time.Second)
	})

	t.Run("port-forward to sshd over IPv4 and IPv6", func(t *testing.T) {
		// A second sshd that listens on IPv6 only: the forward tries the
		// pod's IPv4 address, is refused, and reaches it over IPv6.
		if out, errOut, err := c.Run("exec", "-s", cloud, "sh", "-c",
			"/usr/sbin/sshd -p 2222 -o AddressFamily=inet6 </dev/null >/dev/null 2>&1"); err != nil {
			t.Fatalf("start an IPv6-only sshd: %v %s %s", err, out, errOut)
		}
		p4, p6, closed := harness.FreePort(t), harness.FreePort(t), harness.FreePort(t)
		fwd4 := startCrictl(t, c, "port-forward", cloudSB, fmt.Sprintf("%d:22", p4))
		fwd6 := startCrictl(t, c, "port-forward", cloudSB, fmt.Sprintf("%d:2222", p6))
		fwdClosed := startCrictl(t, c, "port-forward", cloudSB, fmt.Sprintf("%d:23", closed))
		for _, f := range []*crictlProc{fwd4, fwd6, fwdClosed} {
			f.waitFor(t, "Forwarding from", 20*time.Second)
		}
		// Several streams at once through one forward.
		var wg sync.WaitGroup
		errs := make(chan string, 4)
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				out, err := sshVia(key, p4, fmt.Sprintf("echo stream-%d $SSH_CONNECTION", i))
				if err != nil || !strings.Contains(out, fmt.Sprintf("stream-%d", i)) || !strings.Contains(out, " "+ip4+" 22") {
					errs <- fmt.Sprintf("stream %d over IPv4: %v %s", i, err, out)
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		out, err := sshVia(key, p6, "echo $SSH_CONNECTION")
		if err != nil || !strings.Contains(out, " "+ip6+" 2222") {
			t.Fatalf("over IPv6 (server %s): %v %s", ip6, err, out)
		}
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", closed))
		if err == nil {
			io.ReadAll(conn) // crictl closes it after the error
			conn.Close()
		}
		fwdClosed.waitFor(t, "connect: connection refused", 20*time.Second)
		if !strings.Contains(fwdClosed.out.String(), "failed to connect to port 23 of pod default/reach-cloud: IPv4: dial tcp "+ip4+":23: connect: connection refused") {
			t.Errorf("closed port: %s", fwdClosed.out.String())
		}
	})

	t.Run("stats follow the guest", func(t *testing.T) {
		before := containerUsage(t, c, cloud)
		if before.cpu == 0 || before.workingSet == 0 {
			t.Fatalf("stats of a running VM: %+v", before)
		}
		idleStart := time.Now()
		time.Sleep(5 * time.Second)
		idle := containerUsage(t, c, cloud)
		idleRate := float64(idle.cpu-before.cpu) / float64(time.Since(idleStart))
		// A busy loop of 20 s in the guest, measured between two samples
		// inside it (not over the exec's own start and end).
		c.Must(t, "exec", "-s", cloud, "systemd-run", "--unit=cpu-burn", "timeout", "20", "sh", "-c", "while :; do :; done")
		time.Sleep(3 * time.Second)
		burning := containerUsage(t, c, cloud)
		burnStart := time.Now()
		time.Sleep(10 * time.Second)
		burned := containerUsage(t, c, cloud)
		burnRate := float64(burned.cpu-burning.cpu) / float64(time.Since(burnStart))
		t.Logf("CPU: idle %.2f cores, burning %.2f cores; working set %d MiB", idleRate, burnRate, burned.workingSet>>20)
		// The property is that the figure follows the guest, not how much
		// of the host's two cores the guest gets beside the other tests
		// (0.30 of a core at the lowest seen).
		if burnRate < idleRate+0.15 || burnRate < 3*idleRate {
			t.Errorf("CPU usage does not follow the guest: idle %.2f, burning %.2f cores", idleRate, burnRate)
		}
		var pods struct {
			Stats []struct {
				Attributes struct{ ID string } `json:"attributes"`
				Linux      struct {
					Network struct {
						DefaultInterface struct {
							Name    string `json:"name"`
							RxBytes struct {
								Value uint64 `json:"value,string"`
							} `json:"rxBytes"`
						} `json:"defaultInterface"`
					} `json:"network"`
					Memory struct {
						WorkingSetBytes struct {
							Value uint64 `json:"value,string"`
						} `json:"workingSetBytes"`
					} `json:"memory"`
				} `json:"linux"`
			} `json:"stats"`
		}
		c.JSON(t, &pods, "statsp", "-o", "json", "--id", cloudSB)
		if len(pods.Stats) != 1 || pods.Stats[0].Linux.Network.DefaultInterface.Name != "eth0" ||
			pods.Stats[0].Linux.Network.DefaultInterface.RxBytes.Value == 0 || pods.Stats[0].Linux.Memory.WorkingSetBytes.Value == 0 {
			t.Errorf("crictl statsp: %+v", pods)
		}
		if out := c.Must(t, "stats"); !strings.Contains(out, cloud[:13]) {
			t.Errorf("crictl stats table lacks the VM:\n%s", out)
		}
	})

	t.Run("exec output limits and no leaks through the real agent", func(t *testing.T) {
		out, errOut, err := c.Run("exec", cloud, "sh", "-c", "head -c 1500000 /dev/zero | tr '\\0' x")
		if err != nil || len(out) != 1<<20 || !strings.Contains(errOut, "stdout cut at 1048576 bytes") {
			t.Fatalf("1.5 MB of output: %d bytes, stderr %q, %v", len(out), errOut, err)
		}
		_, errOut, err = c.Run("exec", "-s", cloud, "sh", "-c", "head -c 6000000 /dev/zero | tr '\\0' x")
		t.Logf("6 MB of output: %v: %s", err, strings.TrimSpace(errOut))
		if err == nil || !strings.Contains(errOut, "larger than libvirt carries") {
			t.Errorf("6 MB of output through the agent (over libvirt's 4 MiB reply limit): %v %s", err, errOut)
		}
		if out, _, err := c.Run("exec", "-s", cloud, "hostname"); err != nil || strings.TrimSpace(out) != "reach-cloud" {
			t.Fatalf("exec after an oversized reply: %q %v", out, err)
		}
		plugin := pluginPID(t, c, "libvirt")
		var info struct {
			Goroutines int `json:"goroutines,string"`
		}
		c.JSON(t, &info, "info")
		g0, f0 := info.Goroutines, len(fdsOf(plugin))
		rt, _ := d.CRI(t)
		for i := 0; i < 50; i++ {
			if r, err := rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: cloud, Cmd: []string{"true"}, Timeout: 10}); err != nil || r.ExitCode != 0 {
				t.Fatalf("ExecSync %d: %v %v", i, r, err)
			}
		}
		// The calls' connections and timers wind down in a moment.
		var g1, f1 int
		settled := harness.EventuallyOK(30*time.Second, func() bool {
			c.JSON(t, &info, "info")
			g1, f1 = info.Goroutines, len(fdsOf(plugin))
			return g1 <= g0+5 && f1 <= f0+2
		})
		t.Logf("50 ExecSync through the agent: daemon goroutines %d → %d, libvirt plugin fds %d → %d", g0, g1, f0, f1)
		if !settled {
			t.Errorf("leak after 50 ExecSync through the real agent: goroutines %d → %d, plugin fds %d → %d", g0, g1, f0, f1)
		}
	})

	t.Run("an agent that never answers", func(t *testing.T) {
		// Something in the guest holds the agent's port and never answers.
		// It starts a second after this exec returned: the agent that
		// runs the exec must live to report it.
		c.Must(t, "exec", "-s", cloud, "systemd-run", "--on-active=1", "--timer-property=AccuracySec=100ms", "--unit=agent-blackhole", "sh", "-c",
			"systemctl stop qemu-guest-agent; exec sleep 3600 < /dev/virtio-ports/org.qemu.guest_agent.0")
		// Until the blackhole holds the port (a second, and the time
		// systemd takes to stop the agent) an exec still succeeds, or
		// finds no agent at all.
		var errOut string
		var took time.Duration
		silent := harness.EventuallyOK(2*time.Minute, func() bool {
			start := time.Now()
			_, e, err := c.Run("exec", "-s", "--timeout", "2", cloud, "hostname")
			took, errOut = time.Since(start), e
			// Not libvirt's "not connected": the agent stopped and
			// nothing holds its port yet.
			return err != nil && strings.Contains(e, "guest agent") && strings.Contains(e, "answer") && !strings.Contains(e, "not connected")
		})
		// The exec's 2 s, and some for crictl and gRPC on a slow machine:
		// not the agent's own 5 s wait, nor minutes.
		if !silent || took > 2*time.Second+4*time.Second {
			t.Fatalf("exec with a silent agent: after %s: %s", took, errOut)
		}
		t.Logf("silent agent: %s after %s", strings.TrimSpace(errOut), took.Round(time.Millisecond))
	})

	c.Must(t, "stop", "--timeout", "0", cloud)
	_, errOut, err := c.Run("attach", cloud)
	if err == nil || !strings.Contains(errOut, "not running") {
		t.Fatalf("attach to the stopped cloud VM: %v %s", err, errOut)
	}
	c.Must(t, "rmp", "-f", cloudSB, tinySB)
	assertNothingLeft(t, d, c)
}
