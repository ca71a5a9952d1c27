package main

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/adapters/admin"
	"github.com/virtlet/virtlet/adapters/imagetranslations"
	"github.com/virtlet/virtlet/adapters/streaming"
	"github.com/virtlet/virtlet/plugins/manifest"
)

// The daemon's config file is versioned as Kubernetes components' are:
// every file names the schema it was written for.
const (
	configAPIVersion = "config.virtlet.cloud/v1alpha1"
	configKind       = "VirtletConfiguration"
)

// config is the daemon's configuration: defaults, then the config file,
// then command-line flags. Each field is one key of the file (json) and one
// flag (flag), described once (help); the flags, `virtlet config default`
// and docs/configuration.md are made from these tags.
type config struct {
	metav1.TypeMeta `json:",inline"`

	Listen            string `json:"listen" flag:"listen" help:"CRI endpoint to serve, unix:///path.sock"`
	AdminSocket       string `json:"adminSocket" flag:"admin-socket" help:"unix socket of the admin API (mode 0600) that the flexvolume driver and node tools use"`
	StateDir          string `json:"stateDir" flag:"state-dir" help:"directory of the state database, images and plugin state"`
	PluginsDir        string `json:"pluginsDir" flag:"plugins-dir" help:"directory of plugin manifests; when it does not exist the embedded default set is used"`
	PluginBinDir      string `json:"pluginBinDir" flag:"plugin-bin-dir" default:"the virtlet binary's directory" help:"where the default plugins' binaries are"`
	ImageTranslations string `json:"imageTranslationsDir" flag:"image-translations-dir" help:"directory of image name translation configs (reloaded when they change)"`
	LogFormat         string `json:"logFormat" flag:"log-format" help:"log format: text or json"`
	LogLevel          string `json:"logLevel" flag:"log-level" help:"log level: trace, debug, info, warn, error"`
	DefaultVMMemory   string `json:"defaultVMMemory" flag:"default-vm-memory" help:"memory of a VM whose container has no memory limit (a quantity such as 1Gi)"`
	OperationTimeout  string `json:"operationTimeout" flag:"operation-timeout" help:"bound of slow operations (image pulls, VM starts) that outlive kubelet's request: a duration such as 15m or 90s"`
	Kubeconfig        string `json:"kubeconfig" flag:"kubeconfig" help:"kubeconfig for reading the ConfigMaps and Secrets VM pods name and the VirtletImageMapping objects, with the node's identity (empty: the in-cluster config when running in a pod, else none)"`
	KubeObjectsDir    string `json:"kubeObjectsDir" flag:"kube-objects-dir" help:"read ConfigMaps and Secrets from the Kubernetes manifests in this directory instead of an API server"`
	StreamingAddress  string `json:"streamingAddress" flag:"streaming-address" help:"loopback host:port of the CRI streaming server (exec, attach, port-forward) that kubelet proxies; port 0 picks a free port"`
	CgroupDriver      string `json:"cgroupDriver" flag:"cgroup-driver" default:"systemd when the node runs systemd, else cgroupfs" help:"cgroup driver kubelet must use for pods (CRI RuntimeConfig): systemd or cgroupfs"`
	ForwardRuntime    string `json:"forwardRuntime" flag:"forward-runtime" help:"CRI endpoint of a container runtime (unix:///run/containerd/containerd.sock) that serves the pods that are not VM pods, so that one node runs both; empty: such pods are refused"`
	MetricsAddress    string `json:"metricsAddress" flag:"metrics-address" help:"host:port of the Prometheus endpoint (/metrics, /healthz), such as 127.0.0.1:9474; a loopback address unless metricsAllowRemote; port 0 picks a free one; empty: no endpoint"`
	// The endpoint has no authentication and no TLS.
	MetricsAllowRemote bool   `json:"metricsAllowRemote" flag:"metrics-allow-remote" help:"let metricsAddress be a non-loopback address (the endpoint has no authentication or TLS and names every pod: put it on a network only Prometheus reaches)"`
	VMUsers            string `json:"vmUsers" flag:"vm-users" help:"host user IDs the VMs run as, one each (FIRST-LAST), so that one VM's QEMU cannot open another's disks; off: every VM runs as qemu.conf's user"`
	// A shared group lets each VM's QEMU reach the others' group-accessible
	// files, such as libvirt's guest agent sockets.
	VMGroup           string `json:"vmGroup" flag:"vm-group" default:"own" help:"with vmUsers: own (each VM a group of its own, its user's ID) or a group (name or ID) every VM runs in"`
	PresetsDir        string `json:"presetsDir" flag:"presets-dir" help:"directory of VM presets (one YAML file each, *.yaml or *.yml) that pods select by name (VirtletPreset) or that select pods by label; read at start; empty: none"`
	AllowWatchdogDump bool   `json:"allowWatchdogDump" flag:"allow-watchdog-dump" help:"let pods set VirtletWatchdogAction: dump (libvirtd writes the guest's memory to the node's disk, as root, when its watchdog fires; a VM keeps its newest dump, removed with the VM)"`
	DiagNodeData      bool   `json:"diagNodeData" flag:"diag-node-data" help:"serve virtletctl diag dump the node's own data (ip a, ip r, processes, network namespaces, libvirt's logs, every VM pod's namespace and QEMU log) through any VM pod's exec: whoever may exec into one VM pod on the node then sees every pod's; off: each pod's diag holds its own namespace and QEMU log only"`
	MemorySharing     bool   `json:"memorySharing" flag:"memory-sharing" help:"let VMs' identical memory pages be merged with other VMs' where the node runs KSM (a pod opts out with VirtletMemorySharing: false); false keeps every VM's pages apart, a known side channel closed"`
	MaxImageSize      string `json:"maxImageSize" flag:"max-image-size" help:"the largest image a pull downloads (a quantity such as 64Gi; 0: no bound)"`
	MaxVirtualSize    string `json:"maxVirtualSize" flag:"max-virtual-size" help:"the largest disk a guest may see: an image's virtual size, VirtletRootVolumeSize (0: no bound)"`
	KeepFreeSpace     string `json:"keepFreeSpace" flag:"keep-free-space" help:"the space pulls leave free on the image store's file system (0: none)"`
	// Live migration between the nodes' daemons (docs/migration.md).
	MigrationAddress string `json:"migrationAddress" flag:"migration-address" help:"host:port of the live migration endpoint the other nodes' daemons reach (mutual TLS; every node the same port), such as :10262; empty: VMs are neither migrated away nor received"`
	MigrationCert    string `json:"migrationCert" flag:"migration-cert" help:"the node's certificate for migrationAddress, whose subject is system:node:<node> (kubelet's client certificate is one)"`
	MigrationKey     string `json:"migrationKey" flag:"migration-key" help:"the private key of migrationCert"`
	MigrationCA      string `json:"migrationCA" flag:"migration-ca" help:"the cluster CA that signed every node's migrationCert"`

	// explicit holds the keys the node's own config file or flags set:
	// VirtletConfigMapping objects apply to the others (nodeconfig.go).
	explicit map[string]bool
	// skipTranslations: a VirtletConfigMapping's skipImageTranslation.
	skipTranslations bool
}

// DefaultVMUsers lies above every user a node's system and its people
// have, and above the subordinate IDs container runtimes hand out.
const DefaultVMUsers = "2000000000-2000065535"

func defaults() config {
	bin := ""
	if exe, err := os.Executable(); err == nil {
		bin = dirOf(exe)
	}
	return config{
		TypeMeta: metav1.TypeMeta{APIVersion: configAPIVersion, Kind: configKind},
		Listen:   "unix:///run/virtlet.sock", AdminSocket: admin.DefaultSocket, StateDir: "/var/lib/virtlet", PluginsDir: manifest.DefaultDir,
		PluginBinDir: bin, ImageTranslations: imagetranslations.DefaultDir, LogFormat: "text", LogLevel: "info", DefaultVMMemory: "1Gi", OperationTimeout: "15m",
		StreamingAddress: streaming.DefaultAddress, VMUsers: DefaultVMUsers,
		MaxImageSize: "64Gi", MaxVirtualSize: "1Ti", KeepFreeSpace: "1Gi", MemorySharing: true,
	}
}

func dirOf(p string) string {
	if i := strings.LastIndex(p, "/"); i > 0 {
		return p[:i]
	}
	return "/"
}

// configField is one key of the config file and its flag.
type configField struct {
	Key, Flag, Help string
	// Default describes a default that is not a constant ("" when the
	// default is defaults()'s value).
	Default string
	index   int
}

// configFields lists the configuration's keys in the struct's order.
func configFields() []configField {
	var fields []configField
	typ := reflect.TypeOf(config{})
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous || key == "" || key == "-" {
			continue
		}
		fields = append(fields, configField{Key: key, Flag: f.Tag.Get("flag"), Help: f.Tag.Get("help"), Default: f.Tag.Get("default"), index: i})
	}
	return fields
}

// configKeys lists the config file's keys, in the struct's order.
func configKeys() []string {
	var keys []string
	for _, f := range configFields() {
		keys = append(keys, f.Key)
	}
	return keys
}

// named is how errors name a key: the file's key and its flag.
func named(key string) string {
	for _, f := range configFields() {
		if f.Key == key {
			return key + " (--" + f.Flag + ")"
		}
	}
	return key
}

// bindFlags registers one flag per field, writing into cfg.
func bindFlags(fs *pflag.FlagSet, cfg *config) {
	v := reflect.ValueOf(cfg).Elem()
	for _, f := range configFields() {
		help := f.Help
		if f.Default != "" {
			help += " (default: " + f.Default + ")"
		}
		switch p := v.Field(f.index).Addr().Interface().(type) {
		case *string:
			fs.StringVar(p, f.Flag, *p, help)
		case *bool:
			fs.BoolVar(p, f.Flag, *p, help)
		default:
			panic(fmt.Sprintf("config key %s: no flag for a %T", f.Key, p))
		}
	}
}

// parseConfig reads flags (and the config file they name) and checks the
// result. It reports whether --version was asked for.
func parseConfig(args []string) (config, bool, error) {
	cfg := defaults()
	// pflag, as every Kubernetes component: --long flags, --help exits 0.
	fs := pflag.NewFlagSet("virtlet", pflag.ContinueOnError)
	fs.SortFlags = false
	configFile := fs.String("config", "", "read the `FILE` of configuration (YAML, apiVersion "+configAPIVersion+", kind "+configKind+
		"; `virtlet config default` prints one, docs/configuration.md describes it); flags override it")
	showVersion := fs.Bool("version", false, "print the version and exit")
	bindFlags(fs, &cfg)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: virtlet [FLAGS]          run the daemon\n"+
			"       virtlet config default   print the default configuration file\n"+
			"       virtlet config validate [FLAGS]\n"+
			"                                check a configuration as the daemon would\n\nFlags:\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		return cfg, false, err
	}
	if fs.NArg() > 0 {
		return cfg, false, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if *showVersion {
		return cfg, true, nil
	}
	cfg.explicit = map[string]bool{}
	for _, f := range configFields() {
		cfg.explicit[f.Key] = fs.Changed(f.Flag)
	}
	if *configFile != "" {
		file, keys, err := readConfigFile(*configFile)
		if err != nil {
			return cfg, false, err
		}
		// The file's values, except where a flag was given.
		v, fv := reflect.ValueOf(&cfg).Elem(), reflect.ValueOf(file)
		for _, f := range configFields() {
			if !fs.Changed(f.Flag) {
				v.Field(f.index).Set(fv.Field(f.index))
			}
			cfg.explicit[f.Key] = cfg.explicit[f.Key] || keys[f.Key]
		}
	}
	if err := cfg.validate(); err != nil {
		return cfg, false, err
	}
	cfg.resolve()
	return cfg, false, nil
}

var (
	unknownKeyRE = regexp.MustCompile(`unknown field "([^"]+)"`)
	wrongTypeRE  = regexp.MustCompile(`Go struct field config\.(\S+) of type (\S+)`)
)

// readConfigFile reads a config file over the defaults: a file of another
// version or kind, an unknown key or a value of the wrong type is refused
// naming the file and the key.
// It also returns the keys the file sets.
func readConfigFile(path string) (config, map[string]bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return config{}, nil, fmt.Errorf("read config: %w", err)
	}
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return config{}, nil, fmt.Errorf("config %s: %w", path, err)
	}
	if meta.APIVersion != configAPIVersion || meta.Kind != configKind {
		return config{}, nil, fmt.Errorf("config %s: apiVersion %q, kind %q: want apiVersion: %s and kind: %s as the file's first keys",
			path, meta.APIVersion, meta.Kind, configAPIVersion, configKind)
	}
	cfg := defaults()
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		if m := unknownKeyRE.FindStringSubmatch(err.Error()); m != nil {
			return config{}, nil, fmt.Errorf("config %s: unknown key %q (keys: %s)", path, m[1], strings.Join(configKeys(), ", "))
		}
		if m := wrongTypeRE.FindStringSubmatch(err.Error()); m != nil {
			return config{}, nil, fmt.Errorf("config %s: key %s: want a %s", path, m[1], m[2])
		}
		return config{}, nil, fmt.Errorf("config %s: %w", path, err)
	}
	var keys map[string]any
	if err := yaml.Unmarshal(data, &keys); err != nil {
		return config{}, nil, fmt.Errorf("config %s: %w", path, err)
	}
	set := make(map[string]bool, len(keys))
	for k := range keys {
		set[k] = true
	}
	return cfg, set, nil
}
