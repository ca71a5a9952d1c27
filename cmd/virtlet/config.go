package main

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/adapters/admin"
	"github.com/virtlet/virtlet/adapters/imagetranslations"
	"github.com/virtlet/virtlet/adapters/streaming"
	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/core/presets"
	"github.com/virtlet/virtlet/plugins/manifest"
)

// config is the daemon's configuration: defaults, then the config file,
// then command-line flags.
type config struct {
	Listen            string `json:"listen"`
	AdminSocket       string `json:"adminSocket"`
	StateDir          string `json:"stateDir"`
	PluginsDir        string `json:"pluginsDir"`
	PluginBinDir      string `json:"pluginBinDir"`
	ImageTranslations string `json:"imageTranslationsDir"`
	LogFormat         string `json:"logFormat"`
	LogLevel          string `json:"logLevel"`
	DefaultVMMemory   string `json:"defaultVMMemory"`
	// OperationTimeout is a duration such as "15m" (Go's syntax).
	OperationTimeout string `json:"operationTimeout"`
	// Kubeconfig is how the daemon reads ConfigMaps and Secrets; empty
	// means in-cluster when running in a pod, else none.
	Kubeconfig string `json:"kubeconfig"`
	// KubeObjectsDir serves ConfigMaps and Secrets from manifests instead
	// of an API server.
	KubeObjectsDir string `json:"kubeObjectsDir"`
	// StreamingAddress is where the CRI streaming server (exec, attach,
	// port-forward) listens: a loopback host:port; port 0 picks a free one.
	StreamingAddress string `json:"streamingAddress"`
	// CgroupDriver is what RuntimeConfig tells kubelet to use for pod
	// cgroups: "systemd" or "cgroupfs"; empty picks systemd on a node
	// booted with systemd, else cgroupfs.
	CgroupDriver string `json:"cgroupDriver"`
	// ForwardRuntime is the CRI endpoint (unix:///path) of a container
	// runtime that serves every pod that is not a VM pod; empty refuses them.
	ForwardRuntime string `json:"forwardRuntime"`
	// MetricsAddress is where the Prometheus endpoint (/metrics, /healthz)
	// listens, host:port; empty: no endpoint. Port 0 picks a free one.
	MetricsAddress string `json:"metricsAddress"`
	// MetricsAllowRemote lets MetricsAddress be other than a loopback
	// address: the endpoint has no authentication and no TLS.
	MetricsAllowRemote bool `json:"metricsAllowRemote"`
	// VMUsers is the range of host user IDs the VMs run as, one each
	// ("FIRST-LAST"), or "off": every VM runs as qemu.conf's one user.
	VMUsers string `json:"vmUsers"`
	// VMGroup is "own" (the default: each VM's group is its own, the ID of
	// its user) or a group (name or ID) every VM runs in. A shared group
	// lets each VM's QEMU reach the others' group-accessible files, such
	// as libvirt's guest agent sockets.
	VMGroup string `json:"vmGroup"`
	// PresetsDir holds the operator's VM presets, one YAML file each
	// (*.yaml, *.yml); empty: none.
	PresetsDir string `json:"presetsDir"`
	// AllowWatchdogDump lets pods set VirtletWatchdogAction: dump, which
	// makes libvirtd write a guest's memory to the node's disk (its
	// auto_dump_path) as root when the guest's watchdog fires. The libvirt
	// plugin keeps a VM's newest dump only and removes it with the VM.
	AllowWatchdogDump bool `json:"allowWatchdogDump"`
	// MaxImageSize bounds an image's download, MaxVirtualSize the disk a
	// guest sees (an image's virtual size, VirtletRootVolumeSize), and
	// KeepFreeSpace is the space pulls leave free on the image store's
	// file system: quantities such as 64Gi; "0" lifts the bound.
	MaxImageSize   string `json:"maxImageSize"`
	MaxVirtualSize string `json:"maxVirtualSize"`
	KeepFreeSpace  string `json:"keepFreeSpace"`
}

// DefaultVMUsers lies above every user a node's system and its people
// have, and above the subordinate IDs container runtimes hand out.
const DefaultVMUsers = "2000000000-2000065535"

// systemdRunDir exists on a node booted with systemd (sd_booted(3)).
var systemdRunDir = "/run/systemd/system"

func defaults() config {
	bin := ""
	if exe, err := os.Executable(); err == nil {
		bin = dirOf(exe)
	}
	return config{
		Listen: "unix:///run/virtlet.sock", AdminSocket: admin.DefaultSocket, StateDir: "/var/lib/virtlet", PluginsDir: manifest.DefaultDir,
		PluginBinDir: bin, ImageTranslations: imagetranslations.DefaultDir, LogFormat: "text", LogLevel: "info", DefaultVMMemory: "1Gi", OperationTimeout: "15m",
		StreamingAddress: streaming.DefaultAddress, VMUsers: DefaultVMUsers,
		MaxImageSize: "64Gi", MaxVirtualSize: "1Ti", KeepFreeSpace: "1Gi",
	}
}

func dirOf(p string) string {
	if i := strings.LastIndex(p, "/"); i > 0 {
		return p[:i]
	}
	return "/"
}

// configKeys lists the config file's keys, in the struct's order.
func configKeys() []string {
	var keys []string
	typ := reflect.TypeOf(config{})
	for i := 0; i < typ.NumField(); i++ {
		if key, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ","); key != "" && key != "-" {
			keys = append(keys, key)
		}
	}
	return keys
}

// parseConfig reads flags (and the config file they name).
func parseConfig(args []string) (config, bool, error) {
	cfg := defaults()
	// pflag, as every Kubernetes component: --long flags, --help exits 0.
	fs := pflag.NewFlagSet("virtlet", pflag.ContinueOnError)
	fs.SortFlags = false
	configFile := fs.String("config", "", "YAML config file (keys: "+strings.Join(configKeys(), ", ")+"); flags override it")
	showVersion := fs.Bool("version", false, "print the version and exit")
	listen := fs.String("listen", cfg.Listen, "CRI endpoint to serve, unix:///path.sock")
	adminSocket := fs.String("admin-socket", cfg.AdminSocket, "unix socket of the admin API (mode 0600) the flexvolume driver and node tools use")
	stateDir := fs.String("state-dir", cfg.StateDir, "directory for the state database, images and plugin state")
	pluginsDir := fs.String("plugins-dir", cfg.PluginsDir, "directory of plugin manifests; when it does not exist the embedded default set is used")
	pluginBinDir := fs.String("plugin-bin-dir", cfg.PluginBinDir, "where the default plugins' binaries are")
	translations := fs.String("image-translations-dir", cfg.ImageTranslations, "directory of image name translation configs (reloaded when they change)")
	logFormat := fs.String("log-format", cfg.LogFormat, "log format: text or json")
	logLevel := fs.String("log-level", cfg.LogLevel, "log level: trace, debug, info, warn, error")
	memory := fs.String("default-vm-memory", cfg.DefaultVMMemory, "memory of a VM whose container has no memory limit")
	opTimeout := fs.String("operation-timeout", cfg.OperationTimeout, "bound of slow operations that outlive kubelet's request")
	kubeconfig := fs.String("kubeconfig", cfg.Kubeconfig, "kubeconfig for reading the ConfigMaps and Secrets VM pods name (default: in-cluster config when running in a pod)")
	kubeObjectsDir := fs.String("kube-objects-dir", cfg.KubeObjectsDir, "read ConfigMaps and Secrets from the Kubernetes manifests in this directory instead of an API server")
	streamingAddress := fs.String("streaming-address", cfg.StreamingAddress, "loopback host:port of the CRI streaming server (exec, attach, port-forward) that kubelet proxies; port 0 picks a free port")
	cgroupDriver := fs.String("cgroup-driver", cfg.CgroupDriver, "cgroup driver kubelet must use (CRI RuntimeConfig): systemd or cgroupfs (default: systemd when the node runs systemd)")
	forwardRuntime := fs.String("forward-runtime", cfg.ForwardRuntime, "CRI endpoint of a container runtime (unix:///run/containerd/containerd.sock) that serves the pods that are not VM pods, so that one node runs both; empty: such pods are refused")
	metricsAddress := fs.String("metrics-address", cfg.MetricsAddress, "host:port of the Prometheus endpoint (/metrics, /healthz), such as 127.0.0.1:9474; a loopback address unless --metrics-allow-remote; empty: no endpoint")
	vmUsers := fs.String("vm-users", cfg.VMUsers, "host user IDs the VMs run as, one each, FIRST-LAST, so that one VM's QEMU cannot open another's disks; off: every VM runs as qemu.conf's user")
	presetsDir := fs.String("presets-dir", cfg.PresetsDir, "directory of VM presets (one YAML file each) that pods select by name (VirtletPreset) or that select pods by label; read at start")
	vmGroup := fs.String("vm-group", cfg.VMGroup, "with --vm-users: own (each VM a group of its own, the default) or a group (name or ID) every VM runs in")
	maxImage := fs.String("max-image-size", cfg.MaxImageSize, "the largest image a pull downloads (a quantity such as 64Gi; 0: no bound)")
	maxVirtual := fs.String("max-virtual-size", cfg.MaxVirtualSize, "the largest disk a guest may see: an image's virtual size, VirtletRootVolumeSize (0: no bound)")
	keepFree := fs.String("keep-free-space", cfg.KeepFreeSpace, "the space pulls leave free on the image store's file system (0: none)")
	allowDump := fs.Bool("allow-watchdog-dump", cfg.AllowWatchdogDump, "let pods set VirtletWatchdogAction: dump (libvirtd writes the guest's memory to the node's disk, as root, when its watchdog fires)")
	metricsRemote := fs.Bool("metrics-allow-remote", cfg.MetricsAllowRemote, "let --metrics-address be a non-loopback address (the endpoint has no authentication or TLS: put it on a network only Prometheus reaches)")
	if err := fs.Parse(args); err != nil {
		return cfg, false, err
	}
	if fs.NArg() > 0 {
		return cfg, false, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if *showVersion {
		return cfg, true, nil
	}
	if *configFile != "" {
		data, err := os.ReadFile(*configFile)
		if err != nil {
			return cfg, false, fmt.Errorf("read config: %w", err)
		}
		if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
			return cfg, false, fmt.Errorf("config %s: %w", *configFile, err)
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	override := func(name string, dst *string, v string) {
		if set[name] {
			*dst = v
		}
	}
	override("listen", &cfg.Listen, *listen)
	override("admin-socket", &cfg.AdminSocket, *adminSocket)
	override("state-dir", &cfg.StateDir, *stateDir)
	override("plugins-dir", &cfg.PluginsDir, *pluginsDir)
	override("plugin-bin-dir", &cfg.PluginBinDir, *pluginBinDir)
	override("image-translations-dir", &cfg.ImageTranslations, *translations)
	override("log-format", &cfg.LogFormat, *logFormat)
	override("log-level", &cfg.LogLevel, *logLevel)
	override("default-vm-memory", &cfg.DefaultVMMemory, *memory)
	override("kubeconfig", &cfg.Kubeconfig, *kubeconfig)
	override("kube-objects-dir", &cfg.KubeObjectsDir, *kubeObjectsDir)
	override("streaming-address", &cfg.StreamingAddress, *streamingAddress)
	override("cgroup-driver", &cfg.CgroupDriver, *cgroupDriver)
	override("forward-runtime", &cfg.ForwardRuntime, *forwardRuntime)
	override("metrics-address", &cfg.MetricsAddress, *metricsAddress)
	override("vm-users", &cfg.VMUsers, *vmUsers)
	override("vm-group", &cfg.VMGroup, *vmGroup)
	override("presets-dir", &cfg.PresetsDir, *presetsDir)
	override("max-image-size", &cfg.MaxImageSize, *maxImage)
	override("max-virtual-size", &cfg.MaxVirtualSize, *maxVirtual)
	override("keep-free-space", &cfg.KeepFreeSpace, *keepFree)
	if _, err := cfg.limits(); err != nil {
		return cfg, false, err
	}
	if _, err := cfg.vmUsers(); err != nil {
		return cfg, false, err
	}
	if set["allow-watchdog-dump"] {
		cfg.AllowWatchdogDump = *allowDump
	}
	if set["metrics-allow-remote"] {
		cfg.MetricsAllowRemote = *metricsRemote
	}
	if err := cfg.checkMetrics(); err != nil {
		return cfg, false, err
	}
	if cfg.ForwardRuntime != "" && !strings.HasPrefix(cfg.ForwardRuntime, "unix:///") {
		return cfg, false, fmt.Errorf("forward runtime (forwardRuntime, --forward-runtime) %q: want unix:///absolute/path/to/the/cri.sock", cfg.ForwardRuntime)
	}
	if cfg.ForwardRuntime != "" && strings.TrimPrefix(cfg.ForwardRuntime, "unix://") == strings.TrimPrefix(cfg.Listen, "unix://") {
		return cfg, false, fmt.Errorf("forward runtime (forwardRuntime, --forward-runtime) %q is Virtlet's own socket", cfg.ForwardRuntime)
	}
	if cfg.CgroupDriver == "" {
		cfg.CgroupDriver = "cgroupfs"
		if st, err := os.Stat(systemdRunDir); err == nil && st.IsDir() {
			cfg.CgroupDriver = "systemd"
		}
	}
	if cfg.CgroupDriver != "systemd" && cfg.CgroupDriver != "cgroupfs" {
		return cfg, false, fmt.Errorf("cgroup driver (cgroupDriver, --cgroup-driver) %q: want systemd or cgroupfs", cfg.CgroupDriver)
	}
	if cfg.Kubeconfig != "" && cfg.KubeObjectsDir != "" {
		return cfg, false, fmt.Errorf("kubeconfig and kube objects directory are both set: choose one source of ConfigMaps and Secrets")
	}
	override("operation-timeout", &cfg.OperationTimeout, *opTimeout)
	if cfg.LogFormat != "text" && cfg.LogFormat != "json" {
		return cfg, false, fmt.Errorf("log format %q: want text or json", cfg.LogFormat)
	}
	if _, err := cfg.memoryBytes(); err != nil {
		return cfg, false, err
	}
	if _, err := cfg.operationTimeout(); err != nil {
		return cfg, false, err
	}
	return cfg, false, nil
}

// checkMetrics refuses an endpoint the network could reach unless the
// operator asked for it: the metrics name every pod and carry no
// authentication.
func (c config) checkMetrics() error {
	if c.MetricsAddress == "" {
		if c.MetricsAllowRemote {
			return fmt.Errorf("metricsAllowRemote (--metrics-allow-remote) is set without metricsAddress (--metrics-address): the metrics endpoint is off")
		}
		return nil
	}
	host, port, err := net.SplitHostPort(c.MetricsAddress)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
		return fmt.Errorf("metrics address (metricsAddress, --metrics-address) %q: want host:port, such as 127.0.0.1:9474", c.MetricsAddress)
	}
	if ip := net.ParseIP(host); !c.MetricsAllowRemote && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("metrics address (metricsAddress, --metrics-address) %q is not a loopback address: the endpoint has no authentication or TLS "+
			"and names every pod; use 127.0.0.1 or [::1], or set metricsAllowRemote (--metrics-allow-remote) to serve it beyond this node", c.MetricsAddress)
	}
	return nil
}

func (c config) operationTimeout() (time.Duration, error) {
	d, err := time.ParseDuration(c.OperationTimeout)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("operation timeout (operationTimeout, --operation-timeout) %q: want a positive duration such as 15m or 90s", c.OperationTimeout)
	}
	return d, nil
}

func (c config) memoryBytes() (int64, error) {
	q, err := resource.ParseQuantity(c.DefaultVMMemory)
	if err != nil || q.Value() <= 0 {
		return 0, fmt.Errorf("default VM memory %q: want a positive quantity such as 1Gi", c.DefaultVMMemory)
	}
	return q.Value(), nil
}

// limits reads the node's image and disk limits into core's options.
func (c config) limits() (core.Options, error) {
	var o core.Options
	for _, l := range []struct {
		key, flag, value string
		into             *int64
	}{
		{"maxImageSize", "max-image-size", c.MaxImageSize, &o.MaxImageBytes},
		{"maxVirtualSize", "max-virtual-size", c.MaxVirtualSize, &o.MaxVirtualBytes},
		{"keepFreeSpace", "keep-free-space", c.KeepFreeSpace, &o.KeepFreeBytes},
	} {
		q, err := resource.ParseQuantity(l.value)
		if err != nil || q.Sign() < 0 {
			return o, fmt.Errorf("%s (--%s) %q: want a quantity such as 64Gi, or 0 for no bound", l.key, l.flag, l.value)
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
		return fmt.Errorf("VM users (vmUsers, --vm-users) %q: %s; want FIRST-LAST user IDs such as %s, or off", c.VMUsers, why, DefaultVMUsers)
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
				return nil, fmt.Errorf("VM group (vmGroup, --vm-group) %q: no such group on this node; want own or a group", c.VMGroup)
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
		return nil, fmt.Errorf("presets (presetsDir, --presets-dir): %w", err)
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
			return nil, fmt.Errorf("presets (presetsDir, --presets-dir): %w", err)
		}
		files[name] = b
	}
	set, err := presets.Load(files)
	if err != nil {
		return nil, fmt.Errorf("presets (presetsDir, --presets-dir) %s: %w", c.PresetsDir, err)
	}
	return set, nil
}
