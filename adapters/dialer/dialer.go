// Package dialer opens TCP connections from the daemon's (the node's)
// network namespace: port-forward reaches VM pods at their pod addresses,
// which the node reaches as Kubernetes' network model requires, and the
// VNC display of a VM on the host's loopback.
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

// TCP dials TCP.
type TCP struct{}

// Dial connects to address (host:port).
func (TCP) Dial(ctx context.Context, address string) (ports.Conn, error) {
	d := net.Dialer{Timeout: Timeout}
	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("dial %s: not a TCP connection", address)
	}
	return tc, nil
}

var _ ports.Dialer = TCP{}
