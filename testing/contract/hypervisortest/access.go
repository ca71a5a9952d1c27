package hypervisortest

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// runAccess checks the ways into a running VM that the implementation
// offers (ConsoleOpener, GuestExecer, StatsReporter, VMInspector).
func runAccess(t *testing.T, env Env, vmID string) {
	hv := env.Hypervisor
	ctx := context.Background()
	if err := hv.Define(ctx, env.NewSpec(t, vmID)); err != nil {
		t.Fatal(err)
	}
	defer hv.Undefine(ctx, vmID)
	if err := hv.Start(ctx, vmID); err != nil {
		t.Fatal(err)
	}

	var second io.ReadWriteCloser
	if co, ok := hv.(ports.ConsoleOpener); ok {
		t.Run("console viewers share the console", func(t *testing.T) {
			one, err := co.OpenConsole(ctx, vmID)
			if err != nil {
				t.Fatal(err)
			}
			if second, err = co.OpenConsole(ctx, vmID); err != nil {
				t.Fatal(err)
			}
			if _, err := one.Write([]byte("\r")); err != nil {
				t.Fatalf("write to the console: %v", err)
			}
			for i, v := range []io.Reader{one, second} {
				got := make(chan error, 1)
				go func() {
					_, err := v.Read(make([]byte, 256))
					got <- err
				}()
				select {
				case err := <-got:
					if err != nil {
						t.Fatalf("viewer %d: %v", i+1, err)
					}
				case <-time.After(60 * time.Second):
					t.Fatalf("viewer %d saw no console output", i+1)
				}
			}
			one.Close()
		})
	}
	if sr, ok := hv.(ports.StatsReporter); ok {
		t.Run("stats of the running VM only", func(t *testing.T) {
			stats, err := sr.Stats(ctx, []string{vmID, "0000000000000000"})
			if err != nil || len(stats) != 1 {
				t.Fatalf("Stats: %+v %v", stats, err)
			}
			s := stats[0]
			root := false
			for _, d := range s.Disks {
				root = root || d.Name == "root"
			}
			if s.ID != vmID || s.CPUNanos == 0 || s.Memory.CurrentBytes == 0 || !root || s.Timestamp.IsZero() {
				t.Fatalf("stats %+v", s)
			}
		})
	}
	if vi, ok := hv.(ports.VMInspector); ok {
		t.Run("diagnostics", func(t *testing.T) {
			d, err := vi.Diagnose(ctx, vmID)
			if err != nil || d.Definition == "" {
				t.Fatalf("Diagnose: %+v %v", d, err)
			}
			if _, err := vi.Inspect(ctx, vmID, []string{"destroy"}); !errors.Is(err, ports.ErrInvalidArgument) {
				t.Fatalf("Inspect destroy: %v", err)
			}
			disp, err := vi.Display(ctx, vmID)
			if err != nil || disp.Protocol != "vnc" || disp.Address == "" {
				t.Fatalf("Display: %+v %v", disp, err)
			}
		})
	}
	if ge, ok := hv.(ports.GuestExecer); ok {
		t.Run("guest exec", func(t *testing.T) {
			// Without an agent the answer must not wait for one: it comes
			// long before the command's own timeout (the bound is loose so
			// that a loaded machine does not fail it; the figure is logged).
			const timeout = 2 * time.Minute
			start := time.Now()
			res, err := ge.GuestExec(ctx, vmID, ports.GuestExecRequest{Argv: []string{"hostname"}, Timeout: timeout})
			took := time.Since(start)
			if env.GuestAgent {
				if err != nil || res.ExitCode != 0 || len(res.Stdout) == 0 {
					t.Fatalf("hostname: %+v %v", res, err)
				}
				return
			}
			if !errors.Is(err, ports.ErrFailedPrecondition) || took > timeout/4 {
				t.Fatalf("a guest without agent: %v after %s", err, took)
			}
			t.Logf("no-agent error after %s", took.Round(time.Millisecond))
		})
	}

	if vc, ok := hv.(ports.VMCheckpointer); ok {
		t.Run("a checkpoint leaves the VM running", func(t *testing.T) { checkpointRunning(t, hv, vc, vmID) })
	}

	if _, err := hv.Stop(ctx, vmID, 0); err != nil {
		t.Fatal(err)
	}
	if vc, ok := hv.(ports.VMCheckpointer); ok {
		if _, err := vc.CheckpointVM(ctx, vmID, t.TempDir()); !errors.Is(err, ports.ErrFailedPrecondition) && !errors.Is(err, ports.ErrUnimplemented) {
			t.Errorf("checkpoint of a stopped VM: %v", err)
		}
	}
	if co, ok := hv.(ports.ConsoleOpener); ok {
		if _, err := co.OpenConsole(ctx, vmID); !errors.Is(err, ports.ErrFailedPrecondition) {
			t.Errorf("console of a stopped VM: %v", err)
		}
		if second != nil {
			ended := make(chan struct{})
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := second.Read(buf); err != nil {
						close(ended)
						return
					}
				}
			}()
			select {
			case <-ended:
			case <-time.After(30 * time.Second):
				t.Error("a viewer's stream outlived the VM")
			}
			second.Close()
		}
	}
	if sr, ok := hv.(ports.StatsReporter); ok {
		if stats, err := sr.Stats(ctx, []string{vmID}); err != nil || len(stats) != 0 {
			t.Errorf("stats of a stopped VM: %+v %v", stats, err)
		}
	}
	if co, ok := hv.(ports.ConsoleOpener); ok {
		t.Run("viewers attaching while the VM stops", func(t *testing.T) { attachWhileStopping(t, hv, co, vmID) })
	}
}

// attachWhileStopping: viewers come and go while the VM is forced off; the
// implementation must neither deadlock (every call still answers) nor keep
// a viewer attached to the stopped VM.
func attachWhileStopping(t *testing.T, hv ports.Hypervisor, co ports.ConsoleOpener, vmID string) {
	ctx := context.Background()
	for round := 0; round < 3; round++ {
		if err := hv.Start(ctx, vmID); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		const viewers = 4
		for i := 0; i < viewers; i++ {
			go func() {
				defer func() { done <- struct{}{} }()
				for {
					select {
					case <-stop:
						return
					default:
					}
					v, err := co.OpenConsole(ctx, vmID)
					if err != nil {
						continue // stopped, or stopping
					}
					go io.Copy(io.Discard, v)
					time.Sleep(time.Millisecond)
					v.Close()
				}
			}()
		}
		time.Sleep(200 * time.Millisecond)
		if _, err := hv.Stop(ctx, vmID, 0); err != nil {
			t.Fatal(err)
		}
		close(stop)
		for i := 0; i < viewers; i++ {
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: a viewer hangs in OpenConsole or Close after the VM stopped", round)
			}
		}
		answered := make(chan error, 1)
		go func() {
			_, err := hv.Status(ctx, vmID)
			answered <- err
		}()
		select {
		case err := <-answered:
			if err != nil {
				t.Fatalf("Status after attaching while stopping: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the hypervisor no longer answers after viewers attached while the VM stopped (deadlock)", round)
		}
		if _, err := co.OpenConsole(ctx, vmID); !errors.Is(err, ports.ErrFailedPrecondition) {
			t.Fatalf("round %d: console of the stopped VM: %v", round, err)
		}
	}
}
