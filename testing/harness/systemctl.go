package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Systemctl stands in for a node's systemctl where this machine has no
// systemd (PID 1 is not systemd, and systemd-nspawn needs a system bus):
// the node installer runs Script as the host's systemctl, which asks this
// test process over a unix socket. It knows what the installer asks for:
//
//	daemon-reload                 nothing to do (units are read when started)
//	enable --now virtlet.service  runs the installed unit's ExecStart
//	disable --now virtlet.service SIGTERM to it (its process group), SIGKILL after 30 s
//	restart kubelet.service       the harness kubelet restarted, reading its configuration file
//
// What it does not show is systemd's own behaviour (ordering, restarts,
// the unit's sandboxing): systemd-analyze checks the unit file instead
// (deploy's TestUnitIsHardened).
type Systemctl struct {
	Script string
	// UnitDir is where the installer puts units (its prefix's
	// /etc/systemd/system).
	UnitDir string
	k       *Kube
	dir     string
	srv     *http.Server
	mu      sync.Mutex
	calls   []string
	units   map[string]*unit
}

type unit struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// NewSystemctl serves the stand-in for the node of k, whose units are in
// unitDir; it stops what it started when the test ends.
func NewSystemctl(t testing.TB, k *Kube, unitDir string) *Systemctl {
	t.Helper()
	dir := filepath.Join(k.Dir, "systemctl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &Systemctl{Script: filepath.Join(dir, "systemctl"), UnitDir: unitDir, k: k, dir: dir, units: map[string]*unit{}}
	sock := filepath.Join(dir, "systemctl.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve)}
	go s.srv.Serve(l)
	script := fmt.Sprintf("#!/bin/sh\n# The test's stand-in for systemctl (testing/harness/systemctl.go).\nexec curl -sS --fail-with-body --max-time 120 --unix-socket %s --data-urlencode \"args=$*\" http://systemctl/\n", sock)
	if err := os.WriteFile(s.Script, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.srv.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for name := range s.units {
			s.stopUnit(name)
		}
	})
	return s
}

// Calls are the commands the stand-in was given, in order.
func (s *Systemctl) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// Running tells whether the named unit's process runs.
func (s *Systemctl) Running(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.units[name]
	if u == nil {
		return false
	}
	select {
	case <-u.done:
		return false
	default:
		return true
	}
}

// UnitLog is what the named unit's process wrote.
func (s *Systemctl) UnitLog(name string) string {
	b, _ := os.ReadFile(filepath.Join(s.dir, name+".log"))
	return string(b)
}

func (s *Systemctl) serve(w http.ResponseWriter, r *http.Request) {
	args := strings.Fields(r.FormValue("args"))
	s.mu.Lock()
	s.calls = append(s.calls, strings.Join(args, " "))
	s.mu.Unlock()
	err := s.run(args)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (s *Systemctl) run(args []string) error {
	cmd := strings.Join(args, " ")
	switch {
	case cmd == "daemon-reload":
		return nil
	case cmd == "restart kubelet.service" || cmd == "restart kubelet":
		return s.k.RestartKubeletProcess()
	case len(args) == 3 && args[0] == "enable" && args[1] == "--now":
		return s.startUnit(args[2])
	case len(args) == 3 && args[0] == "disable" && args[1] == "--now":
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.stopUnit(args[2])
	}
	return fmt.Errorf("the test's systemctl stand-in does not do %q", cmd)
}

// startUnit runs the unit file's ExecStart in a process group of its own.
func (s *Systemctl) startUnit(name string) error {
	b, err := os.ReadFile(filepath.Join(s.UnitDir, name))
	if err != nil {
		return fmt.Errorf("unit %s: %w", name, err)
	}
	var argv []string
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			argv = strings.Fields(v)
		}
	}
	if len(argv) == 0 {
		return fmt.Errorf("unit %s has no ExecStart", name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if u := s.units[name]; u != nil {
		select {
		case <-u.done:
		default:
			return nil // running: enable --now does nothing more
		}
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("unit %s: %w", name, err)
	}
	u := &unit{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(u.done) }()
	s.units[name] = u
	return nil
}

// stopUnit ends a unit's process group, as KillMode=mixed with
// TimeoutStopSec=30 does; s.mu is held.
func (s *Systemctl) stopUnit(name string) error {
	u := s.units[name]
	if u == nil {
		return nil
	}
	pid := u.cmd.Process.Pid
	syscall.Kill(pid, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	select {
	case <-u.done:
	case <-ctx.Done():
	}
	// What the main process left in its group goes too.
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	<-u.done
	return nil
}
