package crirouter

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// side is one CRI service of the test: it answers every routed call with
// its own name, so that a test sees who served it.
type side struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer
	name string

	mu    sync.Mutex
	calls []string
}

func (s *side) called(call string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call)
}

func (s *side) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.calls) == 0 {
		return ""
	}
	return s.calls[len(s.calls)-1]
}

func (s *side) RunPodSandbox(_ context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	s.called("RunPodSandbox")
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: s.name + "-sb"}, nil
}

func (s *side) StartContainer(_ context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	s.called("StartContainer " + req.ContainerId)
	return &runtimeapi.StartContainerResponse{}, nil
}

func (s *side) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	s.called("ContainerStatus " + req.ContainerId)
	return nil, status.Errorf(codes.NotFound, "container %s not found", req.ContainerId)
}

// Stops and removes of unknown IDs are answered NotFound, as containerd
// 1.6 does.
func (s *side) StopPodSandbox(_ context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	s.called("StopPodSandbox " + req.PodSandboxId)
	return nil, status.Errorf(codes.NotFound, "an error occurred when try to find sandbox %q: not found", req.PodSandboxId)
}

func (s *side) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	s.called("StopContainer " + req.ContainerId)
	return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", req.ContainerId)
}

func (s *side) RemoveContainer(_ context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	s.called("RemoveContainer " + req.ContainerId)
	return nil, status.Errorf(codes.NotFound, "container %q not found", req.ContainerId)
}

func (s *side) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	s.called("CreateContainer " + req.PodSandboxId)
	return &runtimeapi.CreateContainerResponse{ContainerId: s.name + "-ctr"}, nil
}

func (s *side) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	s.called("ListPodSandbox")
	resp := &runtimeapi.ListPodSandboxResponse{}
	item := &runtimeapi.PodSandbox{Id: s.name + "-sb"}
	if s.name != "local" {
		resp.Items = []*runtimeapi.PodSandbox{item}
		return resp, nil
	}
	// Virtlet's server answers lists with items pre-encoded (its wire
	// cache), as unknown fields of the reply.
	raw, err := proto.Marshal(&runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{item}})
	if err != nil {
		return nil, err
	}
	resp.ProtoReflect().SetUnknown(raw)
	return resp, nil
}

func (s *side) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	s.called("PullImage " + req.Image.Image)
	return &runtimeapi.PullImageResponse{ImageRef: s.name}, nil
}

func (s *side) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	s.called("ImageStatus " + req.Image.Image)
	return &runtimeapi.ImageStatusResponse{}, nil
}

func (s *side) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	s.called("Status")
	resp := &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true}, {Type: runtimeapi.NetworkReady, Status: s.name == "local", Reason: "NoCNI", Message: "no network config"},
	}}}
	// Virtlet's handlers have no container features; containerd's do.
	if s.name == "local" {
		resp.RuntimeHandlers = []*runtimeapi.RuntimeHandler{{Name: "", Features: &runtimeapi.RuntimeHandlerFeatures{}},
			{Name: "virtlet", Features: &runtimeapi.RuntimeHandlerFeatures{}}}
	} else {
		all := &runtimeapi.RuntimeHandlerFeatures{RecursiveReadOnlyMounts: true, UserNamespaces: true}
		resp.RuntimeHandlers = []*runtimeapi.RuntimeHandler{{Name: "", Features: all}, {Name: "runc", Features: all}}
		resp.Features = &runtimeapi.RuntimeFeatures{SupplementalGroupsPolicy: true}
	}
	return resp, nil
}

func (s *side) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{
		{FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: "/" + s.name}},
	}}, nil
}

// local is Virtlet's side: it owns the IDs and images it is told.
type local struct {
	*side
	sandboxes, containers, images map[string]bool
}

func (l *local) ClaimsPod(config *runtimeapi.PodSandboxConfig, handler string) bool {
	return handler == "virtlet" || config.GetAnnotations()["kubernetes.io/target-runtime"] == "virtlet.cloud"
}
func (l *local) OwnsSandbox(id string) bool   { return l.sandboxes[id] }
func (l *local) OwnsContainer(id string) bool { return l.containers[id] }
func (l *local) OwnsImage(_ context.Context, image string) bool {
	return strings.HasPrefix(image, "virtlet.cloud/") || l.images[image]
}

// newRouter starts a remote CRI service on a unix socket (unless down)
// and a router in front of a local one.
func newRouter(t *testing.T, down bool) (*Router, *local, *side) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "remote.sock")
	remote := &side{name: "remote"}
	if !down {
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		runtimeapi.RegisterRuntimeServiceServer(g, remote)
		runtimeapi.RegisterImageServiceServer(g, remote)
		go g.Serve(l)
		t.Cleanup(g.Stop)
	}
	loc := &local{side: &side{name: "local"},
		sandboxes: map[string]bool{"vm-sb": true}, containers: map[string]bool{"vm-ctr": true}, images: map[string]bool{"sha256:vm": true}}
	log := logrus.New()
	log.SetOutput(io.Discard)
	r, err := New("unix://"+sock, loc, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, loc, remote
}

func TestNewRejectsEndpoints(t *testing.T) {
	for _, ep := range []string{"", "/run/containerd.sock", "tcp://127.0.0.1:1", "unix://relative.sock"} {
		if _, err := New(ep, &local{side: &side{}}, logrus.New()); err == nil || !strings.Contains(err.Error(), "unix:///") {
			t.Errorf("endpoint %q: %v", ep, err)
		}
	}
}

func TestRouting(t *testing.T) {
	r, loc, remote := newRouter(t, false)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		side *side
		want string
	}{
		{"a VM pod by annotation", func() error {
			_, err := r.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
				Annotations: map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud"}}})
			return err
		}, loc.side, "RunPodSandbox"},
		{"a VM pod by RuntimeClass handler", func() error {
			_, err := r.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{}, RuntimeHandler: "virtlet"})
			return err
		}, loc.side, "RunPodSandbox"},
		{"a container pod", func() error {
			_, err := r.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{}})
			return err
		}, remote, "RunPodSandbox"},
		{"a pod of another target runtime", func() error {
			_, err := r.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
				Annotations: map[string]string{"kubernetes.io/target-runtime": "kata"}}})
			return err
		}, remote, "RunPodSandbox"},
		{"a VM's container", func() error {
			_, err := r.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "vm-ctr"})
			return err
		}, loc.side, "StartContainer vm-ctr"},
		{"a container of containerd", func() error {
			_, err := r.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "box-ctr"})
			return err
		}, remote, "StartContainer box-ctr"},
		{"a container in a container pod", func() error {
			_, err := r.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: "box-sb",
				Config: &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: "busybox"}}})
			return err
		}, remote, "CreateContainer box-sb"},
		{"a list filtered by a VM pod's ID", func() error {
			_, err := r.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: "vm-sb"}})
			return err
		}, loc.side, "ListPodSandbox"},
		{"a list filtered by a container pod's ID", func() error {
			_, err := r.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: "box-sb"}})
			return err
		}, remote, "ListPodSandbox"},
		{"a VM image", func() error {
			_, err := r.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "virtlet.cloud/cirros"}})
			return err
		}, loc.side, "PullImage virtlet.cloud/cirros"},
		{"a VM image by ID", func() error {
			_, err := r.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "sha256:vm"}})
			return err
		}, loc.side, "ImageStatus sha256:vm"},
		{"a container image", func() error {
			_, err := r.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "busybox:1"}})
			return err
		}, remote, "PullImage busybox:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err != nil {
				t.Fatal(err)
			}
			if got := tc.side.last(); got != tc.want {
				t.Errorf("%s served %q, want %q", tc.side.name, got, tc.want)
			}
		})
	}
}

func TestAVMImageInAContainerPodIsRefused(t *testing.T) {
	r, _, remote := newRouter(t, false)
	_, err := r.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: "box-sb",
		Config:        &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "vm"}, Image: &runtimeapi.ImageSpec{Image: "virtlet.cloud/cirros"}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns"}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "ns/p") || !strings.Contains(err.Error(), "runtimeClassName: virtlet") {
		t.Fatalf("VM image in a container pod: %v", err)
	}
	if remote.last() != "" {
		t.Errorf("forwarded anyway: %s", remote.last())
	}
}

func TestForwardedErrorsKeepTheirCodeAndNameTheRuntime(t *testing.T) {
	r, _, _ := newRouter(t, false)
	_, err := r.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: "gone"})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "forward runtime unix://") {
		t.Fatalf("forwarded NotFound: %v", err)
	}
}

// CRI's stops and removes are idempotent: an ID neither side knows is
// already gone, whatever the forward runtime answers (kubelet and critest
// rely on it), while other calls keep the NotFound.
func TestStopAndRemoveOfUnknownIDsSucceed(t *testing.T) {
	r, _, remote := newRouter(t, false)
	ctx := context.Background()
	if _, err := r.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: "gone"}); err != nil {
		t.Errorf("StopPodSandbox of an unknown sandbox: %v", err)
	}
	if _, err := r.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: "gone"}); err != nil {
		t.Errorf("StopContainer of an unknown container: %v", err)
	}
	if _, err := r.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: "gone"}); err != nil {
		t.Errorf("RemoveContainer of an unknown container: %v", err)
	}
	if got := remote.last(); got != "RemoveContainer gone" {
		t.Errorf("not asked of the forward runtime: last call %q", got)
	}
	if _, err := r.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "gone"}); status.Code(err) != codes.NotFound {
		t.Errorf("ContainerStatus of an unknown container: %v, want NotFound", err)
	}
}

func TestListsMergeKeepingPreEncodedItems(t *testing.T) {
	r, _, _ := newRouter(t, false)
	resp, err := r.ListPodSandbox(context.Background(), &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// What kubelet decodes from the wire.
	raw, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var got runtimeapi.ListPodSandboxResponse
	if err := proto.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, it := range got.Items {
		ids = append(ids, it.Id)
	}
	if strings.Join(ids, " ") != "remote-sb local-sb" && strings.Join(ids, " ") != "local-sb remote-sb" {
		t.Fatalf("merged list: %v", ids)
	}
}

func TestStatusNeedsBothSides(t *testing.T) {
	t.Run("a condition false on the forward side", func(t *testing.T) {
		r, _, _ := newRouter(t, false)
		resp, err := r.Status(context.Background(), &runtimeapi.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.Status.Conditions {
			switch c.Type {
			case runtimeapi.RuntimeReady:
				if !c.Status {
					t.Errorf("RuntimeReady: %+v", c)
				}
			case runtimeapi.NetworkReady:
				if c.Status || c.Reason != "ForwardRuntimeNoCNI" || !strings.Contains(c.Message, "no network config") {
					t.Errorf("NetworkReady: %+v", c)
				}
			}
		}
	})
	t.Run("runtime handlers of both sides", func(t *testing.T) {
		r, _, _ := newRouter(t, false)
		resp, err := r.Status(context.Background(), &runtimeapi.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, h := range resp.RuntimeHandlers {
			got = append(got, fmt.Sprintf("%q userns=%t rro=%t", h.Name, h.Features.UserNamespaces, h.Features.RecursiveReadOnlyMounts))
		}
		want := []string{`"virtlet" userns=false rro=false`, `"" userns=true rro=true`, `"runc" userns=true rro=true`}
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Errorf("handlers %v, want %v", got, want)
		}
		if !resp.GetFeatures().GetSupplementalGroupsPolicy() {
			t.Errorf("the forward runtime's features are not passed on: %v", resp.Features)
		}
	})
	t.Run("an unreachable forward runtime", func(t *testing.T) {
		r, _, _ := newRouter(t, true)
		ctx := context.Background()
		resp, err := r.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.Status.Conditions {
			if c.Status || c.Reason != "ForwardRuntimeUnreachable" || !strings.Contains(c.Message, r.Endpoint()) {
				t.Errorf("%s: %+v", c.Type, c)
			}
		}
		if len(resp.RuntimeHandlers) != 2 || resp.Features != nil {
			t.Errorf("without the forward runtime, Virtlet's own handlers alone: %v, features %v", resp.RuntimeHandlers, resp.Features)
		}
		if !strings.Contains(resp.Info["forwardRuntime"], `"reachable": false`) {
			t.Errorf("verbose info: %v", resp.Info)
		}
		// kubelet and crictl check the image service with ImageFsInfo:
		// it answers with Virtlet's filesystems, the lists fail.
		fs, err := r.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
		if err != nil || len(fs.ImageFilesystems) != 1 || fs.ImageFilesystems[0].FsId.Mountpoint != "/local" {
			t.Errorf("ImageFsInfo: %v %v", fs, err)
		}
		if _, err := r.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), r.Endpoint()) {
			t.Errorf("ListPodSandbox: %v", err)
		}
	})
}

func (s *side) ListMetricDescriptors(context.Context, *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	return &runtimeapi.ListMetricDescriptorsResponse{Descriptors: []*runtimeapi.MetricDescriptor{
		{Name: "container_cpu_usage_seconds_total", LabelKeys: []string{s.name}},
		{Name: s.name + "_only", LabelKeys: []string{"id"}},
	}}, nil
}

func (s *side) ListPodSandboxMetrics(context.Context, *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	return &runtimeapi.ListPodSandboxMetricsResponse{PodMetrics: []*runtimeapi.PodSandboxMetrics{{PodSandboxId: s.name + "-sb"}}}, nil
}

// A mixed node's metrics are both sides': for a name both describe,
// Virtlet's descriptor (kubelet keeps one per name). A forward runtime
// that does not answer costs its own metrics only.
func TestMetricsMergeVirtletsFirst(t *testing.T) {
	r, _, _ := newRouter(t, false)
	ctx := context.Background()
	descs, err := r.ListMetricDescriptors(ctx, &runtimeapi.ListMetricDescriptorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range descs.Descriptors {
		got = append(got, fmt.Sprintf("%s%v", d.Name, d.LabelKeys))
	}
	if want := "container_cpu_usage_seconds_total[local] local_only[id] remote_only[id]"; strings.Join(got, " ") != want {
		t.Errorf("descriptors %s, want %s", strings.Join(got, " "), want)
	}
	pods, err := r.ListPodSandboxMetrics(ctx, &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil || len(pods.PodMetrics) != 2 || pods.PodMetrics[0].PodSandboxId != "local-sb" || pods.PodMetrics[1].PodSandboxId != "remote-sb" {
		t.Errorf("pod metrics %v, %v", pods, err)
	}

	down, _, _ := newRouter(t, true)
	descs, err = down.ListMetricDescriptors(ctx, &runtimeapi.ListMetricDescriptorsRequest{})
	if err != nil || len(descs.Descriptors) != 2 {
		t.Errorf("forward runtime down: descriptors %v, %v; want Virtlet's", descs, err)
	}
	pods, err = down.ListPodSandboxMetrics(ctx, &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil || len(pods.PodMetrics) != 1 {
		t.Errorf("forward runtime down: pod metrics %v, %v; want Virtlet's", pods, err)
	}
}
