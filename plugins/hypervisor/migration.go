package hypervisor

import (
	"context"
	"time"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/ports"
	hypervisorv1 "github.com/virtlet/virtlet/proto/hypervisor/v1"
)

// Live migration across the plugin boundary (ports.VMMigrator). The
// hypervisors' traffic goes through sockets on the node the daemon
// forwards: only their paths cross.

// migrationTimeout bounds a whole migration: a 1 GiB guest's disks and
// memory over a loaded node link, with room to spare.
const migrationTimeout = 10 * time.Minute

func (c *Client) MigrationIdentity(ctx context.Context, id string) (ports.VMIncoming, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.VMIncoming{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	resp, err := rpc.MigrationIdentity(ctx, &hypervisorv1.VMRequest{Id: id})
	if err != nil {
		return ports.VMIncoming{}, c.conn.Error(err)
	}
	return *incomingFromProto(resp), nil
}

func (c *Client) IncomingEndpoint(ctx context.Context, id string) (ports.MigrationEndpoint, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.MigrationEndpoint{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, base.SlowCallTimeout)
	defer cancel()
	resp, err := rpc.IncomingEndpoint(ctx, &hypervisorv1.VMRequest{Id: id})
	if err != nil {
		return ports.MigrationEndpoint{}, c.conn.Error(err)
	}
	return endpointFromProto(resp), nil
}

// MigrateVM waits as long as ctx allows, at most migrationTimeout.
func (c *Client) MigrateVM(ctx context.Context, id string, to ports.MigrationEndpoint) (ports.MigrationStats, error) {
	rpc, err := c.rpc()
	if err != nil {
		return ports.MigrationStats{}, err
	}
	ctx, cancel := base.WithTimeout(ctx, migrationTimeout)
	defer cancel()
	resp, err := rpc.MigrateVM(ctx, &hypervisorv1.MigrateVMRequest{Id: id, To: endpointToProto(to)})
	if err != nil {
		return ports.MigrationStats{}, c.conn.Error(err)
	}
	return ports.MigrationStats{Total: time.Duration(resp.TotalNanos), Downtime: time.Duration(resp.DowntimeNanos),
		MemoryBytes: resp.MemoryBytes, DiskBytes: resp.DiskBytes, PausedThroughout: resp.PausedThroughout}, nil
}

func (c *Client) CheckArrival(ctx context.Context, id, domainXML string) (string, error) {
	rpc, err := c.rpc()
	if err != nil {
		return "", err
	}
	ctx, cancel := base.WithTimeout(ctx, base.QuickCallTimeout)
	defer cancel()
	resp, err := rpc.CheckArrival(ctx, &hypervisorv1.CheckArrivalRequest{Id: id, DomainXml: domainXML})
	if err != nil {
		return "", c.conn.Error(err)
	}
	return resp.DomainXml, nil
}

var _ ports.VMMigrator = (*Client)(nil)

func (s *Server) CheckArrival(ctx context.Context, req *hypervisorv1.CheckArrivalRequest) (*hypervisorv1.CheckArrivalResponse, error) {
	m, ok := s.impl.(ports.VMMigrator)
	if !ok {
		return nil, unimplemented("live migration")
	}
	x, err := m.CheckArrival(ctx, req.Id, req.DomainXml)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &hypervisorv1.CheckArrivalResponse{DomainXml: x}, nil
}

func (s *Server) MigrationIdentity(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.VMIncoming, error) {
	m, ok := s.impl.(ports.VMMigrator)
	if !ok {
		return nil, unimplemented("live migration")
	}
	in, err := m.MigrationIdentity(ctx, req.Id)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return incomingToProto(&in), nil
}

func (s *Server) IncomingEndpoint(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.MigrationEndpoint, error) {
	m, ok := s.impl.(ports.VMMigrator)
	if !ok {
		return nil, unimplemented("live migration")
	}
	ep, err := m.IncomingEndpoint(ctx, req.Id)
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return endpointToProto(ep), nil
}

func (s *Server) MigrateVM(ctx context.Context, req *hypervisorv1.MigrateVMRequest) (*hypervisorv1.MigrationStats, error) {
	m, ok := s.impl.(ports.VMMigrator)
	if !ok {
		return nil, unimplemented("live migration")
	}
	st, err := m.MigrateVM(ctx, req.Id, endpointFromProto(req.GetTo()))
	if err != nil {
		return nil, base.ToRPC(err)
	}
	return &hypervisorv1.MigrationStats{TotalNanos: int64(st.Total), DowntimeNanos: int64(st.Downtime),
		MemoryBytes: st.MemoryBytes, DiskBytes: st.DiskBytes, PausedThroughout: st.PausedThroughout}, nil
}

func incomingToProto(in *ports.VMIncoming) *hypervisorv1.VMIncoming {
	if in == nil {
		return nil
	}
	return &hypervisorv1.VMIncoming{Name: in.Name, Uuid: in.UUID}
}

func incomingFromProto(p *hypervisorv1.VMIncoming) *ports.VMIncoming {
	if p == nil {
		return nil
	}
	return &ports.VMIncoming{Name: p.Name, UUID: p.Uuid}
}

func endpointToProto(ep ports.MigrationEndpoint) *hypervisorv1.MigrationEndpoint {
	return &hypervisorv1.MigrationEndpoint{DomainXml: ep.DomainXML, ControlSocket: ep.ControlSocket, MemorySocket: ep.MemorySocket, DisksSocket: ep.DisksSocket}
}

func endpointFromProto(p *hypervisorv1.MigrationEndpoint) ports.MigrationEndpoint {
	return ports.MigrationEndpoint{DomainXML: p.GetDomainXml(), ControlSocket: p.GetControlSocket(), MemorySocket: p.GetMemorySocket(), DisksSocket: p.GetDisksSocket()}
}
