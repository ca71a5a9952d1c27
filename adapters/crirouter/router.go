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

// route serves req with local, or, when forwarded, with remote: the call
// is marked forwarded for the log, bounded, and its error names the forward
// runtime.
func route[Req, Resp any](r *Router, ctx context.Context, req Req, forwarded bool,
	local func(context.Context, Req) (Resp, error),
	remote func(context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	if !forwarded {
		return local(ctx, req)
	}
	ctx, cancel := r.forward(ctx)
	defer cancel()
	resp, err := remote(ctx, req)
	if err != nil {
		var none Resp
		return none, r.wrap(err)
	}
	return resp, nil
}

// idempotent makes a stop or remove of something neither side knows
// succeed, as CRI requires of these calls (kubelet retries them): an ID
// Virtlet does not know goes to the forward runtime, and some runtimes
// (containerd 1.6) answer NotFound for it.
func idempotent[Resp any, P interface{ *Resp }](r *Router, method, id string, resp P, err error) (P, error) {
	if err != nil && status.Code(err) == codes.NotFound {
		r.log.WithFields(logrus.Fields{"method": method, "id": id}).Debug("not found on either side: already gone")
		return P(new(Resp)), nil
	}
	return resp, err
}

// merged serves a list from one side, or from both when local and
// forwarded are set: the forwarded items are added to the local reply by
// add. That reply may carry its items pre-encoded (the CRI server's list
// cache), so it is never copied into a new one.
func merged[Req any, Resp any](r *Router, ctx context.Context, req Req, local, forwarded bool,
	localCall func(context.Context, Req) (Resp, error),
	remoteCall func(context.Context, Req, ...grpc.CallOption) (Resp, error),
	add func(into, from Resp)) (Resp, error) {
	if !local || !forwarded {
		return route(r, ctx, req, forwarded, localCall, remoteCall)
	}
	var none Resp
	resp, err := localCall(ctx, req)
	if err != nil {
		return none, err
	}
	fctx, cancel := bounded(ctx)
	defer cancel()
	more, err := remoteCall(fctx, req)
	if err != nil {
		return none, r.wrap(err)
	}
	add(resp, more)
	return resp, nil
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
	forwarded := !r.local.ClaimsPod(req.GetConfig(), req.GetRuntimeHandler())
	return route(r, ctx, req, forwarded, r.local.RunPodSandbox, r.runtime.RunPodSandbox)
}

func (r *Router) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	resp, err := route(r, ctx, req, r.viaSandbox(req.PodSandboxId), r.local.StopPodSandbox, r.runtime.StopPodSandbox)
	return idempotent(r, "StopPodSandbox", req.PodSandboxId, resp, err)
}

func (r *Router) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	resp, err := route(r, ctx, req, r.viaSandbox(req.PodSandboxId), r.local.RemovePodSandbox, r.runtime.RemovePodSandbox)
	return idempotent(r, "RemovePodSandbox", req.PodSandboxId, resp, err)
}

func (r *Router) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	return route(r, ctx, req, r.viaSandbox(req.PodSandboxId), r.local.PodSandboxStatus, r.runtime.PodSandboxStatus)
}

func (r *Router) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	local, forwarded := r.sandboxesOwner(req.GetFilter().GetId())
	return merged(r, ctx, req, local, forwarded, r.local.ListPodSandbox, r.runtime.ListPodSandbox,
		func(into, from *runtimeapi.ListPodSandboxResponse) { into.Items = append(into.Items, from.Items...) })
}

func (r *Router) PodSandboxStats(ctx context.Context, req *runtimeapi.PodSandboxStatsRequest) (*runtimeapi.PodSandboxStatsResponse, error) {
	return route(r, ctx, req, r.viaSandbox(req.PodSandboxId), r.local.PodSandboxStats, r.runtime.PodSandboxStats)
}

func (r *Router) ListPodSandboxStats(ctx context.Context, req *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	local, forwarded := r.sandboxesOwner(req.GetFilter().GetId())
	return merged(r, ctx, req, local, forwarded, r.local.ListPodSandboxStats, r.runtime.ListPodSandboxStats,
		func(into, from *runtimeapi.ListPodSandboxStatsResponse) {
			into.Stats = append(into.Stats, from.Stats...)
		})
}

func (r *Router) UpdatePodSandboxResources(ctx context.Context, req *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	return route(r, ctx, req, r.viaSandbox(req.PodSandboxId), r.local.UpdatePodSandboxResources, r.runtime.UpdatePodSandboxResources)
}

func (r *Router) PortForward(ctx context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	return route(r, ctx, req, r.viaSandbox(req.PodSandboxId), r.local.PortForward, r.runtime.PortForward)
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
	return route(r, ctx, req, true, r.local.CreateContainer, r.runtime.CreateContainer)
}

func (r *Router) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	return route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.StartContainer, r.runtime.StartContainer)
}

func (r *Router) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	resp, err := route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.StopContainer, r.runtime.StopContainer)
	return idempotent(r, "StopContainer", req.ContainerId, resp, err)
}

func (r *Router) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	resp, err := route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.RemoveContainer, r.runtime.RemoveContainer)
	return idempotent(r, "RemoveContainer", req.ContainerId, resp, err)
}

func (r *Router) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	return route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.ContainerStatus, r.runtime.ContainerStatus)
}

// sandboxesOwner routes a sandbox list filtered by ID: local, forwarded, or
// both (no ID in the filter).
func (r *Router) sandboxesOwner(sandboxID string) (local, forwarded bool) {
	if sandboxID == "" {
		return true, true
	}
	f := r.viaSandbox(sandboxID)
	return !f, f
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
	return merged(r, ctx, req, local, forwarded, r.local.ListContainers, r.runtime.ListContainers,
		func(into, from *runtimeapi.ListContainersResponse) {
			into.Containers = append(into.Containers, from.Containers...)
		})
}

func (r *Router) ListContainerStats(ctx context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	local, forwarded := r.containersOwner(req.GetFilter().GetId(), req.GetFilter().GetPodSandboxId())
	return merged(r, ctx, req, local, forwarded, r.local.ListContainerStats, r.runtime.ListContainerStats,
		func(into, from *runtimeapi.ListContainerStatsResponse) {
			into.Stats = append(into.Stats, from.Stats...)
		})
}

func (r *Router) ContainerStats(ctx context.Context, req *runtimeapi.ContainerStatsRequest) (*runtimeapi.ContainerStatsResponse, error) {
	return route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.ContainerStats, r.runtime.ContainerStats)
}

func (r *Router) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.UpdateContainerResources, r.runtime.UpdateContainerResources)
}

func (r *Router) ReopenContainerLog(ctx context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	return route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.ReopenContainerLog, r.runtime.ReopenContainerLog)
}

func (r *Router) CheckpointContainer(ctx context.Context, req *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	return route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.CheckpointContainer, r.runtime.CheckpointContainer)
}

func (r *Router) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	return route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.ExecSync, r.runtime.ExecSync)
}

// Exec, Attach and PortForward of forwarded pods answer with the forward
// runtime's own streaming URLs: kubelet (or crictl) connects to them.

func (r *Router) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	return route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.Exec, r.runtime.Exec)
}

func (r *Router) Attach(ctx context.Context, req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	return route(r, ctx, req, r.viaContainer(req.ContainerId), r.local.Attach, r.runtime.Attach)
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
	if ferr == nil {
		resp.RuntimeHandlers = mergeHandlers(resp.RuntimeHandlers, fwd.RuntimeHandlers)
		resp.Features = fwd.Features
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

// mergeHandlers is the node's runtime handlers: Virtlet's named ones (VM
// pods) and the forward runtime's others, its default handler among them
// (pods that are not VM pods go there, with its features: user
// namespaces, recursive read-only mounts).
func mergeHandlers(local, forward []*runtimeapi.RuntimeHandler) []*runtimeapi.RuntimeHandler {
	var out []*runtimeapi.RuntimeHandler
	mine := map[string]bool{}
	for _, h := range local {
		if h.Name != "" {
			out = append(out, h)
			mine[h.Name] = true
		}
	}
	for _, h := range forward {
		if !mine[h.Name] {
			out = append(out, h)
		}
	}
	return out
}

// GetContainerEvents (kubelet's Evented PLEG, a feature gate that is off by
// default) is not served: kubelet falls back to polling.
func (r *Router) GetContainerEvents(*runtimeapi.GetEventsRequest, grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	return status.Error(codes.Unimplemented, "container events are not served by Virtlet (kubelet's Evented PLEG is off by default; kubelet polls)")
}

// ListMetricDescriptors lists Virtlet's metrics, then the forward
// runtime's of other names: kubelet keeps one descriptor per name, and
// Virtlet's label keys fit containerd's metrics (adapters/cri/metrics.go).
// A forward runtime that does not answer costs its descriptors only.
func (r *Router) ListMetricDescriptors(ctx context.Context, req *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	return mergedMetrics(r, ctx, req, "ListMetricDescriptors", r.local.ListMetricDescriptors, r.runtime.ListMetricDescriptors,
		func(into, from *runtimeapi.ListMetricDescriptorsResponse) {
			have := map[string]bool{}
			for _, d := range into.Descriptors {
				have[d.Name] = true
			}
			for _, d := range from.Descriptors {
				if !have[d.Name] {
					into.Descriptors = append(into.Descriptors, d)
				}
			}
		})
}

// ListPodSandboxMetrics reports the VM pods' metrics and the forward
// runtime's pods'; a forward runtime that does not answer costs its pods'
// metrics only, so that kubelet's /metrics/cadvisor still shows the VMs.
func (r *Router) ListPodSandboxMetrics(ctx context.Context, req *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	return mergedMetrics(r, ctx, req, "ListPodSandboxMetrics", r.local.ListPodSandboxMetrics, r.runtime.ListPodSandboxMetrics,
		func(into, from *runtimeapi.ListPodSandboxMetricsResponse) {
			into.PodMetrics = append(into.PodMetrics, from.PodMetrics...)
		})
}

// mergedMetrics is merged for the metrics calls, where the forward
// runtime's part is best effort: its error is logged, and Virtlet's part
// answered alone.
func mergedMetrics[Req any, Resp any](r *Router, ctx context.Context, req Req, method string,
	localCall func(context.Context, Req) (Resp, error),
	remoteCall func(context.Context, Req, ...grpc.CallOption) (Resp, error),
	add func(into, from Resp)) (Resp, error) {
	resp, err := localCall(ctx, req)
	if err != nil {
		return resp, err
	}
	fctx, cancel := bounded(ctx)
	defer cancel()
	more, err := remoteCall(fctx, req)
	if err != nil {
		r.metricsUnavailable(method, err)
		return resp, nil
	}
	add(resp, more)
	return resp, nil
}

func (r *Router) metricsUnavailable(method string, err error) {
	level := logrus.WarnLevel
	if status.Code(err) == codes.Unimplemented {
		level = logrus.DebugLevel // an older runtime: it has none
	}
	r.log.WithError(err).WithFields(logrus.Fields{"method": method, "runtime": r.endpoint}).Log(level, "the forward runtime's metrics are left out")
}

// Image service.

func (r *Router) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	return route(r, ctx, req, r.viaImage(ctx, req.GetImage()), r.local.PullImage, r.images.PullImage)
}

func (r *Router) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	return route(r, ctx, req, r.viaImage(ctx, req.GetImage()), r.local.ImageStatus, r.images.ImageStatus)
}

func (r *Router) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	resp, err := route(r, ctx, req, r.viaImage(ctx, req.GetImage()), r.local.RemoveImage, r.images.RemoveImage)
	return idempotent(r, "RemoveImage", req.GetImage().GetImage(), resp, err)
}

func (r *Router) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	local, forwarded := true, true
	if image := req.GetFilter().GetImage(); image.GetImage() != "" {
		forwarded = r.viaImage(ctx, image)
		local = !forwarded
	}
	return merged(r, ctx, req, local, forwarded, r.local.ListImages, r.images.ListImages,
		func(into, from *runtimeapi.ListImagesResponse) { into.Images = append(into.Images, from.Images...) })
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
