package cni

import (
	"bytes"
	"fmt"
	"net"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/sirupsen/logrus"
)

// LeaseTime is what the DHCP server grants. The server answers renewals
// only when they are broadcast (rebinding), as it has no address of its
// own: the VM unicasts renewals to the gateway first, then rebinds.
const LeaseTime = 24 * time.Hour

// lease is the one answer the per-pod DHCP server gives: the CNI result
// for the VM's MAC.
type lease struct {
	Bridge   string // the pod bridge the VM's NIC is on
	MAC      net.HardwareAddr
	IP       net.IP
	Mask     net.IPMask
	Gateway  net.IP          // the router option: the primary NIC's gateway
	ServerID net.IP          // the NIC's CNI gateway, named as the server
	Routes   []*dhcpv4.Route // classless static routes, the default route included
	DNS      []net.IP
	Search   []string
	MTU      int
	Hostname string
}

// dhcpServer answers one NIC of a pod's VM, on the pod bridge of that NIC
// inside the pod's network namespace.
type dhcpServer struct {
	srv *server4.Server
}

// startDHCP opens the server's socket inside the namespace (a socket
// stays in the namespace it was made in) and serves from any thread.
func startDHCP(nsPath string, l lease, log logrus.FieldLogger) (*dhcpServer, error) {
	var srv *server4.Server
	err := inNetNS(nsPath, func() error {
		var err error
		srv, err = server4.NewServer(l.Bridge, &net.UDPAddr{IP: net.IPv4zero, Port: dhcpv4.ServerPort}, l.handler(log))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("DHCP server in %s: %w", nsPath, err)
	}
	go srv.Serve()
	return &dhcpServer{srv: srv}, nil
}

func (s *dhcpServer) Close() error { return s.srv.Close() }

func (l lease) handler(log logrus.FieldLogger) server4.Handler {
	return func(conn net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
		if m.OpCode != dhcpv4.OpcodeBootRequest || !bytes.Equal(m.ClientHWAddr, l.MAC) {
			return
		}
		reply, err := l.reply(m)
		if err != nil || reply == nil {
			if err != nil {
				log.WithError(err).Warn("DHCP reply")
			}
			return
		}
		// The server has no address: always broadcast on the pod's bridge.
		dest := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
		if _, err := conn.WriteTo(reply.ToBytes(), dest); err != nil {
			log.WithError(err).Warn("send DHCP reply")
			return
		}
		log.WithFields(logrus.Fields{"mac": l.MAC.String(), "type": reply.MessageType().String(), "ip": l.IP.String()}).Debug("DHCP")
	}
}

// reply answers DISCOVER with OFFER and REQUEST with ACK (or NAK for an
// address that is not the VM's); other messages get no answer.
func (l lease) reply(m *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
	var typ dhcpv4.MessageType
	switch m.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		typ = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest:
		typ = dhcpv4.MessageTypeAck
		req := m.RequestedIPAddress()
		if req == nil || req.IsUnspecified() {
			req = m.ClientIPAddr
		}
		if req != nil && !req.IsUnspecified() && !req.Equal(l.IP) {
			return dhcpv4.NewReplyFromRequest(m, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(l.serverID())), dhcpv4.WithBroadcast(true))
		}
	default:
		return nil, nil
	}
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(typ),
		dhcpv4.WithYourIP(l.IP),
		dhcpv4.WithNetmask(l.Mask),
		dhcpv4.WithLeaseTime(uint32(LeaseTime / time.Second)),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(l.serverID())),
		dhcpv4.WithBroadcast(true),
	}
	if l.Gateway != nil {
		mods = append(mods, dhcpv4.WithRouter(l.Gateway))
	}
	if len(l.Routes) > 0 {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptClasslessStaticRoute(l.Routes...)))
	}
	if len(l.DNS) > 0 {
		mods = append(mods, dhcpv4.WithDNS(l.DNS...))
	}
	if len(l.Search) > 0 {
		mods = append(mods, dhcpv4.WithDomainSearchList(l.Search...))
	}
	if l.MTU > 0 {
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionInterfaceMTU, []byte{byte(l.MTU >> 8), byte(l.MTU)}))
	}
	if l.Hostname != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptHostName(l.Hostname)))
	}
	return dhcpv4.NewReplyFromRequest(m, mods...)
}

// serverID is the NIC's gateway (the pod's next hop), or the VM's own
// address when the network has none.
func (l lease) serverID() net.IP {
	switch {
	case l.ServerID != nil:
		return l.ServerID
	case l.Gateway != nil:
		return l.Gateway
	}
	return l.IP
}
