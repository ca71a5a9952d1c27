package cri

import (
	"context"
	"path"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/plugins/base"
)

// quiet methods are polled by kubelet every few seconds (ExecSync: exec
// probes): logged at debug level unless they fail.
var quiet = map[string]bool{
	"Version": true, "Status": true, "ListPodSandbox": true, "ListContainers": true, "PodSandboxStatus": true,
	"ContainerStatus": true, "ListImages": true, "ImageStatus": true, "ImageFsInfo": true,
	"ListContainerStats": true, "ListPodSandboxStats": true, "ContainerStats": true, "PodSandboxStats": true,
	"ExecSync": true,
}

// CallObserver hears of every CRI call as it ends: its method
// ("RunPodSandbox"), the gRPC code it ended with, whether a router
// forwarded it to the other runtime of a mixed node, and how long it took.
// It runs on the call's goroutine: it must be quick.
type CallObserver func(method string, code codes.Code, forwarded bool, took time.Duration)

// WithCallObserver makes the server report every call to o.
func (s *Server) WithCallObserver(o CallObserver) *Server {
	s.observe = o
	return s
}

// instrument is the one place that logs every CRI call (method, pod,
// duration, error), turns core errors into gRPC status codes and reports
// the call to the observer.
func (s *Server) instrument(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (interface{}, error) {
	fields := s.identify(req) // before the call: a removal forgets the pod
	start := time.Now()
	var forwardedTo string
	resp, err := handler(context.WithValue(ctx, forwardedKey{}, &forwardedTo), req)
	took := time.Since(start)
	method := path.Base(info.FullMethod)
	fields["method"] = method
	if forwardedTo != "" {
		fields["runtime"] = forwardedTo
	}
	fields["duration"] = took.Round(time.Microsecond)
	if err != nil {
		err = toStatus(err)
	}
	if s.observe != nil {
		s.observe(method, status.Code(err), forwardedTo != "", took)
	}
	if r, ok := resp.(interface{ GetPodSandboxId() string }); ok && r.GetPodSandboxId() != "" {
		fields["sandbox"] = short(r.GetPodSandboxId())
	}
	if r, ok := resp.(interface{ GetContainerId() string }); ok && r.GetContainerId() != "" {
		fields["container"] = short(r.GetContainerId())
	}
	log := s.log.WithFields(fields)
	if err != nil {
		switch code := status.Code(err); {
		case code == codes.Unimplemented, code == codes.NotFound && quiet[method]:
			// kubelet asks after what it removed, and probes what the
			// runtime lacks: routine.
			log.WithError(err).Debug("CRI call failed")
		case code == codes.NotFound:
			// Something the pod names is missing (a ConfigMap, an image):
			// the pod author's to mend, with the pod named.
			log.WithError(err).Info("CRI call failed")
		default:
			log.WithError(err).Warn("CRI call failed")
		}
		return nil, err
	}
	if quiet[method] {
		log.Debug("CRI call")
	} else {
		log.Info("CRI call")
	}
	return resp, nil
}

// identify names the pod (namespace/name), sandbox, container and image a
// request concerns.
func (s *Server) identify(req interface{}) logrus.Fields {
	f := logrus.Fields{}
	if r, ok := req.(interface {
		GetConfig() *runtimeapi.PodSandboxConfig
	}); ok && r.GetConfig() != nil {
		m := r.GetConfig().GetMetadata()
		f["pod"] = m.GetNamespace() + "/" + m.GetName()
	}
	// CreateContainer and PullImage carry their pod's config.
	if r, ok := req.(interface {
		GetSandboxConfig() *runtimeapi.PodSandboxConfig
	}); ok && r.GetSandboxConfig() != nil {
		m := r.GetSandboxConfig().GetMetadata()
		f["pod"] = m.GetNamespace() + "/" + m.GetName()
	}
	sandboxID := ""
	if r, ok := req.(interface{ GetPodSandboxId() string }); ok {
		sandboxID = r.GetPodSandboxId()
	}
	if r, ok := req.(interface{ GetContainerId() string }); ok && r.GetContainerId() != "" {
		f["container"] = short(r.GetContainerId())
		if c, err := s.rt.ContainerStatus(context.Background(), r.GetContainerId()); err == nil {
			sandboxID = c.SandboxID
		}
	}
	if sandboxID != "" {
		f["sandbox"] = short(sandboxID)
		if sb, err := s.rt.SandboxStatus(context.Background(), sandboxID); err == nil {
			f["pod"] = sb.Namespace + "/" + sb.Name
		}
	}
	if r, ok := req.(interface{ GetImage() *runtimeapi.ImageSpec }); ok && r.GetImage() != nil && r.GetImage().GetImage() != "" {
		f["image"] = r.GetImage().GetImage()
	}
	return f
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

// toStatus maps the error kinds of the core and the ports to gRPC codes:
// the mapping the plugins use too (base.ToRPC), so that a kind means the
// same code to kubelet as between the daemon and a plugin.
func toStatus(err error) error { return base.ToRPC(err) }
