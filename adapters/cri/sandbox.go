package cri

import (
	"context"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

func (s *Server) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	id, err := s.rt.RunSandbox(ctx, sandboxConfig(req.GetConfig(), req.GetRuntimeHandler()))
	if err != nil {
		return nil, err
	}
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

func sandboxConfig(c *runtimeapi.PodSandboxConfig, handler string) core.SandboxConfig {
	m := c.GetMetadata()
	cfg := core.SandboxConfig{
		Name: m.GetName(), Namespace: m.GetNamespace(), UID: m.GetUid(), Attempt: m.GetAttempt(),
		Hostname: c.GetHostname(), LogDirectory: c.GetLogDirectory(), RuntimeHandler: handler,
		Labels: c.GetLabels(), Annotations: c.GetAnnotations(),
		HostNetwork: c.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE,
	}
	if d := c.GetDnsConfig(); d != nil {
		cfg.DNS = &ports.DNSConfig{Servers: d.Servers, Searches: d.Searches, Options: d.Options}
	}
	for _, p := range c.GetPortMappings() {
		cfg.PortMappings = append(cfg.PortMappings, ports.PortMapping{
			Protocol: p.Protocol.String(), ContainerPort: p.ContainerPort, HostPort: p.HostPort, HostIP: p.HostIp,
		})
	}
	return cfg
}

func (s *Server) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	return &runtimeapi.StopPodSandboxResponse{}, s.rt.StopSandbox(ctx, req.PodSandboxId)
}

func (s *Server) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	return &runtimeapi.RemovePodSandboxResponse{}, s.rt.RemoveSandbox(ctx, req.PodSandboxId)
}

func (s *Server) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	sb, err := s.rt.SandboxStatus(ctx, req.PodSandboxId)
	if err != nil {
		return nil, err
	}
	st := &runtimeapi.PodSandboxStatus{
		Id: sb.ID, Metadata: sandboxMetadata(&sb), State: sandboxState(sb.State), CreatedAt: sb.CreatedAt.UnixNano(),
		Network: &runtimeapi.PodSandboxNetworkStatus{},
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{
			Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_POD, Ipc: runtimeapi.NamespaceMode_POD,
		}}},
		Labels: sb.Labels, Annotations: sb.Annotations, RuntimeHandler: sb.RuntimeHandler,
	}
	if ips := sb.IPs(); len(ips) > 0 {
		st.Network.Ip = ips[0]
		for _, ip := range ips[1:] {
			st.Network.AdditionalIps = append(st.Network.AdditionalIps, &runtimeapi.PodIP{Ip: ip})
		}
	}
	resp := &runtimeapi.PodSandboxStatusResponse{Status: st}
	if req.Verbose {
		info := map[string]interface{}{"network": sb.Network, "dns": sb.DNS, "portMappings": sb.PortMappings}
		var vms []interface{}
		for _, c := range s.rt.ListContainers(core.ContainerFilter{SandboxID: sb.ID}) {
			vms = append(vms, map[string]interface{}{"container": c.ID, "vm": c.Spec.Name, "state": c.State})
		}
		info["vms"] = vms
		resp.Info = jsonInfo(info)
	}
	return resp, nil
}

func (s *Server) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f := core.SandboxFilter{}
	if flt := req.GetFilter(); flt != nil {
		f.ID = flt.Id
		f.LabelSelector = flt.LabelSelector
		if v := flt.GetState(); v != nil {
			f.State = core.SandboxNotReady
			if v.State == runtimeapi.PodSandboxState_SANDBOX_READY {
				f.State = core.SandboxReady
			}
		}
	}
	list := s.rt.ListSandboxes(f)
	entries := make([]entry, len(list))
	for i, sb := range list {
		entries[i] = entry{id: sb.ID, revision: sb.Revision, record: sb}
	}
	resp := &runtimeapi.ListPodSandboxResponse{}
	setEncoded(resp, s.sandboxWire.encode(listPodSandboxItems, entries, func(r any) proto.Message { return podSandbox(r.(*core.Sandbox)) }))
	if f.ID == "" && f.State == "" && len(f.LabelSelector) == 0 {
		s.sandboxWire.retain(entries)
	}
	return resp, nil
}

// listPodSandboxItems is the field number of ListPodSandboxResponse.items,
// read from the message's descriptor.
var listPodSandboxItems = itemsField(&runtimeapi.ListPodSandboxResponse{}, "items")

func podSandbox(sb *core.Sandbox) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{
		Id: sb.ID, Metadata: sandboxMetadata(sb), State: sandboxState(sb.State), CreatedAt: sb.CreatedAt.UnixNano(),
		Labels: sb.Labels, Annotations: sb.Annotations, RuntimeHandler: sb.RuntimeHandler,
	}
}

func sandboxMetadata(sb *core.Sandbox) *runtimeapi.PodSandboxMetadata {
	return &runtimeapi.PodSandboxMetadata{Name: sb.Name, Uid: sb.UID, Namespace: sb.Namespace, Attempt: sb.Attempt}
}

func sandboxState(st core.SandboxState) runtimeapi.PodSandboxState {
	if st == core.SandboxReady {
		return runtimeapi.PodSandboxState_SANDBOX_READY
	}
	return runtimeapi.PodSandboxState_SANDBOX_NOTREADY
}
