package core

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// Limits of exec through the guest agent. The agent buffers a command's
// output until it ends and hands stdin over in one message, so both are
// bounded.
const (
	// MaxExecOutputBytes caps each of stdout and stderr; what is cut is
	// announced on stderr.
	MaxExecOutputBytes = 1 << 20
	// MaxExecStdinBytes bounds the input of one command.
	MaxExecStdinBytes = 1 << 20
)

// ExecResult is how a command in a guest ended.
type ExecResult struct {
	ExitCode       int32
	Stdout, Stderr []byte
}

// ExecStreams are the streams of an interactive-style exec (kubectl exec).
type ExecStreams struct {
	Stdin  io.Reader // nil: no input
	Stdout io.Writer // nil: discarded
	Stderr io.Writer // nil: discarded
	TTY    bool
}

func (r *accessService) guestExecer(c *Container) (ports.GuestExecer, error) {
	ge, ok := r.deps.Hypervisor.(ports.GuestExecer)
	if !ok {
		return nil, fmt.Errorf("exec in VM %s: the hypervisor plugin cannot run commands in guests: %w", c.Spec.Name, ports.ErrUnimplemented)
	}
	return ge, nil
}

// CheckExec tells whether cmd can be run in the container now (kubelet
// asks for the URL before it connects).
func (r *accessService) CheckExec(id string, cmd []string, tty bool) error {
	if err := checkCommand(cmd, tty); err != nil {
		return err
	}
	c, err := r.runningVM(id, "exec")
	if err != nil {
		return err
	}
	_, err = r.guestExecer(c)
	return err
}

func checkCommand(cmd []string, tty bool) error {
	if len(cmd) == 0 || cmd[0] == "" {
		return &ports.InvalidError{Field: "cmd", Reason: "the command is empty", Allowed: "the program to run in the guest and its arguments"}
	}
	if tty {
		return fmt.Errorf("exec with a terminal (-t) is not available for VM pods: the guest agent runs commands without a terminal; "+
			"run commands without -t, or open a shell with `virtletctl ssh <pod>`: %w", ports.ErrUnimplemented)
	}
	return nil
}

// ExecSync runs cmd in the VM's guest through its guest agent and returns
// its exit code and output. timeout 0 means no limit; when the command
// outlives it, its guest process is killed and the error wraps
// context.DeadlineExceeded (kubelet's exec probes read that as a timeout).
//
// A halted VM's container runs for kubelet, which keeps probing it: the
// command "ends" with ExitHalted and the reason on stderr, so that exec
// probes fail (kubelet ignores a probe that errors: the pod would stay
// Ready).
func (r *accessService) ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) (ExecResult, error) {
	if err := checkCommand(cmd, false); err != nil {
		return ExecResult{}, err
	}
	if c, err := r.vms.ContainerStatus(ctx, id); err == nil && c.Halted() {
		return ExecResult{ExitCode: ExitHalted, Stderr: []byte(haltedError("exec", &c).Error() + "\n")}, nil
	}
	return r.exec(ctx, id, cmd, nil, timeout)
}

// ExitHalted is the exit code of a command "run" in a halted VM (a shell's
// "cannot execute").
const ExitHalted = 126

// Exec runs cmd with streams (kubectl exec, crictl exec). The guest agent
// hands output over when the command ends, so output arrives at the end;
// stdin is read to its end before the command starts.
func (r *accessService) Exec(ctx context.Context, id string, cmd []string, s ExecStreams) (int32, error) {
	if err := checkCommand(cmd, s.TTY); err != nil {
		return 0, err
	}
	var stdin []byte
	if s.Stdin != nil {
		var err error
		stdin, err = io.ReadAll(io.LimitReader(s.Stdin, MaxExecStdinBytes+1))
		if err != nil {
			return 0, fmt.Errorf("exec: read stdin: %w", err)
		}
		if len(stdin) > MaxExecStdinBytes {
			return 0, &ports.InvalidError{Field: "stdin", Reason: "more input than the guest agent takes in one command",
				Allowed: fmt.Sprintf("at most %d bytes (for more, copy with `virtletctl ssh`)", MaxExecStdinBytes)}
		}
	}
	res, err := r.exec(ctx, id, cmd, stdin, 0)
	if err != nil {
		return 0, err
	}
	for _, o := range []struct {
		w    io.Writer
		data []byte
	}{{s.Stdout, res.Stdout}, {s.Stderr, res.Stderr}} {
		if o.w != nil && len(o.data) > 0 {
			if _, err := o.w.Write(o.data); err != nil {
				return 0, fmt.Errorf("exec: write output: %w", err)
			}
		}
	}
	return res.ExitCode, nil
}

func (r *accessService) exec(ctx context.Context, id string, cmd []string, stdin []byte, timeout time.Duration) (ExecResult, error) {
	c, err := r.runningVM(id, "exec")
	if err != nil {
		return ExecResult{}, err
	}
	ge, err := r.guestExecer(c)
	if err != nil {
		return ExecResult{}, err
	}
	start := time.Now()
	res, err := ge.GuestExec(ctx, c.ID, ports.GuestExecRequest{Argv: cmd, Stdin: stdin, Timeout: timeout, MaxOutputBytes: MaxExecOutputBytes})
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in VM %s: %w", c.Spec.Name, err)
	}
	log := r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name, "command": cmd[0],
		"exitCode": res.ExitCode, "duration": time.Since(start).Round(time.Millisecond)})
	if res.TimedOut {
		what := fmt.Sprintf("the guest process (pid %d) was killed", res.PID)
		if !res.Killed {
			what = fmt.Sprintf("the guest process (pid %d) could not be killed and may still run: %s", res.PID, res.KillError)
		}
		log.WithField("killed", res.Killed).Warn("exec timed out")
		// Only the program's name: the error reaches logs, and arguments
		// may carry secrets.
		return ExecResult{}, fmt.Errorf("exec in VM %s: %q did not finish within %s; %s: %w",
			c.Spec.Name, cmd[0], timeout, what, context.DeadlineExceeded)
	}
	log.Debug("exec")
	out := ExecResult{ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr}
	for _, t := range []struct {
		cut  bool
		name string
	}{{res.StdoutTruncated, "stdout"}, {res.StderrTruncated, "stderr"}} {
		if t.cut {
			out.Stderr = append(out.Stderr, fmt.Sprintf("\n[virtlet: %s cut at %d bytes; exec through the guest agent returns at most that]\n", t.name, MaxExecOutputBytes)...)
		}
	}
	return out, nil
}

// GuestInfo is the guest's own account of itself, from its agent (OS,
// host name, interfaces): `virtletctl status`.
func (r *accessService) GuestInfo(ctx context.Context, id string) (ports.GuestInfo, error) {
	c, err := r.runningVM(id, "guest information")
	if err != nil {
		return ports.GuestInfo{}, err
	}
	gi, ok := r.deps.Hypervisor.(ports.GuestInformer)
	if !ok {
		return ports.GuestInfo{}, fmt.Errorf("guest information of VM %s: the hypervisor plugin cannot ask guests: %w", c.Spec.Name, ports.ErrUnimplemented)
	}
	return gi.GuestInfo(ctx, c.ID)
}
