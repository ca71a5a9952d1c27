// Command virtlet is the Virtlet daemon: a CRI runtime that runs Kubernetes
// pods as virtual machines. kubelet talks to it on its CRI socket; its
// hypervisor, image, volume, datasource and network adapters run as
// supervised plugin processes chosen by plugin manifests.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/spf13/pflag"

	"github.com/virtlet/virtlet/adapters/admin"
	"github.com/virtlet/virtlet/adapters/boltstore"
	"github.com/virtlet/virtlet/adapters/checkpointarchive"
	"github.com/virtlet/virtlet/adapters/cri"
	"github.com/virtlet/virtlet/adapters/crirouter"
	"github.com/virtlet/virtlet/adapters/dialer"
	"github.com/virtlet/virtlet/adapters/imagefiles"
	"github.com/virtlet/virtlet/adapters/imagetranslations"
	"github.com/virtlet/virtlet/adapters/kubeapi"
	"github.com/virtlet/virtlet/adapters/kubedir"
	"github.com/virtlet/virtlet/adapters/kubefiles"
	"github.com/virtlet/virtlet/adapters/metrics"
	"github.com/virtlet/virtlet/adapters/migrationpeer"
	"github.com/virtlet/virtlet/adapters/nodeinspect"
	"github.com/virtlet/virtlet/adapters/streaming"
	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/plugins/buildinfo"
	"github.com/virtlet/virtlet/plugins/host"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "config" {
		os.Exit(configCommand(os.Args[2:], os.Stdout, os.Stderr))
	}
	cfg, showVersion, err := parseConfig(os.Args[1:])
	if errors.Is(err, pflag.ErrHelp) {
		return // pflag printed the usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "virtlet:", err)
		os.Exit(2)
	}
	if showVersion {
		fmt.Println("virtlet", buildinfo.Version())
		return
	}
	log := newLogger(cfg)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.WithError(err).Error("virtlet stopped")
		os.Exit(1)
	}
	log.Info("virtlet stopped")
}

func newLogger(cfg config) *logrus.Logger {
	log := logrus.New()
	log.SetOutput(os.Stderr)
	if cfg.LogFormat == "json" {
		log.SetFormatter(&logrus.JSONFormatter{})
	} else {
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	}
	level, err := logrus.ParseLevel(cfg.LogLevel)
	if err != nil {
		log.WithError(err).Warn("unknown log level; using info")
		level = logrus.InfoLevel
	}
	log.SetLevel(level)
	return log
}

func run(ctx context.Context, cfg config, log *logrus.Logger) error {
	log.WithFields(logrus.Fields{"version": buildinfo.Version(), "listen": cfg.Listen, "stateDir": cfg.StateDir}).Info("virtlet starting")
	// Traversable, not listable: QEMU, running as its own user, must reach
	// the images and the VMs' disks below it. Secrets stay in 0700/0600
	// files and directories.
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	store, err := boltstore.Open(filepath.Join(cfg.StateDir, "virtlet.db"))
	if err != nil {
		return err
	}
	defer store.Close()
	files, err := imagefiles.Open(filepath.Join(cfg.StateDir, "images"))
	if err != nil {
		return err
	}
	kube, err := kubeObjects(cfg, log)
	if err != nil {
		return err
	}
	cs, err := fromCluster(ctx, &cfg, kube, log)
	if err != nil {
		return err
	}
	manifests, err := loadManifests(cfg, log)
	if err != nil {
		return err
	}
	if err := applyPluginSettings(manifests, &cs); err != nil {
		return err
	}
	cs.log(log)
	// The metrics port is taken before any plugin starts, so that a port
	// in use stops the daemon at once; it serves once everything is wired.
	var metricsListener net.Listener
	if cfg.MetricsAddress != "" {
		if metricsListener, err = metrics.Listen(cfg.MetricsAddress); err != nil {
			return err
		}
		defer metricsListener.Close()
	}
	plugins, err := host.Start(ctx, manifests, host.Options{
		StateDir: filepath.Join(cfg.StateDir, "plugins"), Log: log.WithField("component", "plugins"),
	})
	if err != nil {
		return err
	}
	defer plugins.Shutdown()
	memory, _ := cfg.memoryBytes()
	limits, _ := cfg.limits() // checked as the config was read
	opTimeout, _ := cfg.operationTimeout()
	vmUsers, _ := cfg.vmUsers()
	vmPresets, err := cfg.presets()
	if err != nil {
		return err
	}
	if names := vmPresets.Names(); len(names) > 0 {
		log.WithField("presets", strings.Join(names, ",")).Info("VM presets loaded")
	}
	var m *metrics.Metrics
	var observer ports.Observer // not a nil *Metrics: the core tests for nil
	if metricsListener != nil {
		m = metrics.New(metrics.Options{Log: log.WithField("component", "metrics")})
		observer = m
	}
	checkpoints := checkpointarchive.New(checkpointarchive.Options{Runtime: cri.RuntimeName, Version: buildinfo.Version(),
		WorkDir: filepath.Join(cfg.StateDir, "checkpoints"), Log: log.WithField("component", "checkpoints")})
	// The migration endpoint answers the runtime, which offers through it.
	var migration ports.MigrationPeers
	receiver := &lateReceiver{}
	if cfg.MigrationAddress != "" {
		peers, err := migrationpeer.Listen(migrationpeer.Config{Address: cfg.MigrationAddress, CertFile: cfg.MigrationCert, KeyFile: cfg.MigrationKey, CAFile: cfg.MigrationCA},
			receiver, log.WithField("component", "migration"))
		if err != nil {
			return err
		}
		defer peers.Close()
		migration = peers
	}
	rt, err := core.New(core.Deps{
		Hypervisor: plugins.Hypervisor(), ImageSources: plugins.ImageSources(), ImageFiles: files, Store: store,
		Translations: translations(cfg, kube),
		Network:      plugins.Network(), Volumes: plugins.Volumes(), Datasources: plugins.Datasources(),
		Kube: kube, Files: kubefiles.Reader{}, VolumeDirs: kubefiles.Reader{}, Dialer: dialer.Host{}, Observer: observer,
		Node:        nodeinspect.New(log.WithField("component", "nodeinspect")),
		Checkpoints: checkpoints, Migration: migration,
	}, core.Options{DefaultMemoryBytes: memory, OperationTimeout: opTimeout, Log: log.WithField("component", "core"),
		Failpoint: failpointHook(log), VMUsers: vmUsers, Presets: vmPresets, AllowWatchdogDump: cfg.AllowWatchdogDump,
		NoMemorySharing: !cfg.MemorySharing,
		MaxImageBytes:   limits.MaxImageBytes, MaxVirtualBytes: limits.MaxVirtualBytes, KeepFreeBytes: limits.KeepFreeBytes})
	if err != nil {
		return err
	}
	if err := rt.Load(ctx); err != nil {
		return err
	}
	receiver.set(rt)
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	go rt.Run(runCtx)

	pluginStatus := func() interface{} { return pluginsByName(plugins) }
	streams, err := streaming.Listen(cfg.StreamingAddress, rt, &streaming.Tools{
		RT: rt, Version: buildinfo.Version(), Plugins: pluginStatus, PluginLogs: func() []vmtools.LogLine { return pluginLogs(plugins) },
		NodeData: cfg.DiagNodeData, Log: log.WithField("component", "vmtools"),
	}, log.WithField("component", "streaming"))
	if err != nil {
		return err
	}
	log.WithField("address", streams.Address()).Info("serving CRI streams (exec, attach, port-forward)")
	server := cri.New(rt, cri.Info{Version: buildinfo.Version(), Plugins: pluginStatus, CgroupDriver: cfg.CgroupDriver}, log.WithField("component", "cri")).WithStreaming(streams)
	if m != nil {
		streams.WithSessionObserver(m.Session)
		server.WithCallObserver(m.CRICall)
		m.WithRuntime(rt).WithPlugins(func() []metrics.Plugin { return pluginMetrics(plugins) })
		go func() {
			if err := m.Serve(ctx, metricsListener); err != nil {
				log.WithError(err).Error("the metrics endpoint stopped; the daemon serves on without it")
			}
		}()
		log.WithField("address", metricsListener.Addr().String()).Info("serving metrics (/metrics, /healthz)")
	}
	streamErr := make(chan error, 1)
	go func() { streamErr <- streams.Serve(ctx) }()

	listener, err := cri.Listen(cfg.Listen)
	if err != nil {
		return err
	}
	adminListener, err := admin.Listen(cfg.AdminSocket)
	if err != nil {
		listener.Close()
		return err
	}
	adminServer := admin.NewServer(rt, buildinfo.Version(), log.WithField("component", "admin")).
		WithPlugins(func() []admin.PluginState { return pluginStates(plugins) }).GRPCServer()
	go adminServer.Serve(adminListener)
	defer adminServer.Stop()
	log.WithFields(logrus.Fields{"listen": cfg.Listen, "admin": cfg.AdminSocket}).Info("serving CRI")
	criCtx, stopCRI := context.WithCancel(ctx)
	defer stopCRI()
	go func() {
		if err := <-streamErr; err != nil {
			log.WithError(err).Error("the streaming server stopped")
			stopCRI()
		}
	}()
	services := cri.Services(server)
	if cfg.ForwardRuntime != "" {
		router, err := forwardRouter(ctx, cfg, server, log.WithField("component", "crirouter"))
		if err != nil {
			listener.Close()
			return err
		}
		defer router.Close()
		services = router
	}
	return cri.ServeUntil(criCtx, server.GRPCServerFor(services), listener)
}

// forwardRouter puts a router in front of the CRI server that serves
// container pods through the forward runtime. The runtime may come up
// later (its calls fail, naming it, until then); one that answers must use
// the cgroup driver kubelet is told to use.
func forwardRouter(ctx context.Context, cfg config, server *cri.Server, log logrus.FieldLogger) (*crirouter.Router, error) {
	router, err := crirouter.New(cfg.ForwardRuntime, server, log)
	if err != nil {
		return nil, err
	}
	probe, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := router.RemoteVersion(probe)
	if err != nil {
		log.WithError(err).Warn("the forward runtime does not answer yet: container pods wait for it")
		return router, nil
	}
	driver, err := router.RemoteCgroupDriver(probe)
	if err == nil && driver != "" && driver != cfg.CgroupDriver {
		router.Close()
		return nil, fmt.Errorf("forward runtime %s uses the %s cgroup driver, Virtlet tells kubelet %s: set cgroupDriver (--cgroup-driver) to %s",
			cfg.ForwardRuntime, driver, cfg.CgroupDriver, driver)
	}
	log.WithFields(logrus.Fields{"endpoint": cfg.ForwardRuntime, "runtime": v.RuntimeName, "version": v.RuntimeVersion}).
		Info("container pods are forwarded")
	return router, nil
}

// pluginLogs converts the plugins' recent log lines for diagnostics.
func pluginLogs(h *host.Host) []vmtools.LogLine {
	entries := h.RecentLogs()
	out := make([]vmtools.LogLine, len(entries))
	for i, e := range entries {
		out[i] = vmtools.LogLine{Time: e.Time, Plugin: e.Plugin, Level: e.Level, Message: e.Message, Fields: e.Fields}
	}
	return out
}

// kubeObjects chooses where ConfigMaps and Secrets come from.
func kubeObjects(cfg config, log logrus.FieldLogger) (ports.KubeObjects, error) {
	switch {
	case cfg.KubeObjectsDir != "":
		log.WithField("dir", cfg.KubeObjectsDir).Info("reading ConfigMaps and Secrets from manifests")
		return kubedir.New(cfg.KubeObjectsDir)
	case cfg.Kubeconfig != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		c, err := kubeapi.New(cfg.Kubeconfig)
		if err != nil {
			return nil, err
		}
		log.WithField("kubeconfig", cfg.Kubeconfig).Info("reading ConfigMaps and Secrets from the API server")
		go reportIdentity(c, log)
		return c, nil
	default:
		log.Warn("no --kubeconfig or --kube-objects-dir, and not in a cluster: pods whose annotations name ConfigMaps or Secrets will fail")
		return nil, nil
	}
}

// translations reads the operator's image translations: the
// VirtletImageMapping objects when the daemon talks to the API server, then
// the directory's files, as Virtlet read them.
func translations(cfg config, kube ports.KubeObjects) ports.ImageTranslations {
	if cfg.skipTranslations {
		return nil
	}
	dir := imagetranslations.New(cfg.ImageTranslations)
	c, ok := kube.(*kubeapi.Client)
	if !ok {
		return dir
	}
	return imagetranslations.Sources{imagetranslations.NewMappings(c, kubeapi.MappingNamespace), dir}
}

// fromCluster applies the VirtletConfigMapping objects that select the
// node, when the daemon talks to the API server. Without the API server at
// start the node runs on its own configuration, and says so.
func fromCluster(ctx context.Context, cfg *config, kube ports.KubeObjects, log *logrus.Logger) (clusterSettings, error) {
	c, ok := kube.(*kubeapi.Client)
	if !ok {
		return clusterSettings{}, nil
	}
	settings, err := readClusterSettings(ctx, c, log)
	if err != nil {
		log.WithError(err).Error("VirtletConfigMapping objects not read: the node runs on its own configuration")
		return clusterSettings{}, nil
	}
	cs := applySettings(cfg, cfg.explicit, settings)
	if err := cfg.validate(); err != nil {
		return cs, fmt.Errorf("the configuration with the VirtletConfigMapping settings (%s): %w", strings.Join(cs.applied, "; "), err)
	}
	if level, err := logrus.ParseLevel(cfg.LogLevel); err == nil {
		log.SetLevel(level)
	}
	return cs, nil
}

// log reports what the VirtletConfigMapping settings changed, and each
// one not applied with its reason.
func (cs clusterSettings) log(log logrus.FieldLogger) {
	if len(cs.applied) > 0 {
		log.WithField("settings", cs.applied).Info("settings from VirtletConfigMapping objects applied")
	}
	for _, n := range cs.notApplied {
		log.WithField("setting", n).Warn("a VirtletConfigMapping setting is not applied")
	}
}

// reportIdentity logs who the daemon is to the API server, and warns when
// it is not a node: only a node's identity lets the Node authorizer limit
// the daemon to what its node's pods reference.
func reportIdentity(c *kubeapi.Client, log logrus.FieldLogger) {
	user, groups, err := c.Identity(context.Background())
	switch {
	case err != nil:
		log.WithError(err).Warn("could not learn the daemon's identity from the API server")
	case !strings.HasPrefix(user, kubeapi.NodePrefix):
		log.WithFields(logrus.Fields{"user": user, "groups": groups}).Warn("the daemon reads ConfigMaps and Secrets as a user that is not a node: " +
			"give it its node's identity (" + kubeapi.NodePrefix + "<name> in system:nodes) so the Node authorizer limits it to what its pods reference")
	default:
		log.WithField("user", user).Info("reading ConfigMaps and Secrets as the node")
	}
}

// pluginMetrics reports the plugins' states for the metrics.
func pluginMetrics(h *host.Host) []metrics.Plugin {
	var out []metrics.Plugin
	for _, st := range h.Status() {
		out = append(out, metrics.Plugin{Name: st.Name, Kind: string(st.Kind), Up: st.State == host.Running, Restarts: st.Restarts, Calls: st.Calls})
	}
	return out
}

// pluginStates converts the plugins' status for the admin API.
func pluginStates(h *host.Host) []admin.PluginState {
	var out []admin.PluginState
	for _, st := range h.Status() {
		out = append(out, admin.PluginState{Name: st.Name, Kind: string(st.Kind), State: string(st.State),
			PID: st.PID, Restarts: st.Restarts, LastError: st.LastError})
	}
	return out
}

// pluginsByName keys the plugins' status by name (crictl info shows JSON
// objects).
func pluginsByName(h *host.Host) map[string]host.PluginStatus {
	out := map[string]host.PluginStatus{}
	for _, st := range h.Status() {
		out[st.Name] = st
	}
	return out
}

// loadManifests reads the operator's manifests, or the embedded defaults
// when the directory does not exist.
func loadManifests(cfg config, log logrus.FieldLogger) ([]manifest.Manifest, error) {
	ms, err := manifest.LoadDir(cfg.PluginsDir)
	source := cfg.PluginsDir
	if errors.Is(err, fs.ErrNotExist) {
		var unpinned []string
		ms, unpinned, err = manifest.Defaults(cfg.PluginBinDir, buildinfo.PluginChecksums())
		if err != nil {
			return nil, fmt.Errorf("%s does not exist, and the embedded default plugins cannot be used: %w", cfg.PluginsDir, err)
		}
		source = "the embedded default set (" + cfg.PluginsDir + " does not exist)"
		if len(unpinned) > 0 {
			log.WithField("plugins", unpinned).Warn("this build has no pinned checksums for its default plugins; trusting the binaries found at start-up")
		}
	}
	if err != nil {
		return nil, err
	}
	if err := manifest.RequireHypervisor(ms, source); err != nil {
		return nil, err
	}
	log.WithFields(logrus.Fields{"source": source, "plugins": len(ms)}).Info("plugin manifests loaded")
	return ms, nil
}
