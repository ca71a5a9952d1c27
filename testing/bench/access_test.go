package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/harness"
)

var (
	execRuns      = size(200, 3)
	forwardBytes  = size(64<<20, 1<<20) // per transfer
	forwardRounds = size(3, 1)
)

// BenchmarkReachTheVM boots the cloud guest once on a pod network and
// measures: ExecSync round trips through the daemon, the libvirt plugin and
// qemu-guest-agent (p50/p99 of `true`); and port-forward throughput (the
// CRI streaming path: SPDY to the daemon, TCP from the node to the pod
// address) against a direct TCP connection from the node to the VM, both
// reading 64 MiB a guest program sends. Run with -benchtime 1x (make bench).
func BenchmarkReachTheVM(b *testing.B) {
	_, tr := serveGuest(b, "cloud", "debian-cloud")
	tn := harness.NewTestNetwork(b, harness.NetworkOptions{Index: 82})
	dir := builtBinaries(b)
	d := harness.NewDaemon(b, filepath.Join(dir, "virtlet"), append(harness.Shipped(dir), tn.Plugin(dir)))
	d.Translate("bench.yaml", tr)
	d.Start()
	rt, img := d.CRI(b)
	ctx := context.Background()
	pulled, err := img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "virtlet.cloud/debian-cloud"}})
	if err != nil {
		b.Fatal(err)
	}
	pod := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "bench-reach", Namespace: "bench", Uid: "uid-bench-reach"},
		Annotations:  map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud"},
		LogDirectory: filepath.Join(d.Dir, "pods", "bench-reach"),
	}
	sb, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: pod})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId})
	defer rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId})
	st, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.PodSandboxId})
	if err != nil {
		b.Fatal(err)
	}
	vmIP := st.Status.Network.Ip
	ctr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: pod,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "vm"}, Image: &runtimeapi.ImageSpec{Image: pulled.ImageRef},
			LogPath: "vm.log", Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 512 << 20}}}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		b.Fatal(err)
	}
	execSync := func(timeout int64, cmd ...string) (*runtimeapi.ExecSyncResponse, error) {
		return rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctr.ContainerId, Cmd: cmd, Timeout: timeout})
	}
	deadline := time.Now().Add(8 * time.Minute)
	for {
		if _, err := execSync(10, "true"); err == nil {
			break
		} else if time.Now().After(deadline) {
			b.Fatalf("the guest agent never answered: %v", err)
		}
		time.Sleep(2 * time.Second)
	}
	// A guest program that sends forwardBytes to every connection.
	const port = 5001
	sender := fmt.Sprintf(`import socket,threading
s=socket.socket(socket.AF_INET6);s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.setsockopt(socket.IPPROTO_IPV6,socket.IPV6_V6ONLY,0)
s.bind(("::",%d));s.listen(8)
buf=bytes(1<<20)
def serve(c):
  for _ in range(%d): c.sendall(buf)
  c.close()
while True:
  c,_=s.accept();threading.Thread(target=serve,args=(c,)).start()
`, port, forwardBytes>>20)
	if r, err := execSync(30, "systemd-run", "--unit=bench-sender", "python3", "-c", sender); err != nil || r.ExitCode != 0 {
		b.Fatalf("start the sender in the guest: %v %+v", err, r)
	}
	// systemd-run returns at once; python3 takes seconds to start under
	// TCG: the figures begin once the sender listens.
	listening := false
	for until := time.Now().Add(2 * time.Minute); !listening && time.Now().Before(until); {
		if conn, err := net.DialTimeout("tcp", net.JoinHostPort(vmIP, strconv.Itoa(port)), 5*time.Second); err == nil {
			conn.Close()
			listening = true
		} else {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if !listening {
		b.Fatalf("the guest's sender never listened on port %d", port)
	}

	b.ResetTimer()
	var rtts []time.Duration
	for i := 0; i < execRuns; i++ {
		start := time.Now()
		r, err := execSync(10, "true")
		if err != nil || r.ExitCode != 0 {
			b.Fatalf("ExecSync: %v %+v", err, r)
		}
		rtts = append(rtts, time.Since(start))
	}
	direct, forwarded := []float64{}, []float64{}
	for i := 0; i < forwardRounds; i++ {
		direct = append(direct, mibPerSecond(b, func() (io.ReadCloser, error) {
			return net.DialTimeout("tcp", net.JoinHostPort(vmIP, strconv.Itoa(port)), 10*time.Second)
		}))
		forwarded = append(forwarded, mibPerSecond(b, func() (io.ReadCloser, error) {
			return forwardConn(rt, sb.PodSandboxId, port)
		}))
	}
	b.StopTimer()
	p50, p99 := percentiles(b, "exec-", rtts)
	md, mf := medianF(direct), medianF(forwarded)
	b.ReportMetric(md, "direct-MiB/s")
	b.ReportMetric(mf, "forward-MiB/s")
	b.ReportMetric(mf/md, "forward/direct")
	record(Row{Figure: fmt.Sprintf("ExecSync through qemu-guest-agent (`true` in the cloud guest, %d runs), p50 (p99)", execRuns),
		Ours: fmt.Sprintf("%s (%s)", ms(p50), ms(p99)), Target: "none set"},
		Row{Figure: fmt.Sprintf("port-forward of %d MiB from the guest (median of %d)", forwardBytes>>20, forwardRounds),
			Ours: fmt.Sprintf("%.0f MiB/s", mf), Floor: fmt.Sprintf("direct TCP from the node %.0f MiB/s", md), Ratio: ratioOf(mf, md), Target: "none set"})
	fmt.Printf("ExecSync through qemu-guest-agent (TCG), %d runs of `true`: p50 %s, p99 %s\n", execRuns, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond))
	fmt.Printf("port-forward of %d MiB from the guest: %.0f MiB/s forwarded vs %.0f MiB/s direct, ratio %.2f (median of %d)\n",
		forwardBytes>>20, mf, md, mf/md, forwardRounds)
}

// mibPerSecond reads everything a new connection gives.
func mibPerSecond(b *testing.B, dial func() (io.ReadCloser, error)) float64 {
	b.Helper()
	start := time.Now()
	c, err := dial()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	n, err := io.Copy(io.Discard, c)
	if err != nil || n != int64(forwardBytes) {
		b.Fatalf("read %d bytes, want %d: %v", n, forwardBytes, err)
	}
	return float64(n) / (1 << 20) / time.Since(start).Seconds()
}

// forwardConn opens one port-forward stream through the CRI streaming
// server (as crictl port-forward does) and returns its local end.
func forwardConn(rt runtimeapi.RuntimeServiceClient, sandbox string, port int32) (io.ReadCloser, error) {
	resp, err := rt.PortForward(context.Background(), &runtimeapi.PortForwardRequest{PodSandboxId: sandbox, Port: []int32{port}})
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		return nil, err
	}
	transport, upgrader, err := spdy.RoundTripperFor(&rest.Config{})
	if err != nil {
		return nil, err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(int(port))}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errc:
		return nil, err
	}
	ports, err := fw.GetPorts()
	if err != nil {
		close(stop)
		return nil, err
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(ports[0].Local)))
	if err != nil {
		close(stop)
		return nil, err
	}
	return &stopOnClose{Conn: c, stop: stop}, nil
}

type stopOnClose struct {
	net.Conn
	stop chan struct{}
}

func (s *stopOnClose) Close() error {
	err := s.Conn.Close()
	close(s.stop)
	return err
}

func medianF(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
