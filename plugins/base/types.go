package base

import (
	"time"

	"github.com/virtlet/virtlet/ports"
	typesv1 "github.com/virtlet/virtlet/proto/types/v1"
)

// Conversions of the types several kinds share. Protocol types stop here:
// clients return port types, servers take them.

// Nanos converts a time to Unix nanoseconds, 0 for the zero time.
func Nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Time converts Unix nanoseconds back, 0 to the zero time.
func Time(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func DisksToProto(in []ports.Disk) []*typesv1.Disk {
	out := make([]*typesv1.Disk, 0, len(in))
	for _, d := range in {
		out = append(out, DiskToProto(d))
	}
	return out
}

func DiskToProto(d ports.Disk) *typesv1.Disk {
	pd := &typesv1.Disk{
		Name: d.Name, Device: string(d.Device), Bus: string(d.Bus), ReadOnly: d.ReadOnly, Boot: d.Boot, Serial: d.Serial,
		Source: &typesv1.DiskSource{
			Type: string(d.Source.Type), Path: d.Source.Path, Format: d.Source.Format,
			Protocol: d.Source.Protocol, Name: d.Source.Name, Offset: d.Source.Offset, Size: d.Source.Size,
		},
	}
	for _, h := range d.Source.Hosts {
		pd.Source.Hosts = append(pd.Source.Hosts, &typesv1.NetworkHost{Name: h.Name, Port: h.Port})
	}
	if a := d.Source.Auth; a != nil {
		pd.Source.Auth = &typesv1.DiskAuth{Username: a.Username, SecretType: a.SecretType, Secret: a.Secret}
	}
	if o := d.Overlay; o != nil {
		pd.Overlay = &typesv1.DiskOverlay{BasePath: o.BasePath, BaseFormat: o.BaseFormat, SizeBytes: o.SizeBytes, KeepFreeBytes: o.KeepFreeBytes}
	}
	return pd
}

func DisksFromProto(in []*typesv1.Disk) []ports.Disk {
	var out []ports.Disk
	for _, d := range in {
		out = append(out, DiskFromProto(d))
	}
	return out
}

func DiskFromProto(pd *typesv1.Disk) ports.Disk {
	d := ports.Disk{
		Name: pd.GetName(), Device: ports.DiskDevice(pd.GetDevice()), Bus: ports.DiskBus(pd.GetBus()),
		ReadOnly: pd.GetReadOnly(), Boot: pd.GetBoot(), Serial: pd.GetSerial(),
	}
	if s := pd.GetSource(); s != nil {
		d.Source = ports.DiskSource{Type: ports.DiskSourceType(s.Type), Path: s.Path, Format: s.Format, Protocol: s.Protocol, Name: s.Name,
			Offset: s.Offset, Size: s.Size}
		for _, h := range s.Hosts {
			d.Source.Hosts = append(d.Source.Hosts, ports.NetworkHost{Name: h.Name, Port: h.Port})
		}
		if a := s.Auth; a != nil {
			d.Source.Auth = &ports.DiskAuth{Username: a.Username, SecretType: a.SecretType, Secret: a.Secret}
		}
	}
	if o := pd.GetOverlay(); o != nil {
		d.Overlay = &ports.DiskOverlay{BasePath: o.BasePath, BaseFormat: o.BaseFormat, SizeBytes: o.SizeBytes, KeepFreeBytes: o.KeepFreeBytes}
	}
	return d
}

func FilesystemsToProto(in []ports.Filesystem) []*typesv1.Filesystem {
	out := make([]*typesv1.Filesystem, 0, len(in))
	for _, f := range in {
		out = append(out, &typesv1.Filesystem{Source: f.Source, Tag: f.Tag, AccessMode: f.AccessMode, ReadOnly: f.ReadOnly})
	}
	return out
}

func FilesystemsFromProto(in []*typesv1.Filesystem) []ports.Filesystem {
	var out []ports.Filesystem
	for _, f := range in {
		out = append(out, ports.Filesystem{Source: f.Source, Tag: f.Tag, AccessMode: f.AccessMode, ReadOnly: f.ReadOnly})
	}
	return out
}

func NICsToProto(in []ports.NIC) []*typesv1.NIC {
	out := make([]*typesv1.NIC, 0, len(in))
	for _, n := range in {
		out = append(out, &typesv1.NIC{Name: n.Name, Mac: n.MAC, Mtu: int32(n.MTU), Bridge: n.Bridge})
	}
	return out
}

func NICsFromProto(in []*typesv1.NIC) []ports.NIC {
	var out []ports.NIC
	for _, n := range in {
		out = append(out, ports.NIC{Name: n.Name, MAC: n.Mac, MTU: int(n.Mtu), Bridge: n.Bridge})
	}
	return out
}

func DNSToProto(d *ports.DNSConfig) *typesv1.DNSConfig {
	if d == nil {
		return nil
	}
	return &typesv1.DNSConfig{Servers: d.Servers, Searches: d.Searches, Options: d.Options}
}

func DNSFromProto(d *typesv1.DNSConfig) *ports.DNSConfig {
	if d == nil {
		return nil
	}
	return &ports.DNSConfig{Servers: d.Servers, Searches: d.Searches, Options: d.Options}
}

// AttachmentToProto converts a pod's network attachment.
func AttachmentToProto(a ports.NetworkAttachment) *typesv1.NetworkAttachment {
	p := &typesv1.NetworkAttachment{NetnsPath: a.NetNSPath, Dns: DNSToProto(a.DNS)}
	for _, i := range a.Interfaces {
		pi := &typesv1.NetworkInterface{Name: i.Name, Mac: i.MAC, Mtu: int32(i.MTU), Bridge: i.Bridge}
		for _, ip := range i.IPs {
			pi.Ips = append(pi.Ips, &typesv1.IPConfig{Address: ip.Address, Gateway: ip.Gateway})
		}
		p.Interfaces = append(p.Interfaces, pi)
	}
	for _, r := range a.Routes {
		p.Routes = append(p.Routes, &typesv1.Route{Destination: r.Destination, Gateway: r.Gateway})
	}
	return p
}

// AttachmentFromProto converts a pod's network attachment back.
func AttachmentFromProto(p *typesv1.NetworkAttachment) ports.NetworkAttachment {
	a := ports.NetworkAttachment{NetNSPath: p.GetNetnsPath(), DNS: DNSFromProto(p.GetDns())}
	for _, pi := range p.GetInterfaces() {
		i := ports.NetworkInterface{Name: pi.Name, MAC: pi.Mac, MTU: int(pi.Mtu), Bridge: pi.Bridge}
		for _, ip := range pi.Ips {
			i.IPs = append(i.IPs, ports.IPConfig{Address: ip.Address, Gateway: ip.Gateway})
		}
		a.Interfaces = append(a.Interfaces, i)
	}
	for _, r := range p.GetRoutes() {
		a.Routes = append(a.Routes, ports.Route{Destination: r.Destination, Gateway: r.Gateway})
	}
	return a
}

// IdentityToProto converts a VM's process identity (nil stays nil).
func IdentityToProto(id *ports.ProcessIdentity) *typesv1.ProcessIdentity {
	if id == nil {
		return nil
	}
	return &typesv1.ProcessIdentity{Uid: int64(id.UID), Gid: int64(id.GID)}
}

// IdentityFromProto converts a VM's process identity (nil stays nil).
func IdentityFromProto(p *typesv1.ProcessIdentity) *ports.ProcessIdentity {
	if p == nil {
		return nil
	}
	return &ports.ProcessIdentity{UID: int(p.Uid), GID: int(p.Gid)}
}
