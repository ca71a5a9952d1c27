package hypervisor

import (
	"context"
	"time"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	hypervisorv1 "github.com/virtlet/virtlet/proto/hypervisor/v1"
)

// Checkpoints across the plugin boundary (ports.VMCheckpointer). The
// state and the disk copies are files on the node, in the directory the
// caller names: only their description crosses.

// CheckpointVM asks the plugin to capture the VM into dir; it waits as
// long as ctx allows (kubelet's checkpoint timeout), at most a slow
// call's time.
func (c *Client) CheckpointVM(ctx context.Context, id, dir string) (ports.VMCheckpoint, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.VMCheckpoint{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	resp, err := rpc.CheckpointVM(ctx, &hypervisorv1.CheckpointVMRequest{Id: id, Dir: dir})
	if err != nil {
		return ports.VMCheckpoint{}, c.conn.Error(err)
	}
	return ports.VMCheckpoint{
		StateFile: resp.StateFile, DefinitionFile: resp.DefinitionFile,
		Disks: checkpointDisksFromProto(resp.Disks), Skipped: checkpointDisksFromProto(resp.Skipped),
		Paused:     time.Duration(resp.PausedNanos),
		Hypervisor: resp.Hypervisor, Machine: resp.Machine, Accelerator: resp.Accelerator,
	}, nil
}

var _ ports.VMCheckpointer = (*Client)(nil)

func (s *Server) CheckpointVM(ctx context.Context, req *hypervisorv1.CheckpointVMRequest) (*hypervisorv1.CheckpointVMResponse, error) {
	vc, ok := s.impl.(ports.VMCheckpointer)
	if !ok {
		return nil, unimplemented("VM checkpoints")
	}
	cp, err := vc.CheckpointVM(ctx, req.Id, req.Dir)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &hypervisorv1.CheckpointVMResponse{
		StateFile: cp.StateFile, DefinitionFile: cp.DefinitionFile,
		Disks: checkpointDisksToProto(cp.Disks), Skipped: checkpointDisksToProto(cp.Skipped),
		PausedNanos: int64(cp.Paused),
		Hypervisor:  cp.Hypervisor, Machine: cp.Machine, Accelerator: cp.Accelerator,
	}, nil
}

func checkpointDisksToProto(ds []ports.CheckpointDisk) []*hypervisorv1.CheckpointDisk {
	var out []*hypervisorv1.CheckpointDisk
	for _, d := range ds {
		out = append(out, &hypervisorv1.CheckpointDisk{Name: d.Name, File: d.File, Format: d.Format, BackingFile: d.BackingFile, Bytes: d.Bytes, Why: d.Why})
	}
	return out
}

func checkpointDisksFromProto(ds []*hypervisorv1.CheckpointDisk) []ports.CheckpointDisk {
	var out []ports.CheckpointDisk
	for _, d := range ds {
		out = append(out, ports.CheckpointDisk{Name: d.Name, File: d.File, Format: d.Format, BackingFile: d.BackingFile, Bytes: d.Bytes, Why: d.Why})
	}
	return out
}
