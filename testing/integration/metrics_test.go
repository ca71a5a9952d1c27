package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/testing/harness"
	"github.com/virtlet/virtlet/testing/promtest"
)

// metricsURL finds where the daemon serves its metrics (it logs the port
// it picked).
func metricsURL(t *testing.T, d *harness.Daemon) string {
	t.Helper()
	for _, e := range d.LogEntries() {
		if strings.HasPrefix(fmt.Sprint(e["msg"]), "serving metrics") {
			return "http://" + fmt.Sprint(e["address"])
		}
	}
	t.Fatalf("the daemon logs no metrics address:\n%s", d.Log())
	return ""
}

// sampleValue is a gauge's or counter's value, a histogram's count; -1
// when the series is missing.
func sampleValue(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	return promtest.Value(promtest.Series(fams, name, labels))
}

// An operator's Prometheus scraping the daemon sees the calls crictl made,
// the VM pods, the plugins (one of them restarted), the pull, the VM's
// phases and usage, and the exec session.
func TestMetricsEndpoint(t *testing.T) {
	d, c := startDaemonWith(t, []string{"--metrics-address", "127.0.0.1:0"})
	url := metricsURL(t, d)

	c.Must(t, "pull", image)
	var sandboxes []string
	for _, name := range []string{"metrics-a", "metrics-b"} {
		pod, _ := vmPod(t, d, name, nil)
		sandboxes = append(sandboxes, c.Must(t, "runp", pod))
	}
	pod, ctrCfg := vmPod(t, d, "metrics-a", nil)
	ctr := c.Must(t, "create", sandboxes[0], ctrCfg, pod)
	c.Must(t, "start", ctr)
	if out := c.Must(t, "exec", ctr, "hostname"); out != "metrics-a" {
		t.Fatalf("exec hostname: %q", out)
	}
	c.Must(t, "exec", "-s", ctr, "hostname")
	rt, _ := d.CRI(t)
	if _, err := rt.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: "nosuch"}); status.Code(err) != codes.NotFound {
		t.Fatalf("status of an unknown container: %v", err)
	}
	// The image plugin dies; the supervisor brings it back.
	if err := syscall.Kill(pluginPID(t, d, "image"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var fams map[string]*dto.MetricFamily
	images := map[string]string{"plugin": "fake-images", "kind": "image"}
	harness.Eventually(t, 20*time.Second, "the image plugin to restart", func() bool {
		fams = promtest.Scrape(t, url)
		return sampleValue(fams, "virtlet_plugin_restarts_total", images) == 1 && sampleValue(fams, "virtlet_plugin_up", images) == 1
	})

	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"virtlet_cri_request_duration_seconds", map[string]string{"method": "RunPodSandbox", "code": "OK", "runtime": "virtlet"}, 2},
		{"virtlet_cri_request_duration_seconds", map[string]string{"method": "PullImage", "code": "OK"}, 1},
		{"virtlet_cri_request_duration_seconds", map[string]string{"method": "CreateContainer", "code": "OK"}, 1},
		{"virtlet_cri_request_duration_seconds", map[string]string{"method": "StartContainer", "code": "OK"}, 1},
		{"virtlet_cri_request_duration_seconds", map[string]string{"method": "ExecSync", "code": "OK"}, 1},
		{"virtlet_cri_request_duration_seconds", map[string]string{"method": "Exec", "code": "OK"}, 1},
		{"virtlet_cri_request_duration_seconds", map[string]string{"method": "ContainerStatus", "code": "NotFound"}, 1},
		{"virtlet_cri_stream_session_duration_seconds", map[string]string{"kind": "exec", "result": "ok"}, 1},
		{"virtlet_cri_stream_sessions_active", map[string]string{"kind": "exec"}, 0},
		{"virtlet_sandboxes", map[string]string{"state": "ready"}, 2},
		{"virtlet_sandboxes", map[string]string{"state": "notready"}, 0},
		{"virtlet_containers", map[string]string{"state": "running"}, 1},
		{"virtlet_containers", map[string]string{"state": "created"}, 0},
		{"virtlet_image_pull_duration_seconds", map[string]string{"scheme": "https"}, 1},
		{"virtlet_image_pull_failures_total", map[string]string{"reason": "not_found"}, 0},
		{"virtlet_vm_phase_duration_seconds", map[string]string{"phase": "volumes"}, 1},
		{"virtlet_vm_phase_duration_seconds", map[string]string{"phase": "cloud_init"}, 1},
		{"virtlet_vm_phase_duration_seconds", map[string]string{"phase": "define"}, 1},
		{"virtlet_vm_phase_duration_seconds", map[string]string{"phase": "start"}, 1},
		{"virtlet_vm_phase_duration_seconds", map[string]string{"phase": "network"}, 0}, // no network plugin here
		{"virtlet_vm_stats_success", nil, 1},
		{"virtlet_plugin_restarts_total", map[string]string{"plugin": "fake-hypervisor", "kind": "hypervisor"}, 0},
	} {
		if got := sampleValue(fams, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if n := len(fams["virtlet_plugin_up"].GetMetric()); n != pluginCount {
		t.Errorf("%d plugins with plugin_up, want %d", n, pluginCount)
	}
	for _, m := range fams["virtlet_plugin_up"].GetMetric() {
		if m.Gauge.GetValue() != 1 {
			t.Errorf("plugin_up %v = %v", m.Label, m.Gauge.GetValue())
		}
	}
	if v := sampleValue(fams, "virtlet_image_pull_bytes_total", map[string]string{"scheme": "https"}); v <= 0 {
		t.Errorf("pulled bytes %v", v)
	}
	vm := map[string]string{"namespace": "default", "pod": "metrics-a", "container": "metrics-a", "container_id": ctr}
	if v := sampleValue(fams, "virtlet_vm_cpu_seconds_total", vm); v < 0 {
		t.Errorf("no CPU figure of the VM %v among %v", vm, fams["virtlet_vm_cpu_seconds_total"])
	}
	if v := sampleValue(fams, "virtlet_vm_memory_bytes", vm); v <= 0 {
		t.Errorf("VM memory %v", v)
	}

	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		t.Errorf("/healthz: %s %q", resp.Status, body)
	}
}

// Without --metrics-address there is no endpoint, and nothing listens.
func TestMetricsOffByDefault(t *testing.T) {
	d, _ := startDaemon(t)
	for _, e := range d.LogEntries() {
		if strings.HasPrefix(fmt.Sprint(e["msg"]), "serving metrics") {
			t.Fatalf("metrics served by default: %v", e)
		}
	}
}
