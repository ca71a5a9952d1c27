package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	logrustest "github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/fakes"
)

func newServer(t *testing.T) *Server {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	rt, err := core.New(core.Deps{Hypervisor: fakehypervisor.New(), ImageSources: map[string]ports.ImageSource{"https": fakes.NewImageSource()},
		ImageFiles: fakes.NewImageFiles(t.TempDir()), Store: fakes.NewStore(),
		Datasources: map[string]ports.Datasource{"nocloud": fakes.NewDatasource("nocloud")}}, core.Options{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rt.Run(ctx)
	if err := rt.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	return New(rt, Info{Version: "test"}, log)
}

func podConfig(name string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:    &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + name},
		Labels:      map[string]string{"app": name, "tier": "vm"},
		Annotations: map[string]string{"kubernetes.io/target-runtime": "virtlet.cloud", "note": name},
	}
}

// roundTrip marshals a reply as gRPC would and decodes it as a client would.
func roundTrip[T proto.Message](t *testing.T, reply T, fresh T) T {
	t.Helper()
	b, err := proto.Marshal(reply)
	if err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(b, fresh); err != nil {
		t.Fatal(err)
	}
	return fresh
}

func TestCachedListsDecodeLikeFreshOnesAndNeverGoStale(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	var ids []string
	for i := 0; i < 5; i++ {
		r, err := s.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podConfig(fmt.Sprintf("p%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.PodSandboxId)
	}
	img, err := s.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "virtlet.cloud/example.com/x.img"}})
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := s.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: ids[0], Config: &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "vm"}, Image: &runtimeapi.ImageSpec{Image: img.ImageRef},
		Labels: map[string]string{"c": "1"}}})
	if err != nil {
		t.Fatal(err)
	}

	check := func(when string, filter *runtimeapi.PodSandboxFilter) {
		t.Helper()
		reply, err := s.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: filter})
		if err != nil {
			t.Fatal(err)
		}
		got := roundTrip(t, reply, &runtimeapi.ListPodSandboxResponse{})
		want := &runtimeapi.ListPodSandboxResponse{}
		f := core.SandboxFilter{}
		if filter != nil {
			f.ID = filter.Id
		}
		for _, sb := range s.rt.ListSandboxes(f) {
			want.Items = append(want.Items, podSandbox(sb))
		}
		if !proto.Equal(got, want) {
			t.Fatalf("%s: cached list differs from a fresh one:\n got %v\nwant %v", when, got, want)
		}
	}
	check("first list", nil)
	check("second list, from the cache", nil)
	if _, err := s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: ids[1]}); err != nil {
		t.Fatal(err)
	}
	check("after a state change", nil)
	reply, _ := s.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	for _, it := range roundTrip(t, reply, &runtimeapi.ListPodSandboxResponse{}).Items {
		if it.Id == ids[1] && it.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			t.Fatalf("stale state %v", it.State)
		}
	}
	check("filtered", &runtimeapi.PodSandboxFilter{Id: ids[2][:10]})
	if _, err := s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: ids[3]}); err != nil {
		t.Fatal(err)
	}
	check("after a removal", nil)
	if _, ok := s.sandboxWire.items[ids[3]]; ok {
		t.Fatal("the cache keeps a removed sandbox")
	}

	// Containers likewise.
	list := func() *runtimeapi.ListContainersResponse {
		r, err := s.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return roundTrip(t, r, &runtimeapi.ListContainersResponse{})
	}
	if l := list(); len(l.Containers) != 1 || l.Containers[0].Id != ctr.ContainerId || l.Containers[0].State != runtimeapi.ContainerState_CONTAINER_CREATED ||
		l.Containers[0].Labels["c"] != "1" || l.Containers[0].ImageRef != img.ImageRef {
		t.Fatalf("containers %v", l)
	}
	if _, err := s.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		t.Fatal(err)
	}
	if l := list(); l.Containers[0].State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("stale container state %v", l.Containers[0].State)
	}
}

func TestSandboxConfigConversion(t *testing.T) {
	c := podConfig("p")
	c.DnsConfig = &runtimeapi.DNSConfig{Servers: []string{"198.18.0.10"}, Searches: []string{"ns.svc.cluster.local"}, Options: []string{"ndots:5"}}
	c.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_UDP, ContainerPort: 53, HostPort: 5353, HostIp: "127.0.0.1"}}
	c.Linux = &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}
	c.LogDirectory, c.Hostname = "/var/log/pods/x", "host"
	got := sandboxConfig(c, "virtlet")
	if got.Name != "p" || got.Namespace != "ns" || got.UID != "uid-p" || got.RuntimeHandler != "virtlet" || !got.HostNetwork ||
		got.DNS.Servers[0] != "198.18.0.10" || got.DNS.Options[0] != "ndots:5" || got.LogDirectory != "/var/log/pods/x" || got.Hostname != "host" ||
		got.PortMappings[0] != (ports.PortMapping{Protocol: "UDP", ContainerPort: 53, HostPort: 5353, HostIP: "127.0.0.1"}) {
		t.Fatalf("converted %+v", got)
	}
}

func TestErrorCodes(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("x: %w", ports.ErrNotFound), codes.NotFound},
		{&ports.InvalidError{Field: "annotation VirtletVCPUCount", Value: "lots"}, codes.InvalidArgument},
		{fmt.Errorf("x: %w", ports.ErrFailedPrecondition), codes.FailedPrecondition},
		{&ports.UnavailableError{Plugin: "libvirt", Kind: ports.KindHypervisor, Reason: "restarting"}, codes.Unavailable},
		{fmt.Errorf("x: %w", ports.ErrUnimplemented), codes.Unimplemented},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{errors.New("boom"), codes.Unknown},
	} {
		st := status.Convert(toStatus(tt.err))
		if st.Code() != tt.code || st.Message() != tt.err.Error() {
			t.Errorf("%v → %v %q, want %v", tt.err, st.Code(), st.Message(), tt.code)
		}
	}
}

func TestImageStatusOfAbsentImageIsEmptyNotAnError(t *testing.T) {
	s := newServer(t)
	r, err := s.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "virtlet.cloud/example.com/absent"}})
	if err != nil || r.Image != nil {
		t.Fatalf("%v %v", r, err)
	}
}

func TestUnsupportedCallsSayWhy(t *testing.T) {
	s := newServer(t)
	_, err := s.CheckpointContainer(context.Background(), &runtimeapi.CheckpointContainerRequest{ContainerId: "x"})
	if st := status.Convert(toStatus(err)); st.Code() != codes.Unimplemented || !strings.Contains(st.Message(), "checkpoint") {
		t.Fatalf("%v", st)
	}
	_, err = s.Exec(context.Background(), &runtimeapi.ExecRequest{ContainerId: "x", Cmd: []string{"true"}, Stdout: true})
	if st := status.Convert(toStatus(err)); st.Code() != codes.Unimplemented || !strings.Contains(st.Message(), "streaming server") {
		t.Fatalf("Exec without a streaming server: %v", st)
	}
}

func TestRuntimeConfigNamesTheCgroupDriver(t *testing.T) {
	for driver, want := range map[string]runtimeapi.CgroupDriver{"systemd": runtimeapi.CgroupDriver_SYSTEMD, "cgroupfs": runtimeapi.CgroupDriver_CGROUPFS} {
		s := newServer(t)
		s.info.CgroupDriver = driver
		r, err := s.RuntimeConfig(context.Background(), &runtimeapi.RuntimeConfigRequest{})
		if err != nil || r.GetLinux().GetCgroupDriver() != want {
			t.Errorf("%s: %v %v", driver, r, err)
		}
	}
}

func TestExecRefusals(t *testing.T) {
	s := newServer(t)
	for _, tt := range []struct {
		name string
		cmd  []string
		code codes.Code
		want string
	}{
		{"empty command", nil, codes.InvalidArgument, "cmd: the command is empty"},
		{"empty program", []string{""}, codes.InvalidArgument, "cmd: the command is empty"},
		{"Virtlet's own command", []string{"virtlet.cloud:diag"}, codes.InvalidArgument, "exec streams only"},
		{"unknown container", []string{"true"}, codes.NotFound, "container x"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: "x", Cmd: tt.cmd, Timeout: 1})
			if st := status.Convert(toStatus(err)); st.Code() != tt.code || !strings.Contains(st.Message(), tt.want) {
				t.Fatalf("%v, want %v %q", st, tt.code, tt.want)
			}
		})
	}
}

// A NotFound that the pod's author can mend (a ConfigMap its annotations
// name, an image) is logged at info with the pod; kubelet's routine
// status calls for what it removed stay at debug.
func TestNotFoundLogLevels(t *testing.T) {
	s := newServer(t)
	log, hook := logrustest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	s.log = log
	missing := func(ctx context.Context, req interface{}) (interface{}, error) {
		return nil, fmt.Errorf("configmap ns/absent: %w", ports.ErrNotFound)
	}
	for _, tc := range []struct {
		method string
		req    interface{}
		level  logrus.Level
	}{
		{"CreateContainer", &runtimeapi.CreateContainerRequest{SandboxConfig: podConfig("p")}, logrus.InfoLevel},
		{"PullImage", &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "virtlet.cloud/absent"}, SandboxConfig: podConfig("p")}, logrus.InfoLevel},
		{"ContainerStatus", &runtimeapi.ContainerStatusRequest{ContainerId: "gone"}, logrus.DebugLevel},
	} {
		hook.Reset()
		s.instrument(context.Background(), tc.req, &grpc.UnaryServerInfo{FullMethod: "/runtime.v1.RuntimeService/" + tc.method}, missing)
		e := hook.LastEntry()
		if e == nil || e.Level != tc.level || e.Message != "CRI call failed" {
			t.Errorf("%s: %+v, want %s", tc.method, e, tc.level)
			continue
		}
		if tc.level == logrus.InfoLevel && e.Data["pod"] != "ns/p" {
			t.Errorf("%s: the entry does not name the pod: %v", tc.method, e.Data)
		}
	}
}
