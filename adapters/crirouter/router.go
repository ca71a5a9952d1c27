// Package crirouter is the inbound adapter of a mixed node: it stands in
// front of Virtlet's CRI server and forwards every call that concerns a
// container pod (a pod that does not ask for Virtlet) to a container runtime
// such as containerd, over that runtime's own CRI socket. VM pods never
// leave the local server.
//
// Routing decisions live here and nowhere else:
//   - RunPodSandbox: Virtlet's when the pod claims it (core.ClaimsPod: the
//     target-runtime annotation or the virtlet RuntimeClass handler), else
//     forwarded.
//   - calls naming a sandbox or a container: the owner of the ID, which the
//     local server answers from the core's records (so ownership survives
//     daemon restarts with no table of its own); an ID Virtlet does not know
//     is the forward runtime's.
//   - images: virtlet.cloud/ names and the IDs of VM images are Virtlet's,
//     every other image is the forward runtime's.
//   - lists and filesystem usage: both sides, merged; a filter naming an ID
//     goes to that ID's owner only.
//   - Status: both sides must be ready for the node to be.
package crirouter

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/adapters/cri"
	"github.com/virtlet/virtlet/core"
)

// Local is Virtlet's own CRI server with the ownership questions routing
// asks of it (cri.Server implements it).
type Local interface {
	cri.Services
	ClaimsPod(config *runtimeapi.PodSandboxConfig, handler string) bool
	OwnsSandbox(id string) bool
	OwnsContainer(id string) bool
	OwnsImage(ctx context.Context, image string) bool
}

// defaultTimeout bounds a forwarded call whose caller set no deadline
// (kubelet sets one: its runtime request timeout, 2 min by default).
const defaultTimeout = 4 * time.Minute

// maxMessage matches the CRI server's own message limit (kubelet's too).
const maxMessage = 16 << 20

// Router serves the CRI services, forwarding container pods' calls.
type Router struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	local    Local
	endpoint string
	conn     *grpc.ClientConn
	runtime  runtimeapi.RuntimeServiceClient
	images   runtimeapi.ImageServiceClient
	log      logrus.FieldLogger
}

var _ cri.Services = (*Router)(nil)

// New returns a router forwarding to the CRI runtime at endpoint
// (unix:///run/containerd/containerd.sock). It connects lazily: a runtime
// that is not up yet makes forwarded calls and Status fail, naming it, until
// it is.
func New(endpoint string, local Local, log logrus.FieldLogger) (*Router, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok || path == "" || !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("forward runtime endpoint %q: want unix:///absolute/path/to/the/cri.sock", endpoint)
	}
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)))
	if err != nil {
		return nil, fmt.Errorf("forward runtime %s: %w", endpoint, err)
	}
	return &Router{
		local: local, endpoint: endpoint, conn: conn,
		runtime: runtimeapi.NewRuntimeServiceClient(conn), images: runtimeapi.NewImageServiceClient(conn),
		log: log,
	}, nil
}

// Close drops the connection to the forward runtime.
func (r *Router) Close() error { return r.conn.Close() }

// Endpoint is the forward runtime's socket.
func (r *Router) Endpoint() string { return r.endpoint }

// RemoteVersion asks the forward runtime who it is (for the daemon's
// start-up log and checks).
func (r *Router) RemoteVersion(ctx context.Context) (*runtimeapi.VersionResponse, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	v, err := r.runtime.Version(ctx, &runtimeapi.VersionRequest{Version: "v1"})
	return v, r.wrap(err)
}

// RemoteCgroupDriver is the cgroup driver the forward runtime uses, or "" when
// it does not tell (RuntimeConfig is newer than containerd 1.6).
func (r *Router) RemoteCgroupDriver(ctx context.Context) (string, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	resp, err := r.runtime.RuntimeConfig(ctx, &runtimeapi.RuntimeConfigRequest{})
	if status.Code(err) == codes.Unimplemented {
		return "", nil
	}
	if err != nil {
		return "", r.wrap(err)
	}
	if resp.GetLinux().GetCgroupDriver() == runtimeapi.CgroupDriver_SYSTEMD {
		return "systemd", nil
	}
	return "cgroupfs", nil
}

// forward marks ctx's call as served by the forward runtime and bounds it.
func (r *Router) forward(ctx context.Context) (context.Context, context.CancelFunc) {
	cri.NoteForwarded(ctx, r.endpoint)
	return bounded(ctx)
}

func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultTimeout)
}

// wrap names the forward runtime in its errors, keeping their gRPC code
// (kubelet acts on NotFound and friends).
func (r *Router) wrap(err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	return status.Errorf(st.Code(), "forward runtime %s: %s", r.endpoint, st.Message())
}

// viaSandbox answers whether the sandbox id is forwarded.
func (r *Router) viaSandbox(id string) bool { return !r.local.OwnsSandbox(id) }

// viaContainer answers whether the container id is forwarded.
func (r *Router) viaContainer(id string) bool { return !r.local.OwnsContainer(id) }

// viaImage answers whether the image is forwarded.
func (r *Router) viaImage(ctx context.Context, image *runtimeapi.ImageSpec) bool {
	return !r.local.OwnsImage(ctx, image.GetImage())
}

// Runtime service.

func (r *Router) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return r.local.Version(ctx, req)
}

func (r *Router) RuntimeConfig(ctx context.Context, req *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	return r.local.RuntimeConfig(ctx, req)
}

func (r *Router) UpdateRuntimeConfig(ctx context.Context, req *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	resp, err := r.local.UpdateRuntimeConfig(ctx, req)
	if err != nil {
		return nil, err
	}
	fctx, cancel := r.forward(ctx)
	defer cancel()
	if _, err := r.runtime.UpdateRuntimeConfig(fctx, req); err != nil {
		return nil, r.wrap(err)
	}
	return resp, nil
}

func (r *Router) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	if r.local.ClaimsPod(req.GetConfig(), req.GetRuntimeHandler()) {
		return r.local.RunPodSandbox(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.RunPodSandbox(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	if !r.viaSandbox(req.PodSandboxId) {
		return r.local.StopPodSandbox(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.StopPodSandbox(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	if !r.viaSandbox(req.PodSandboxId) {
		return r.local.RemovePodSandbox(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.RemovePodSandbox(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if !r.viaSandbox(req.PodSandboxId) {
		return r.local.PodSandboxStatus(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.PodSandboxStatus(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	if id := req.GetFilter().GetId(); id != "" {
		if !r.viaSandbox(id) {
			return r.local.ListPodSandbox(ctx, req)
		}
		fctx, cancel := r.forward(ctx)
		defer cancel()
		resp, err := r.runtime.ListPodSandbox(fctx, req)
		return resp, r.wrap(err)
	}
	resp, err := r.local.ListPodSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	fctx, cancel := bounded(ctx)
	defer cancel()
	more, err := r.runtime.ListPodSandbox(fctx, req)
	if err != nil {
		return nil, r.wrap(err)
	}
	// resp may carry its items pre-encoded (the CRI server's wire cache):
	// the forwarded ones are added to it, never copied into a new reply.
	resp.Items = append(resp.Items, more.Items...)
	return resp, nil
}

func (r *Router) PodSandboxStats(ctx context.Context, req *runtimeapi.PodSandboxStatsRequest) (*runtimeapi.PodSandboxStatsResponse, error) {
	if !r.viaSandbox(req.PodSandboxId) {
		return r.local.PodSandboxStats(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.PodSandboxStats(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) ListPodSandboxStats(ctx context.Context, req *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	if id := req.GetFilter().GetId(); id != "" {
		if !r.viaSandbox(id) {
			return r.local.ListPodSandboxStats(ctx, req)
		}
		fctx, cancel := r.forward(ctx)
		defer cancel()
		resp, err := r.runtime.ListPodSandboxStats(fctx, req)
		return resp, r.wrap(err)
	}
	resp, err := r.local.ListPodSandboxStats(ctx, req)
	if err != nil {
		return nil, err
	}
	fctx, cancel := bounded(ctx)
	defer cancel()
	more, err := r.runtime.ListPodSandboxStats(fctx, req)
	if err != nil {
		return nil, r.wrap(err)
	}
	resp.Stats = append(resp.Stats, more.Stats...)
	return resp, nil
}

func (r *Router) UpdatePodSandboxResources(ctx context.Context, req *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	if !r.viaSandbox(req.PodSandboxId) {
		return r.local.UpdatePodSandboxResources(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.UpdatePodSandboxResources(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) PortForward(ctx context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	if !r.viaSandbox(req.PodSandboxId) {
		return r.local.PortForward(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.PortForward(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	if !r.viaSandbox(req.PodSandboxId) {
		return r.local.CreateContainer(ctx, req)
	}
	if image := req.GetConfig().GetImage().GetImage(); core.IsVMImageName(image) {
		// A VM image in a container pod: the pod forgot to ask for Virtlet.
		pod := req.GetSandboxConfig().GetMetadata()
		return nil, status.Errorf(codes.InvalidArgument,
			"pod %s/%s: container %q has the VM image %s but the pod is a container pod: "+
				"a VM pod needs the annotation kubernetes.io/target-runtime: virtlet.cloud or runtimeClassName: virtlet",
			pod.GetNamespace(), pod.GetName(), req.GetConfig().GetMetadata().GetName(), image)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.CreateContainer(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.StartContainer(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.StartContainer(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.StopContainer(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.StopContainer(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.RemoveContainer(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.RemoveContainer(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.ContainerStatus(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.ContainerStatus(ctx, req)
	return resp, r.wrap(err)
}

// containersOwner routes a container list filtered by container or
// sandbox ID: local, forwarded, or both (no ID in the filter).
func (r *Router) containersOwner(containerID, sandboxID string) (local, forwarded bool) {
	switch {
	case containerID != "":
		f := r.viaContainer(containerID)
		return !f, f
	case sandboxID != "":
		f := r.viaSandbox(sandboxID)
		return !f, f
	}
	return true, true
}

func (r *Router) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	local, forwarded := r.containersOwner(req.GetFilter().GetId(), req.GetFilter().GetPodSandboxId())
	resp := &runtimeapi.ListContainersResponse{}
	if local {
		// Kept whole: its items may be pre-encoded (the wire cache).
		var err error
		if resp, err = r.local.ListContainers(ctx, req); err != nil {
			return nil, err
		}
	}
	if forwarded {
		fctx, cancel := bounded(ctx)
		defer cancel()
		if !local {
			cri.NoteForwarded(ctx, r.endpoint)
		}
		f, err := r.runtime.ListContainers(fctx, req)
		if err != nil {
			return nil, r.wrap(err)
		}
		resp.Containers = append(resp.Containers, f.Containers...)
	}
	return resp, nil
}

func (r *Router) ListContainerStats(ctx context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	local, forwarded := r.containersOwner(req.GetFilter().GetId(), req.GetFilter().GetPodSandboxId())
	resp := &runtimeapi.ListContainerStatsResponse{}
	if local {
		var err error
		if resp, err = r.local.ListContainerStats(ctx, req); err != nil {
			return nil, err
		}
	}
	if forwarded {
		fctx, cancel := bounded(ctx)
		defer cancel()
		if !local {
			cri.NoteForwarded(ctx, r.endpoint)
		}
		f, err := r.runtime.ListContainerStats(fctx, req)
		if err != nil {
			return nil, r.wrap(err)
		}
		resp.Stats = append(resp.Stats, f.Stats...)
	}
	return resp, nil
}

func (r *Router) ContainerStats(ctx context.Context, req *runtimeapi.ContainerStatsRequest) (*runtimeapi.ContainerStatsResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.ContainerStats(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.ContainerStats(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.UpdateContainerResources(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.UpdateContainerResources(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) ReopenContainerLog(ctx context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.ReopenContainerLog(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.ReopenContainerLog(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) CheckpointContainer(ctx context.Context, req *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.CheckpointContainer(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.CheckpointContainer(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.ExecSync(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.ExecSync(ctx, req)
	return resp, r.wrap(err)
}

// Exec, Attach and PortForward of forwarded pods answer with the forward
// runtime's own streaming URLs: kubelet (or crictl) connects to them.

func (r *Router) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.Exec(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.Exec(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) Attach(ctx context.Context, req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	if !r.viaContainer(req.ContainerId) {
		return r.local.Attach(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.runtime.Attach(ctx, req)
	return resp, r.wrap(err)
}

// Status: the node is ready when both Virtlet and the forward runtime are;
// a condition that is false on the forward side says so, naming it.
func (r *Router) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	resp, err := r.local.Status(ctx, req)
	if err != nil {
		return nil, err
	}
	fctx, cancel := bounded(ctx)
	defer cancel()
	fwd, ferr := r.runtime.Status(fctx, &runtimeapi.StatusRequest{})
	for _, c := range resp.GetStatus().GetConditions() {
		if !c.Status {
			continue
		}
		if ferr != nil {
			c.Status, c.Reason = false, "ForwardRuntimeUnreachable"
			c.Message = r.wrap(ferr).Error()
			continue
		}
		for _, fc := range fwd.GetStatus().GetConditions() {
			if fc.Type == c.Type && !fc.Status {
				c.Status, c.Reason = false, "ForwardRuntime"+fc.Reason
				c.Message = fmt.Sprintf("forward runtime %s: %s", r.endpoint, fc.Message)
			}
		}
	}
	if req.Verbose {
		if resp.Info == nil {
			resp.Info = map[string]string{}
		}
		info := fmt.Sprintf(`{"endpoint": %q, "reachable": %t}`, r.endpoint, ferr == nil)
		resp.Info["forwardRuntime"] = info
	}
	return resp, nil
}

// GetContainerEvents (kubelet's Evented PLEG, a feature gate that is off by
// default) is not served: kubelet falls back to polling.
func (r *Router) GetContainerEvents(*runtimeapi.GetEventsRequest, grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	return status.Error(codes.Unimplemented, "container events are not served by Virtlet (kubelet's Evented PLEG is off by default; kubelet polls)")
}

func (r *Router) ListMetricDescriptors(ctx context.Context, req *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	return r.local.ListMetricDescriptors(ctx, req)
}

func (r *Router) ListPodSandboxMetrics(ctx context.Context, req *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	return r.local.ListPodSandboxMetrics(ctx, req)
}

// Image service.

func (r *Router) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	if !r.viaImage(ctx, req.GetImage()) {
		return r.local.PullImage(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.images.PullImage(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	if !r.viaImage(ctx, req.GetImage()) {
		return r.local.ImageStatus(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.images.ImageStatus(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	if !r.viaImage(ctx, req.GetImage()) {
		return r.local.RemoveImage(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := r.images.RemoveImage(ctx, req)
	return resp, r.wrap(err)
}

func (r *Router) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	if image := req.GetFilter().GetImage(); image.GetImage() != "" {
		if !r.viaImage(ctx, image) {
			return r.local.ListImages(ctx, req)
		}
		fctx, cancel := r.forward(ctx)
		defer cancel()
		resp, err := r.images.ListImages(fctx, req)
		return resp, r.wrap(err)
	}
	resp, err := r.local.ListImages(ctx, req)
	if err != nil {
		return nil, err
	}
	fctx, cancel := bounded(ctx)
	defer cancel()
	more, err := r.images.ListImages(fctx, req)
	if err != nil {
		return nil, r.wrap(err)
	}
	resp.Images = append(resp.Images, more.Images...)
	return resp, nil
}

// ImageFsInfo lists the filesystems of both (Virtlet's first: kubelet reads
// the first image filesystem for its image garbage collection). It is also
// the call kubelet and crictl make to check that a CRI image service
// answers: while the forward runtime is unreachable the reply holds
// Virtlet's filesystems only, so that VM pods stay manageable; Status says
// the node is not ready and the lists fail, naming the forward runtime.
func (r *Router) ImageFsInfo(ctx context.Context, req *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	resp, err := r.local.ImageFsInfo(ctx, req)
	if err != nil {
		return nil, err
	}
	fctx, cancel := bounded(ctx)
	defer cancel()
	more, err := r.images.ImageFsInfo(fctx, req)
	if status.Code(err) == codes.Unavailable {
		r.log.WithError(r.wrap(err)).Warn("image filesystems: the forward runtime is unreachable, reporting Virtlet's only")
		return resp, nil
	}
	if err != nil {
		return nil, r.wrap(err)
	}
	resp.ImageFilesystems = append(resp.ImageFilesystems, more.ImageFilesystems...)
	resp.ContainerFilesystems = append(resp.ContainerFilesystems, more.ContainerFilesystems...)
	return resp, nil
}
