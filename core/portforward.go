package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// CheckPortForward tells whether the pod's VM can be reached now (kubelet
// asks for the URL before it connects).
func (r *accessService) CheckPortForward(sandboxID string) error {
	_, _, err := r.forwardTarget(sandboxID)
	return err
}

// forwardTarget returns the sandbox and its addresses, primary first.
func (r *accessService) forwardTarget(sandboxID string) (*Sandbox, []string, error) {
	full, ok, err := r.resolveSandbox(sandboxID)
	if err != nil {
		return nil, nil, err
	}
	sb, found := r.sandboxes.get(full)
	if !ok || !found || sb.State == SandboxPending {
		return nil, nil, notFound("sandbox", sandboxID)
	}
	pod := sb.Namespace + "/" + sb.Name
	if r.deps.Dialer == nil {
		return nil, nil, fmt.Errorf("port-forward to pod %s: this daemon has no dialer: %w", pod, ports.ErrUnimplemented)
	}
	if sb.State != SandboxReady {
		return nil, nil, fmt.Errorf("port-forward to pod %s: the pod is %s: %w", pod, sb.State, ports.ErrFailedPrecondition)
	}
	ips := sb.IPs()
	if len(ips) == 0 {
		return nil, nil, fmt.Errorf("port-forward to pod %s: the pod has no IP address (no network plugin?): %w", pod, ports.ErrFailedPrecondition)
	}
	var halted *Container
	running := false
	for _, c := range r.containersOf(sb.ID) {
		if c.Halted() {
			halted = c
		}
		running = running || c.State == ContainerRunning && !c.Halted()
	}
	switch {
	case !running && halted != nil:
		return nil, nil, haltedError("port-forward to pod "+pod, halted)
	case !running:
		return nil, nil, fmt.Errorf("port-forward to pod %s: its VM is not running: %w", pod, ports.ErrFailedPrecondition)
	}
	return sb, ips, nil
}

// PortForward connects stream to port of the VM, at the pod's addresses
// in order (the primary first, then the others: a service listening on
// one family only is still reached), and copies data both ways until both
// directions end. When no address answers, the error names each attempt
// (connection refused for a closed port), as container runtimes do.
func (r *accessService) PortForward(ctx context.Context, sandboxID string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	if port < 1 || port > 65535 {
		return &ports.InvalidError{Field: "port", Value: strconv.Itoa(int(port)), Allowed: "1 to 65535"}
	}
	sb, ips, err := r.forwardTarget(sandboxID)
	if err != nil {
		return err
	}
	var conn ports.Conn
	var attempts []string
	for _, ip := range ips {
		family := "IPv4"
		if strings.Contains(ip, ":") {
			family = "IPv6"
		}
		c, err := r.deps.Dialer.Dial(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(int(port))))
		if err == nil {
			conn = c
			break
		}
		attempts = append(attempts, family+": "+err.Error())
	}
	if conn == nil {
		return fmt.Errorf("failed to connect to port %d of pod %s/%s: %s", port, sb.Namespace, sb.Name, strings.Join(attempts, ", "))
	}
	defer conn.Close()
	log := r.log.WithFields(logrus.Fields{"pod": sb.Namespace + "/" + sb.Name, "port": port})
	log.Debug("port-forward connected")

	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
			conn.Close()
		case <-finished:
		}
	}()
	go func() {
		if _, err := io.Copy(conn, stream); err != nil {
			conn.Close() // the client went away: so does the connection
			return
		}
		conn.CloseWrite() // the client sends no more; the VM may still answer
	}()
	_, err = io.Copy(stream, conn)
	// The VM closed its side: so does the client's stream; the copy towards
	// the VM ends when the client closes or its session goes.
	stream.Close()
	if err != nil && !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
		return fmt.Errorf("port-forward to pod %s/%s port %d: %w", sb.Namespace, sb.Name, port, err)
	}
	log.Debug("port-forward closed")
	return nil
}
