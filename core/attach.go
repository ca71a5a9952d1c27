package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// accessService reaches running VMs: exec and the guest agent, attach and
// the console, port-forward, the VNC display, diagnosis, power (halt,
// boot, reboot) and resize. It keeps no state of its own; what it changes
// it writes to the containers' records.
type accessService struct {
	*shared
	pods *sandboxService
	vms  *vmService
}

// DetachKey (Ctrl-]) ends an attach session and leaves the VM running, as
// in Virtlet and virsh console.
const DetachKey = 0x1d

// runningVM returns a container whose VM runs, or an error saying why the
// call (what) needs one.
func (r *accessService) runningVM(id, what string) (*Container, error) {
	full, ok, err := r.resolveContainer(id)
	if err != nil {
		return nil, err
	}
	c, found := r.containers.get(full)
	if !ok || !found || c.State == ContainerCreating {
		return nil, notFound("container", id)
	}
	if c.State != ContainerRunning {
		state := string(c.State)
		if c.State == ContainerExited {
			state = fmt.Sprintf("exited (exit code %d, %s)", c.ExitCode, c.Reason)
		}
		return nil, fmt.Errorf("%s: the VM %s of pod %s/%s is %s, not running: %w",
			what, c.Spec.Name, c.Spec.PodNamespace, c.Spec.PodName, state, ports.ErrFailedPrecondition)
	}
	if c.Halted() {
		return nil, haltedError(what, c)
	}
	return c, nil
}

// CheckAttach tells whether a container can be attached to now (kubelet
// asks for the URL before it connects: a stopped VM is refused at once).
func (r *accessService) CheckAttach(id string) error {
	c, err := r.runningVM(id, "attach")
	if err != nil {
		return err
	}
	if _, ok := r.deps.Hypervisor.(ports.ConsoleOpener); !ok {
		return fmt.Errorf("attach to VM %s: the hypervisor plugin has no console access: %w", c.Spec.Name, ports.ErrUnimplemented)
	}
	return nil
}

// Attach connects a viewer to the VM's serial console until the viewer
// presses Ctrl-] (detach), ctx ends, the viewer goes away or the VM stops.
// Several viewers may be attached at once; the VM keeps running when they
// leave. A serial console has no window size: terminal resizes are not
// passed on.
func (r *accessService) Attach(ctx context.Context, id string, stdin io.Reader, stdout io.Writer) error {
	c, err := r.runningVM(id, "attach")
	if err != nil {
		return err
	}
	co, ok := r.deps.Hypervisor.(ports.ConsoleOpener)
	if !ok {
		return fmt.Errorf("attach to VM %s: the hypervisor plugin has no console access: %w", c.Spec.Name, ports.ErrUnimplemented)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	console, err := co.OpenConsole(ctx, c.ID)
	if err != nil {
		return fmt.Errorf("attach to VM %s: %w", c.Spec.Name, err)
	}
	defer console.Close()
	log := r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name})
	log.Info("viewer attached to the serial console")

	done := make(chan error, 2)
	go func() {
		if stdout == nil {
			stdout = io.Discard
		}
		_, err := io.Copy(stdout, console)
		if err == nil {
			err = errConsoleClosed
		}
		done <- err
	}()
	if stdin != nil {
		go func() {
			if err := copyUntilDetach(console, stdin); err != nil {
				done <- err
			}
		}()
	}
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	switch {
	case errors.Is(err, errDetached):
		log.Info("viewer detached (Ctrl-])")
		return nil
	case errors.Is(err, errConsoleClosed):
		log.Info("the console closed: the VM stopped")
		return nil
	case errors.Is(err, errInputClosed), ctx.Err() != nil:
		log.Info("viewer left")
		return nil
	default:
		return fmt.Errorf("attach to VM %s: %w", c.Spec.Name, err)
	}
}

var (
	errDetached      = errors.New("detached")
	errConsoleClosed = errors.New("console closed")
	errInputClosed   = errors.New("input closed")
)

// copyUntilDetach forwards keystrokes to the console up to the detach key.
func copyUntilDetach(console io.Writer, in io.Reader) error {
	buf := make([]byte, 4096)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			i := bytes.IndexByte(chunk, DetachKey)
			if i >= 0 {
				chunk = chunk[:i]
			}
			if len(chunk) > 0 {
				if _, werr := console.Write(chunk); werr != nil {
					return werr
				}
			}
			if i >= 0 {
				return errDetached
			}
		}
		if err == io.EOF {
			// The viewer sends no more input; a detached reader (kubectl
			// attach -i with a pipe) may still watch the output.
			return nil
		}
		if err != nil {
			return errInputClosed
		}
	}
}
