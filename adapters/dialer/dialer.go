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

	"golang.org/x/sys/unix"

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
	target := address
	if network == "unix" {
		// The socket lies in a directory its VM's QEMU user owns (a VM's
		// VNC display): a guest that took QEMU over could put a symlink
		// there to a socket of root's. The daemon connects to the socket
		// file itself, never through a link.
		fd, err := unix.Open(address, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", address, err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, fmt.Errorf("dial %s: %w", address, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return nil, fmt.Errorf("dial %s: not a socket", address)
		}
		target = fmt.Sprintf("/proc/self/fd/%d", fd)
	}
	d := net.Dialer{Timeout: Timeout}
	c, err := d.DialContext(ctx, network, target)
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
