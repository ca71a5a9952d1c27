package cri

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

func (s *Server) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	c := req.GetConfig()
	cfg := core.ContainerConfig{
		Name: c.GetMetadata().GetName(), Attempt: c.GetMetadata().GetAttempt(),
		Image: c.GetImage().GetImage(), UserImage: c.GetImage().GetUserSpecifiedImage(),
		Labels: c.GetLabels(), Annotations: c.GetAnnotations(), LogPath: c.GetLogPath(),
		MemoryLimitBytes: c.GetLinux().GetResources().GetMemoryLimitInBytes(),
		CPUSet:           c.GetLinux().GetResources().GetCpusetCpus(),
		CPUQuota:         c.GetLinux().GetResources().GetCpuQuota(),
		CPUPeriod:        c.GetLinux().GetResources().GetCpuPeriod(),
		CPUShares:        c.GetLinux().GetResources().GetCpuShares(),
	}
	// kubelet lists every page size the node has, with limit 0 unless the
	// pod asks for that size.
	for _, h := range c.GetLinux().GetResources().GetHugepageLimits() {
		if h.GetLimit() > 0 {
			cfg.HugepageLimits = append(cfg.HugepageLimits, core.HugepageLimit{PageSize: h.GetPageSize(), Bytes: h.GetLimit()})
		}
	}
	for _, e := range c.GetEnvs() {
		cfg.Env = append(cfg.Env, core.EnvVar{Name: e.Key, Value: e.Value})
	}
	for _, m := range c.GetMounts() {
		cfg.Mounts = append(cfg.Mounts, core.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath,
			ReadOnly: m.Readonly || m.RecursiveReadOnly, Image: m.GetImage().GetImage()})
	}
	for _, d := range c.GetDevices() {
		cfg.Devices = append(cfg.Devices, core.Device{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
	}
	id, err := s.rt.CreateContainer(ctx, req.PodSandboxId, cfg)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

func (s *Server) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	return &runtimeapi.StartContainerResponse{}, s.rt.StartContainer(ctx, req.ContainerId)
}

func (s *Server) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	timeout := time.Duration(req.Timeout) * time.Second
	return &runtimeapi.StopContainerResponse{}, s.rt.StopContainer(ctx, req.ContainerId, timeout)
}

func (s *Server) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	return &runtimeapi.RemoveContainerResponse{}, s.rt.RemoveContainer(ctx, req.ContainerId)
}

func (s *Server) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	c, err := s.rt.ContainerStatus(ctx, req.ContainerId)
	if err != nil {
		return nil, err
	}
	reason, message := c.Reason, c.Message
	if c.Halted() {
		reason, message = core.ReasonHalted, c.HaltMessage()
	}
	st := &runtimeapi.ContainerStatus{
		Id: c.ID, Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: c.Attempt}, State: containerState(c.State),
		CreatedAt: nanos(c.CreatedAt), StartedAt: nanos(c.StartedAt), FinishedAt: nanos(c.FinishedAt), ExitCode: c.ExitCode,
		Image: imageSpec(&c), ImageRef: c.Image.ID, ImageId: c.Image.ID, Reason: reason, Message: message,
		Labels: c.Labels, Annotations: c.Annotations, LogPath: c.Spec.ConsoleLogPath,
		Resources: &runtimeapi.ContainerResources{Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: c.Spec.MemoryBytes}},
	}
	for _, m := range c.Mounts {
		st.Mounts = append(st.Mounts, &runtimeapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.ReadOnly})
	}
	resp := &runtimeapi.ContainerStatusResponse{Status: st}
	if req.Verbose {
		resp.Info = jsonInfo(map[string]interface{}{
			"vm": map[string]interface{}{"name": c.Spec.Name, "uuid": c.Spec.UUID, "vcpus": c.Spec.VCPUs, "memoryBytes": c.Spec.MemoryBytes,
				"cpu": c.Spec.CPU, "disks": diskSummary(c.Spec.Disks), "shares": shareSummary(c.Spec.Filesystems), "nics": c.Spec.NICs,
				"volumes": volumeSummary(c.Volumes), "halted": c.Halted()},
			"sandboxID": c.SandboxID,
		})
	}
	return resp, nil
}

// diskSummary lists a VM's disks without credentials.
func diskSummary(disks []ports.Disk) []map[string]interface{} {
	var out []map[string]interface{}
	for _, d := range disks {
		m := map[string]interface{}{"name": d.Name, "device": d.Device, "bus": d.Bus, "source": d.Source.Type}
		if d.Source.Path != "" {
			m["path"] = d.Source.Path
		}
		if d.Source.Name != "" {
			m["image"] = d.Source.Protocol + ":" + d.Source.Name
		}
		if d.Serial != "" {
			m["serial"] = d.Serial
		}
		if d.ReadOnly {
			m["readOnly"] = true
		}
		if d.Source.Offset > 0 {
			m["offset"] = d.Source.Offset
		}
		if d.Overlay != nil {
			m["base"] = d.Overlay.BasePath
			m["sizeBytes"] = d.Overlay.SizeBytes
		}
		out = append(out, m)
	}
	return out
}

func shareSummary(fss []ports.Filesystem) []map[string]interface{} {
	var out []map[string]interface{}
	for _, f := range fss {
		out = append(out, map[string]interface{}{"tag": f.Tag, "source": f.Source, "accessMode": f.AccessMode, "readOnly": f.ReadOnly})
	}
	return out
}

// volumeSummary lists a VM's volumes without their options (a third
// party's options might be sensitive).
func volumeSummary(vols []core.VolumeUse) []map[string]interface{} {
	var out []map[string]interface{}
	for _, v := range vols {
		m := map[string]interface{}{"name": v.Name, "kind": v.Kind, "type": v.Type}
		for k, val := range map[string]string{"hostPath": v.HostPath, "devicePath": v.DevicePath, "serial": v.Serial, "tag": v.Tag} {
			if val != "" {
				m[k] = val
			}
		}
		var mounts []string
		for _, gm := range v.Mounts {
			if gm.ReadOnly {
				mounts = append(mounts, gm.Path+" (read-only)")
			} else {
				mounts = append(mounts, gm.Path)
			}
		}
		if len(mounts) > 0 {
			m["mountPaths"] = mounts
		}
		if v.ReadOnly {
			m["readOnly"] = true
		}
		if v.Rootfs {
			m["persistentRoot"] = true
		}
		out = append(out, m)
	}
	return out
}

func (s *Server) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f := core.ContainerFilter{}
	if flt := req.GetFilter(); flt != nil {
		f.ID, f.SandboxID, f.LabelSelector = flt.Id, flt.PodSandboxId, flt.LabelSelector
		if v := flt.GetState(); v != nil {
			f.State = stateFromCRI(v.State)
		}
	}
	list := s.rt.ListContainers(f)
	entries := make([]entry, len(list))
	for i, c := range list {
		entries[i] = entry{id: c.ID, revision: c.Revision, record: c}
	}
	resp := &runtimeapi.ListContainersResponse{}
	setEncoded(resp, s.containerWire.encode(listContainersItems, entries, func(r any) proto.Message { return criContainer(r.(*core.Container)) }))
	if f.ID == "" && f.SandboxID == "" && f.State == "" && len(f.LabelSelector) == 0 {
		s.containerWire.retain(entries)
	}
	return resp, nil
}

// listContainersItems is the field number of ListContainersResponse.containers,
// read from the message's descriptor.
var listContainersItems = itemsField(&runtimeapi.ListContainersResponse{}, "containers")

func criContainer(c *core.Container) *runtimeapi.Container {
	return &runtimeapi.Container{
		Id: c.ID, PodSandboxId: c.SandboxID, Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: c.Attempt},
		Image: imageSpec(c), ImageRef: c.Image.ID, ImageId: c.Image.ID, State: containerState(c.State),
		CreatedAt: nanos(c.CreatedAt), Labels: c.Labels, Annotations: c.Annotations,
	}
}

func imageSpec(c *core.Container) *runtimeapi.ImageSpec {
	name := c.Image.UserSpecified
	if name == "" {
		name = c.Image.Spec
	}
	return &runtimeapi.ImageSpec{Image: name, UserSpecifiedImage: c.Image.UserSpecified}
}

func containerState(st core.ContainerState) runtimeapi.ContainerState {
	switch st {
	case core.ContainerCreated:
		return runtimeapi.ContainerState_CONTAINER_CREATED
	case core.ContainerRunning:
		return runtimeapi.ContainerState_CONTAINER_RUNNING
	case core.ContainerExited:
		return runtimeapi.ContainerState_CONTAINER_EXITED
	default:
		return runtimeapi.ContainerState_CONTAINER_UNKNOWN
	}
}

func stateFromCRI(st runtimeapi.ContainerState) core.ContainerState {
	switch st {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return core.ContainerCreated
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return core.ContainerRunning
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return core.ContainerExited
	default:
		return core.ContainerUnknown
	}
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// unsupported says why a CRI call has no VM equivalent yet.
func unsupported(call, why string) error {
	return fmt.Errorf("%s: %s: %w", call, why, ports.ErrUnimplemented)
}

func (s *Server) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	res := req.GetLinux()
	err := s.rt.UpdateContainerResources(ctx, req.ContainerId, core.ContainerResources{
		MemoryLimitBytes: res.GetMemoryLimitInBytes(), CPUSet: res.GetCpusetCpus(), CPUQuota: res.GetCpuQuota(), CPUPeriod: res.GetCpuPeriod(), CPUShares: res.GetCpuShares()})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

func (s *Server) ReopenContainerLog(ctx context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	return &runtimeapi.ReopenContainerLogResponse{}, s.rt.ReopenContainerLog(ctx, req.ContainerId)
}

// CheckpointContainer writes the VM's checkpoint archive where kubelet
// says (its checkpoint API: <root-dir>/checkpoints/...tar); the VM runs on.
func (s *Server) CheckpointContainer(ctx context.Context, req *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	if _, err := s.rt.CheckpointContainer(ctx, req.ContainerId, req.Location, time.Duration(req.Timeout)*time.Second); err != nil {
		return nil, err
	}
	return &runtimeapi.CheckpointContainerResponse{}, nil
}
