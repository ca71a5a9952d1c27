package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/virtlet/virtlet/core"
)

// The config file takes durations as operators write them.
func TestConfigFileDurations(t *testing.T) {
	for _, tc := range []struct {
		file, flag string
		want       time.Duration
		err        string
	}{
		{file: "operationTimeout: 15m\n", want: 15 * time.Minute},
		{file: "operationTimeout: 90s\n", want: 90 * time.Second},
		{file: "logLevel: info\n", want: 15 * time.Minute},
		{file: "operationTimeout: 15m\n", flag: "2m", want: 2 * time.Minute},
		{file: "operationTimeout: soon\n", err: `operationTimeout (--operation-timeout) "soon": want a positive duration`},
		{file: "operationTimeout: -1m\n", err: "want a positive duration"},
		{file: "operationTimeout: 15m\n", flag: "0s", err: "want a positive duration"},
	} {
		args := []string{"--config", writeConfig(t, tc.file)}
		if tc.flag != "" {
			args = append(args, "--operation-timeout", tc.flag)
		}
		cfg, _, err := parseConfig(args)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: got %v, want an error with %q", tc.file, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.file, err)
		default:
			if got, _ := cfg.operationTimeout(); got != tc.want {
				t.Errorf("%q %s: operation timeout %s, want %s", tc.file, tc.flag, got, tc.want)
			}
		}
	}
}

// The cgroup driver kubelet is told to use: chosen, or picked from how the
// node was booted.
func TestCgroupDriver(t *testing.T) {
	booted := t.TempDir()
	defer func(dir string) { systemdRunDir = dir }(systemdRunDir)
	for _, tc := range []struct {
		args      []string
		systemdOn bool
		want, err string
	}{
		{want: "cgroupfs"},
		{systemdOn: true, want: "systemd"},
		{args: []string{"--cgroup-driver", "cgroupfs"}, systemdOn: true, want: "cgroupfs"},
		{args: []string{"--cgroup-driver", "systemd"}, want: "systemd"},
		{args: []string{"--cgroup-driver", "cgroupv2"}, err: `cgroupDriver (--cgroup-driver) "cgroupv2": want systemd or cgroupfs`},
	} {
		systemdRunDir = filepath.Join(booted, "absent")
		if tc.systemdOn {
			systemdRunDir = booted
		}
		cfg, _, err := parseConfig(tc.args)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: got %v, want an error with %q", tc.args, err, tc.err)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case cfg.CgroupDriver != tc.want:
			t.Errorf("%v (systemd booted: %v): cgroup driver %q, want %q", tc.args, tc.systemdOn, cfg.CgroupDriver, tc.want)
		}
	}
}

func TestForwardRuntime(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		want, err string
	}{
		{want: ""},
		{args: []string{"--forward-runtime", "unix:///run/containerd/containerd.sock"}, want: "unix:///run/containerd/containerd.sock"},
		{args: []string{"--forward-runtime", "/run/containerd/containerd.sock"}, err: `forwardRuntime (--forward-runtime) "/run/containerd/containerd.sock": want unix:///`},
		{args: []string{"--forward-runtime", "tcp://10.0.0.1:1234"}, err: "want unix:///"},
		{args: []string{"--listen", "unix:///run/v.sock", "--forward-runtime", "unix:///run/v.sock"}, err: "is Virtlet's own socket"},
	} {
		cfg, _, err := parseConfig(tc.args)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: got %v, want an error with %q", tc.args, err, tc.err)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case cfg.ForwardRuntime != tc.want:
			t.Errorf("%v: forward runtime %q, want %q", tc.args, cfg.ForwardRuntime, tc.want)
		}
	}
}

// The metrics endpoint is off by default, and stays on loopback unless the
// operator says otherwise, in the config file or with a flag.
func TestMetricsAddress(t *testing.T) {
	for _, tc := range []struct {
		file      string
		args      []string
		want, err string
		remote    bool
	}{
		{want: ""},
		{args: []string{"--metrics-address", "127.0.0.1:9474"}, want: "127.0.0.1:9474"},
		{args: []string{"--metrics-address", "[::1]:9474"}, want: "[::1]:9474"},
		{args: []string{"--metrics-address", "localhost:0"}, want: "localhost:0"},
		{file: "metricsAddress: 127.0.0.2:9474\n", want: "127.0.0.2:9474"},
		{file: "metricsAddress: 127.0.0.1:9474\n", args: []string{"--metrics-address", "127.0.0.1:9500"}, want: "127.0.0.1:9500"},
		{args: []string{"--metrics-address", "0.0.0.0:9474"},
			err: `metricsAddress (--metrics-address) "0.0.0.0:9474" is not a loopback address`},
		{args: []string{"--metrics-address", ":9474"}, err: "set metricsAllowRemote (--metrics-allow-remote)"},
		{args: []string{"--metrics-address", "10.1.2.3:9474"}, err: "is not a loopback address"},
		{args: []string{"--metrics-address", "node.example.com:9474"}, err: "is not a loopback address"},
		{file: "metricsAddress: 0.0.0.0:9474\n", err: "is not a loopback address"},
		{args: []string{"--metrics-address", "0.0.0.0:9474", "--metrics-allow-remote"}, want: "0.0.0.0:9474", remote: true},
		{file: "metricsAddress: 0.0.0.0:9474\nmetricsAllowRemote: true\n", want: "0.0.0.0:9474", remote: true},
		{file: "metricsAddress: \":9474\"\n", args: []string{"--metrics-allow-remote"}, want: ":9474", remote: true},
		{file: "metricsAddress: 0.0.0.0:9474\nmetricsAllowRemote: true\n", args: []string{"--metrics-allow-remote=false"},
			err: "is not a loopback address"},
		{args: []string{"--metrics-address", "9474"}, err: `metricsAddress (--metrics-address) "9474": want host:port`},
		{args: []string{"--metrics-address", "127.0.0.1:http"}, err: "want host:port"},
		{args: []string{"--metrics-address", "127.0.0.1:70000"}, err: "want host:port"},
		{args: []string{"--metrics-allow-remote"}, err: "metricsAllowRemote (--metrics-allow-remote) is set without metricsAddress (--metrics-address)"},
	} {
		args := tc.args
		if tc.file != "" {
			args = append([]string{"--config", writeConfig(t, tc.file)}, args...)
		}
		cfg, _, err := parseConfig(args)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q %v: got %v, want an error with %q", tc.file, tc.args, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q %v: %v", tc.file, tc.args, err)
		case cfg.MetricsAddress != tc.want || cfg.MetricsAllowRemote != tc.remote:
			t.Errorf("%q %v: metrics address %q (remote %v), want %q (remote %v)", tc.file, tc.args, cfg.MetricsAddress, cfg.MetricsAllowRemote, tc.want, tc.remote)
		}
	}
}

// Every VM gets a user of its own from a range, by default; the range and
// the group are checked where they are read.
func TestVMUsers(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		first int
		count int
		gid   int
		off   bool
		err   string
	}{
		{args: nil, first: 2000000000, count: 65536, gid: core.OwnGroup},
		{args: []string{"--vm-group", "own"}, first: 2000000000, count: 65536, gid: core.OwnGroup},
		{args: []string{"--vm-users", "3000000-3000009", "--vm-group", "0"}, first: 3000000, count: 10, gid: 0},
		{args: []string{"--vm-group", "root"}, first: 2000000000, count: 65536, gid: 0},
		{args: []string{"--vm-users", "off"}, off: true},
		{args: []string{"--vm-users", "1000-2000"}, err: `vmUsers (--vm-users) "1000-2000": VM users' first UID`},
		{args: []string{"--vm-users", "lots"}, err: "not a range"},
		{args: []string{"--vm-users", "3000009-3000000"}, err: "not a range"},
		{args: []string{"--vm-group", "no-such-group-here"}, err: `vmGroup (--vm-group) "no-such-group-here": no such group`},
	} {
		cfg, _, err := parseConfig(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		u, _ := cfg.vmUsers()
		switch {
		case tc.off && u != nil:
			t.Errorf("%v: VM users %+v, want off", tc.args, u)
		case !tc.off && (u == nil || u.FirstUID != tc.first || u.Count != tc.count || u.GID != tc.gid):
			t.Errorf("%v: VM users %+v", tc.args, u)
		}
	}
}

// The presets directory: YAML files are presets; hidden entries (a mounted
// ConfigMap's ..data) and other files are not; a bad preset stops the
// daemon naming its file.
func TestPresetsDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("small.yaml", "name: small\nvcpus: 1\nmemory: 512Mi\n")
	write("q35.yml", "name: q35\nannotations: {VirtletMachineType: q35}\n")
	write(".hidden.yaml", "not: a preset\n")
	write("README", "the presets of this node\n")
	cfg, _, err := parseConfig([]string{"--presets-dir", dir})
	if err != nil {
		t.Fatal(err)
	}
	set, err := cfg.presets()
	if err != nil || strings.Join(set.Names(), ",") != "q35,small" {
		t.Fatalf("presets %v, %v; want q35 and small", set.Names(), err)
	}
	write("bad.yaml", "name: bad\nannotations: {VirtletVCPUCount: lots}\n")
	if _, err := cfg.presets(); err == nil || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), "VirtletVCPUCount") {
		t.Errorf("a bad preset: %v", err)
	}
	cfg.PresetsDir = filepath.Join(dir, "missing")
	if _, err := cfg.presets(); err == nil || !strings.Contains(err.Error(), "--presets-dir") {
		t.Errorf("a missing presets directory: %v", err)
	}
}

// The node's limits: defaults, flags, 0 for no bound, and a bad value
// named with its key and flag.
func TestLimits(t *testing.T) {
	for _, tc := range []struct {
		args                 []string
		image, virtual, keep int64
		err                  string
	}{
		{args: nil, image: 64 << 30, virtual: 1 << 40, keep: 1 << 30},
		{args: []string{"--max-image-size", "2Gi", "--max-virtual-size", "0", "--keep-free-space", "500Mi"}, image: 2 << 30, keep: 500 << 20},
		{args: []string{"--max-image-size", "huge"}, err: `maxImageSize (--max-image-size) "huge": want a quantity such as 64Gi, or 0 for no bound`},
		{args: []string{"--keep-free-space", "-1Gi"}, err: `keepFreeSpace (--keep-free-space) "-1Gi"`},
	} {
		cfg, _, err := parseConfig(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.err)
			}
			continue
		}
		l, err := cfg.limits()
		if err != nil || l.MaxImageBytes != tc.image || l.MaxVirtualBytes != tc.virtual || l.KeepFreeBytes != tc.keep {
			t.Errorf("%v: %+v %v", tc.args, l, err)
		}
	}
}

// --help is an answer, not an error (pflag's ErrHelp: main exits 0), and
// the flags are long, as every Kubernetes component's.
func TestHelpIsNotAnError(t *testing.T) {
	if _, _, err := parseConfig([]string{"--help"}); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("--help: %v, want pflag.ErrHelp", err)
	}
	if _, _, err := parseConfig([]string{"-state-dir", "/x"}); err == nil {
		t.Error("a single-dash long flag was taken")
	}
	cfg, _, err := parseConfig([]string{"--state-dir", "/x", "--allow-watchdog-dump"})
	if err != nil || cfg.StateDir != "/x" || !cfg.AllowWatchdogDump {
		t.Errorf("long flags: %+v %v", cfg, err)
	}
}

// writeConfig writes a config file of this version with body's keys.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "virtlet.yaml")
	header := "apiVersion: " + configAPIVersion + "\nkind: " + configKind + "\n"
	if err := os.WriteFile(path, []byte(header+body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
