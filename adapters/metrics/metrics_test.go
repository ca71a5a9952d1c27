package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/promtest"

	"github.com/virtlet/virtlet/adapters/cri"
	"github.com/virtlet/virtlet/adapters/metrics"
	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/fakes"
)

func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// newRuntime runs a core over the fakes, reporting to obs.
func newRuntime(t *testing.T, obs ports.Observer) *core.Runtime {
	t.Helper()
	rt, err := core.New(core.Deps{Hypervisor: fakehypervisor.New(), ImageSources: map[string]ports.ImageSource{"https": fakes.NewImageSource()},
		ImageFiles: fakes.NewImageFiles(t.TempDir()), Store: fakes.NewStore(), Network: fakes.NewNetwork(),
		Datasources: map[string]ports.Datasource{"nocloud": fakes.NewDatasource("nocloud")}, Observer: obs}, core.Options{Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rt.Run(ctx)
	if err := rt.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	return rt
}

// find returns the series of family name whose labels include want.
func find(t *testing.T, families map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	if _, ok := families[name]; !ok {
		t.Fatalf("no family %s", name)
	}
	m := promtest.Series(families, name, want)
	if m == nil {
		t.Fatalf("%s has no series with %v", name, want)
	}
	return m
}

// A VM pod's life, through the CRI server over gRPC, shows in every
// family.
func TestScrapeAfterCRICalls(t *testing.T) {
	m := metrics.New(metrics.Options{Log: quietLog()})
	rt := newRuntime(t, m)
	m.WithRuntime(rt).WithPlugins(func() []metrics.Plugin {
		return []metrics.Plugin{{Name: "libvirt", Kind: "hypervisor", Up: true}, {Name: "cni", Kind: "network", Restarts: 2, Calls: 7}}
	})
	client := criClient(t, cri.New(rt, cri.Info{Version: "test"}, quietLog()).WithCallObserver(m.CRICall))
	ctx := context.Background()
	var sandboxes []string
	for i := range 3 {
		cfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: fmt.Sprintf("p%d", i), Namespace: "ns", Uid: fmt.Sprint("uid", i)},
			Annotations: map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud"}}
		r, err := client.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		sandboxes = append(sandboxes, r.PodSandboxId)
	}
	img, err := client.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "virtlet.cloud/example.com/x.img"}})
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := client.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxes[0], Config: &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "vm"}, Image: &runtimeapi.ImageSpec{Image: img.ImageRef}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxes[2]}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "nosuch"}); status.Code(err) != codes.NotFound {
		t.Fatalf("status of an unknown container: %v", err)
	}
	if _, err := client.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "virtlet.cloud/Bad/NAME"}}); err == nil {
		t.Fatal("pulled a bad name")
	}

	web := httptest.NewServer(m.Handler())
	defer web.Close()
	fams := promtest.Scrape(t, web.URL)

	if h := find(t, fams, "virtlet_cri_request_duration_seconds", map[string]string{"method": "RunPodSandbox", "code": "OK", "runtime": "virtlet"}).Histogram; h.GetSampleCount() != 3 {
		t.Errorf("RunPodSandbox count %d, want 3", h.GetSampleCount())
	}
	if h := find(t, fams, "virtlet_cri_request_duration_seconds", map[string]string{"method": "ContainerStatus", "code": "NotFound"}).Histogram; h.GetSampleCount() != 1 {
		t.Errorf("ContainerStatus NotFound count %d, want 1", h.GetSampleCount())
	}
	for state, want := range map[string]float64{"ready": 2, "notready": 1, "pending": 0} {
		if v := promtest.Value(find(t, fams, "virtlet_sandboxes", map[string]string{"state": state})); v != want {
			t.Errorf("sandboxes %s: %v, want %v", state, v, want)
		}
	}
	for state, want := range map[string]float64{"running": 1, "created": 0, "creating": 0, "exited": 0} {
		if v := promtest.Value(find(t, fams, "virtlet_containers", map[string]string{"state": state})); v != want {
			t.Errorf("containers %s: %v, want %v", state, v, want)
		}
	}
	for phase, want := range map[string]uint64{"network": 3, "volumes": 1, "cloud_init": 1, "define": 1, "start": 1, "write_files": 0} {
		if n := find(t, fams, "virtlet_vm_phase_duration_seconds", map[string]string{"phase": phase}).Histogram.GetSampleCount(); n != want {
			t.Errorf("phase %s: %d observations, want %d", phase, n, want)
		}
	}
	stored, err := rt.ImageStatus(ctx, img.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	if v := promtest.Value(find(t, fams, "virtlet_image_pull_bytes_total", map[string]string{"scheme": "https"})); v != float64(stored.Size) || v == 0 {
		t.Errorf("pulled bytes %v, want %d", v, stored.Size)
	}
	if n := find(t, fams, "virtlet_image_pull_duration_seconds", map[string]string{"scheme": "https"}).Histogram.GetSampleCount(); n != 1 {
		t.Errorf("pulls %d, want 1", n)
	}
	if v := promtest.Value(find(t, fams, "virtlet_image_pull_failures_total", map[string]string{"reason": "invalid_name"})); v != 1 {
		t.Errorf("invalid_name failures %v, want 1", v)
	}
	if v := promtest.Value(find(t, fams, "virtlet_image_pull_failures_total", map[string]string{"reason": "not_found"})); v != 0 {
		t.Errorf("not_found failures %v, want 0", v)
	}
	vm := map[string]string{"namespace": "ns", "pod": "p0", "container": "vm", "container_id": ctr.ContainerId}
	find(t, fams, "virtlet_vm_cpu_seconds_total", vm)
	if v := promtest.Value(find(t, fams, "virtlet_vm_memory_bytes", vm)); v <= 0 {
		t.Errorf("VM memory %v", v)
	}
	if n := len(fams["virtlet_vm_cpu_seconds_total"].Metric); n != 1 {
		t.Errorf("%d VMs with CPU figures, want the one running", n)
	}
	if v := promtest.Value(find(t, fams, "virtlet_vm_stats_success", nil)); v != 1 {
		t.Errorf("stats success %v", v)
	}
	if v := promtest.Value(find(t, fams, "virtlet_plugin_up", map[string]string{"plugin": "libvirt", "kind": "hypervisor"})); v != 1 {
		t.Errorf("libvirt up %v", v)
	}
	if v := promtest.Value(find(t, fams, "virtlet_plugin_up", map[string]string{"plugin": "cni"})); v != 0 {
		t.Errorf("cni up %v", v)
	}
	if v := promtest.Value(find(t, fams, "virtlet_plugin_calls_total", map[string]string{"plugin": "cni", "kind": "network"})); v != 7 {
		t.Errorf("cni calls %v", v)
	}
	if v := promtest.Value(find(t, fams, "virtlet_plugin_restarts_total", map[string]string{"plugin": "cni", "kind": "network"})); v != 2 {
		t.Errorf("cni restarts %v", v)
	}
	for _, name := range []string{"go_goroutines", "process_open_fds"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("no %s", name)
		}
	}
}

// criClient serves srv over an in-memory connection and returns a client.
func criClient(t *testing.T, srv *cri.Server) criClients {
	t.Helper()
	l := bufconn.Listen(1 << 20)
	g := srv.GRPCServer()
	go g.Serve(l)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///cri", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return criClients{runtimeapi.NewRuntimeServiceClient(conn), runtimeapi.NewImageServiceClient(conn)}
}

type criClients struct {
	runtimeapi.RuntimeServiceClient
	runtimeapi.ImageServiceClient
}

// failingStats is a runtime whose hypervisor does not answer stats.
type failingStats struct{ metrics.Runtime }

func (failingStats) ListContainerStats(ctx context.Context, f core.ContainerFilter) ([]core.ContainerStats, error) {
	return nil, fmt.Errorf("VM stats: %w", errors.Join(ports.ErrUnavailable, errors.New("plugin restarting")))
}

// A failing stats query leaves the VM figures out and says so; the rest is
// served.
func TestScrapeWithoutStats(t *testing.T) {
	m := metrics.New(metrics.Options{Log: quietLog()}).WithRuntime(failingStats{newRuntime(t, nil)})
	web := httptest.NewServer(m.Handler())
	defer web.Close()
	fams := promtest.Scrape(t, web.URL)
	if v := promtest.Value(find(t, fams, "virtlet_vm_stats_success", nil)); v != 0 {
		t.Errorf("stats success %v, want 0", v)
	}
	if _, ok := fams["virtlet_vm_cpu_seconds_total"]; ok {
		t.Error("CPU figures without stats")
	}
	find(t, fams, "virtlet_sandboxes", map[string]string{"state": "ready"})
}

func TestMigrationsAreCountedWithTheirDowntime(t *testing.T) {
	m := metrics.New(metrics.Options{Log: quietLog()})
	m.Migration(ports.MigrationStats{Total: 3 * time.Second, Downtime: 80 * time.Millisecond})
	m.Migration(ports.MigrationStats{Total: 4 * time.Second, Downtime: 120 * time.Millisecond})
	web := httptest.NewServer(m.Handler())
	defer web.Close()
	fams := promtest.Scrape(t, web.URL)
	down := find(t, fams, "virtlet_migration_downtime_seconds", nil).Histogram
	if down.GetSampleCount() != 2 || down.GetSampleSum() < 0.199 || down.GetSampleSum() > 0.201 {
		t.Errorf("downtime: %d samples summing to %v s, want 2 and 0.2", down.GetSampleCount(), down.GetSampleSum())
	}
	if took := find(t, fams, "virtlet_migration_duration_seconds", nil).Histogram; took.GetSampleCount() != 2 || took.GetSampleSum() != 7 {
		t.Errorf("duration: %d samples summing to %v s, want 2 and 7", took.GetSampleCount(), took.GetSampleSum())
	}
}

// The endpoint serves /metrics and /healthz to GET, nothing else.
func TestEndpointServesOnlyMetricsAndHealth(t *testing.T) {
	m := metrics.New(metrics.Options{Log: quietLog()})
	web := httptest.NewServer(m.Handler())
	defer web.Close()
	for _, tt := range []struct {
		method, path string
		want         int
		body         string
	}{
		{"GET", "/metrics", 200, "virtlet_image_pull_failures_total"},
		{"HEAD", "/metrics", 200, ""},
		{"GET", "/healthz", 200, "ok"},
		{"POST", "/metrics", 405, ""},
		{"GET", "/", 404, ""},
		{"GET", "/debug/pprof/", 404, ""},
		{"GET", "/metrics/x", 404, ""},
	} {
		req, _ := http.NewRequest(tt.method, web.URL+tt.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.want || !strings.Contains(string(body), tt.body) {
			t.Errorf("%s %s: %s, want %d with %q", tt.method, tt.path, resp.Status, tt.want, tt.body)
		}
	}
}
