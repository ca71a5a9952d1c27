package cri

import (
	"context"
	"encoding/json"
	"regexp"
	"runtime"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
)

// RuntimeName is what Version reports.
const RuntimeName = "virtlet"

// Version reports the real build version, as a semantic version.
func (s *Server) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{
		Version: "0.1.0", RuntimeName: RuntimeName, RuntimeVersion: semanticVersion(s.info.Version), RuntimeApiVersion: "v1",
	}, nil
}

var notBuildMetadata = regexp.MustCompile(`[^0-9A-Za-z.-]+`)

// semanticVersion is the build version as kubelet reads a runtime's: a
// semantic version, else the node shows "Unknown" (kubectl get nodes -o
// wide). A build without a release tag (git describe gives a commit,
// "df3ba06-dirty") becomes 0.0.0 with the build as its metadata
// ("0.0.0+df3ba06-dirty").
func semanticVersion(v string) string {
	if _, err := utilversion.ParseSemantic(v); err == nil {
		return v
	}
	meta := strings.Trim(notBuildMetadata.ReplaceAllString(v, "-"), ".-")
	for strings.Contains(meta, "..") {
		meta = strings.ReplaceAll(meta, "..", ".")
	}
	if meta == "" {
		return "0.0.0"
	}
	return "0.0.0+" + meta
}

// Status reports whether the hypervisor and the pod network are ready,
// probed through their plugins.
func (s *Server) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	st := s.rt.Status(ctx)
	resp := &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: st.Runtime.Ready, Reason: st.Runtime.Reason, Message: st.Runtime.Message},
		{Type: runtimeapi.NetworkReady, Status: st.Network.Ready, Reason: st.Network.Reason, Message: st.Network.Message},
	}},
		// The default handler and `virtlet` (RuntimeClass) both run VM pods
		// here. A VM's kernel is its own: the host's user namespaces and
		// recursive read-only mounts do not reach into it (README).
		RuntimeHandlers: []*runtimeapi.RuntimeHandler{
			{Name: "", Features: &runtimeapi.RuntimeHandlerFeatures{}},
			{Name: core.RuntimeHandler, Features: &runtimeapi.RuntimeHandlerFeatures{}},
		},
	}
	if req.Verbose {
		// goroutines: a leak shows here first (the tests watch it).
		info := map[string]interface{}{"hypervisor": st.Hypervisor, "goroutines": runtime.NumGoroutine()}
		if s.info.Plugins != nil {
			info["plugins"] = s.info.Plugins()
		}
		resp.Info = jsonInfo(info)
	}
	return resp, nil
}

// UpdateRuntimeConfig accepts kubelet's pod CIDR; the network plugin gets
// pod addresses from its own configuration.
func (s *Server) UpdateRuntimeConfig(ctx context.Context, req *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	if cidr := req.GetRuntimeConfig().GetNetworkConfig().GetPodCidr(); cidr != "" {
		s.log.WithField("podCIDR", cidr).Info("kubelet set the pod CIDR")
	}
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

// RuntimeConfig tells kubelet which cgroup driver to use for the pods'
// cgroups, so that the two never disagree.
func (s *Server) RuntimeConfig(ctx context.Context, req *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	driver := runtimeapi.CgroupDriver_CGROUPFS
	if s.info.CgroupDriver == "systemd" {
		driver = runtimeapi.CgroupDriver_SYSTEMD
	}
	return &runtimeapi.RuntimeConfigResponse{Linux: &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: driver}}, nil
}

// jsonInfo renders verbose details as CRI's map of JSON strings.
func jsonInfo(m map[string]interface{}) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		b, err := json.Marshal(v)
		if err != nil {
			b, _ = json.Marshal(err.Error())
		}
		out[k] = string(b)
	}
	return out
}
