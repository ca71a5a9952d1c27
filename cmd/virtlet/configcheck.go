package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/core/presets"
)

// systemdRunDir exists on a node booted with systemd (sd_booted(3)).
var systemdRunDir = "/run/systemd/system"

// validate checks every key, and returns every problem it finds, each
// naming its key and flag.
func (c config) validate() error {
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		check(fmt.Errorf("%s %q: want text or json", named("logFormat"), c.LogFormat))
	}
	if _, err := logrus.ParseLevel(c.LogLevel); err != nil {
		check(fmt.Errorf("%s %q: want trace, debug, info, warn, error, fatal or panic", named("logLevel"), c.LogLevel))
	}
	_, err := c.memoryBytes()
	check(err)
	_, err = c.operationTimeout()
	check(err)
	_, err = c.limits()
	check(err)
	_, err = c.vmUsers()
	check(err)
	check(c.checkMetrics())
	if c.MigrationAddress != "" && (c.MigrationCert == "" || c.MigrationKey == "" || c.MigrationCA == "") {
		check(fmt.Errorf("%s is set without %s, %s and %s: the endpoint is mutual TLS with node certificates", named("migrationAddress"), named("migrationCert"), named("migrationKey"), named("migrationCA")))
	}
	if c.ForwardRuntime != "" && !strings.HasPrefix(c.ForwardRuntime, "unix:///") {
		check(fmt.Errorf("%s %q: want unix:///absolute/path/to/the/cri.sock", named("forwardRuntime"), c.ForwardRuntime))
	} else if c.ForwardRuntime != "" && strings.TrimPrefix(c.ForwardRuntime, "unix://") == strings.TrimPrefix(c.Listen, "unix://") {
		check(fmt.Errorf("%s %q is Virtlet's own socket (%s)", named("forwardRuntime"), c.ForwardRuntime, named("listen")))
	}
	if c.CgroupDriver != "" && c.CgroupDriver != "systemd" && c.CgroupDriver != "cgroupfs" {
		check(fmt.Errorf("%s %q: want systemd or cgroupfs", named("cgroupDriver"), c.CgroupDriver))
	}
	if c.Kubeconfig != "" && c.KubeObjectsDir != "" {
		check(fmt.Errorf("%s and %s are both set: choose one source of ConfigMaps and Secrets", named("kubeconfig"), named("kubeObjectsDir")))
	}
	return errors.Join(errs...)
}

// resolve fills in the defaults that depend on the node.
func (c *config) resolve() {
	if c.CgroupDriver == "" {
		c.CgroupDriver = "cgroupfs"
		if st, err := os.Stat(systemdRunDir); err == nil && st.IsDir() {
			c.CgroupDriver = "systemd"
		}
	}
}

// checkMetrics refuses an endpoint the network could reach unless the
// operator asked for it: the metrics name every pod and carry no
// authentication.
func (c config) checkMetrics() error {
	if c.MetricsAddress == "" {
		if c.MetricsAllowRemote {
			return fmt.Errorf("%s is set without %s: the metrics endpoint is off", named("metricsAllowRemote"), named("metricsAddress"))
		}
		return nil
	}
	host, port, err := net.SplitHostPort(c.MetricsAddress)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%s %q: want host:port, such as 127.0.0.1:9474", named("metricsAddress"), c.MetricsAddress)
	}
	if ip := net.ParseIP(host); !c.MetricsAllowRemote && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%s %q is not a loopback address: the endpoint has no authentication or TLS "+
			"and names every pod; use 127.0.0.1 or [::1], or set %s to serve it beyond this node", named("metricsAddress"), c.MetricsAddress, named("metricsAllowRemote"))
	}
	return nil
}

func (c config) operationTimeout() (time.Duration, error) {
	d, err := time.ParseDuration(c.OperationTimeout)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive duration such as 15m or 90s", named("operationTimeout"), c.OperationTimeout)
	}
	return d, nil
}

func (c config) memoryBytes() (int64, error) {
	q, err := resource.ParseQuantity(c.DefaultVMMemory)
	if err != nil || q.Value() <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive quantity such as 1Gi", named("defaultVMMemory"), c.DefaultVMMemory)
	}
	return q.Value(), nil
}

// limits reads the node's image and disk limits into core's options.
func (c config) limits() (core.Options, error) {
	var o core.Options
	for _, l := range []struct {
		key, value string
		into       *int64
	}{
		{"maxImageSize", c.MaxImageSize, &o.MaxImageBytes},
		{"maxVirtualSize", c.MaxVirtualSize, &o.MaxVirtualBytes},
		{"keepFreeSpace", c.KeepFreeSpace, &o.KeepFreeBytes},
	} {
		q, err := resource.ParseQuantity(l.value)
		if err != nil || q.Sign() < 0 {
			return o, fmt.Errorf("%s %q: want a quantity such as 64Gi, or 0 for no bound", named(l.key), l.value)
		}
		*l.into = q.Value()
	}
	return o, nil
}

// vmUsers reads the VMs' users: nil when off.
func (c config) vmUsers() (*core.VMUsers, error) {
	if c.VMUsers == "off" {
		return nil, nil
	}
	bad := func(why string) error {
		return fmt.Errorf("%s %q: %s; want FIRST-LAST user IDs such as %s, or off", named("vmUsers"), c.VMUsers, why, DefaultVMUsers)
	}
	first, last, ok := strings.Cut(c.VMUsers, "-")
	f, err1 := strconv.Atoi(strings.TrimSpace(first))
	l, err2 := strconv.Atoi(strings.TrimSpace(last))
	if !ok || err1 != nil || err2 != nil || l < f {
		return nil, bad("not a range")
	}
	gid := core.OwnGroup
	if c.VMGroup != "" && c.VMGroup != "own" {
		var err error
		if gid, err = strconv.Atoi(c.VMGroup); err != nil || gid < 0 {
			g, lerr := user.LookupGroup(c.VMGroup)
			if lerr != nil {
				return nil, fmt.Errorf("%s %q: no such group on this node; want own or a group", named("vmGroup"), c.VMGroup)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	u := &core.VMUsers{FirstUID: f, Count: l - f + 1, GID: gid}
	if err := u.Validate(); err != nil {
		return nil, bad(err.Error())
	}
	return u, nil
}

// presets reads the preset files of PresetsDir (nil without one). A
// directory that cannot be read, or a bad preset, stops the daemon.
func (c config) presets() (*presets.Set, error) {
	if c.PresetsDir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(c.PresetsDir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", named("presetsDir"), err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		name := e.Name()
		// Hidden entries are skipped: a mounted ConfigMap's ..data links.
		if strings.HasPrefix(name, ".") || e.IsDir() || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(c.PresetsDir, name))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", named("presetsDir"), err)
		}
		files[name] = b
	}
	set, err := presets.Load(files)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", named("presetsDir"), c.PresetsDir, err)
	}
	return set, nil
}
