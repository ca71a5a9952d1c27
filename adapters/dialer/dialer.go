// Package dialer opens connections from the daemon's (the node's) network
// namespace: port-forward reaches VM pods at their pod addresses, which the
// node reaches as Kubernetes' network model requires; a VM's VNC display
// is a unix socket of its own.
//
// Not from the pod's network namespace: there the VM carries the pod's
// addresses and the namespace holds none, so it has no source address to
// dial from.
package dialer

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// Timeout bounds a connection attempt: a VM that does not answer at all
// (no ARP reply) fails after the kernel's address resolution, a few
// seconds; this bounds the rest.
const Timeout = 10 * time.Second

// Host dials from the host.
type Host struct{}

// Dial connects to address on network ("tcp" or "unix").
func (Host) Dial(ctx context.Context, network, address string) (ports.Conn, error) {
	if network != "tcp" && network != "unix" {
		return nil, fmt.Errorf("dial %s: network %q: want tcp or unix", address, network)
	}
	d := net.Dialer{Timeout: Timeout}
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	pc, ok := c.(ports.Conn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("dial %s: the connection cannot close its sending half", address)
	}
	return pc, nil
}

var _ ports.Dialer = Host{}
