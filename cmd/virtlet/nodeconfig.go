package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/kubeapi"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
)

// Settings from the cluster: Virtlet's VirtletConfigMapping objects carry
// Virtlet's VirtletConfig fields for the nodes whose name or labels they
// match. The daemon reads them once, at start, as Virtlet's init did, and
// applies each field that has a counterpart here where the node's own
// config file and flags leave it unset; a field without one is logged as
// not applied, with the reason, never dropped silently.

// virtletConfig is Virtlet's VirtletConfig.
type virtletConfig struct {
	CRISocketPath                *string `json:"criSocketPath,omitempty"`
	ImageTranslationConfigsDir   *string `json:"imageTranslationConfigsDir,omitempty"`
	SkipImageTranslation         *bool   `json:"skipImageTranslation,omitempty"`
	EnableRegexpImageTranslation *bool   `json:"enableRegexpImageTranslation,omitempty"`
	StreamPort                   *int    `json:"streamPort,omitempty"`
	LogLevel                     *int    `json:"logLevel,omitempty"`
	LibvirtURI                   *string `json:"libvirtURI,omitempty"`
	DisableKVM                   *bool   `json:"disableKVM,omitempty"`
	RawDevices                   *string `json:"rawDevices,omitempty"`
	CNIPluginDir                 *string `json:"cniPluginDir,omitempty"`
	CNIConfigDir                 *string `json:"cniConfigDir,omitempty"`
	CPUModel                     *string `json:"cpuModel,omitempty"`
	CalicoSubnetSize             *int    `json:"calicoSubnetSize,omitempty"`
	EnableSriov                  *bool   `json:"enableSriov,omitempty"`
	DownloadProtocol             *string `json:"downloadProtocol,omitempty"`
	DatabasePath                 *string `json:"databasePath,omitempty"`
	ImageDir                     *string `json:"imageDir,omitempty"`
	FDServerSocketPath           *string `json:"fdServerSocketPath,omitempty"`
	DisableLogging               *bool   `json:"disableLogging,omitempty"`
	KubeletRootDir               *string `json:"kubeletRootDir,omitempty"`
}

// configMapping is one VirtletConfigMapping's spec.
type configMapping struct {
	name         string
	NodeName     string            `json:"nodeName,omitempty"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	Priority     int               `json:"priority,omitempty"`
	Config       *virtletConfig    `json:"config,omitempty"`
}

func (m configMapping) ref() string {
	return "VirtletConfigMapping " + kubeapi.MappingNamespace + "/" + m.name
}

// matches tells whether the mapping applies to the node, as Virtlet
// matched: its node name, if any, and every label of its selector.
func (m configMapping) matches(node string, labels map[string]string) bool {
	if m.Config == nil || m.NodeName != "" && m.NodeName != node {
		return false
	}
	for k, v := range m.NodeSelector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// parseConfigMappings decodes the objects' specs; an object that does not
// decode (an unknown field, a wrong type) is reported by name.
func parseConfigMappings(specs map[string][]byte) ([]configMapping, []error) {
	var out []configMapping
	var errs []error
	for name, spec := range specs {
		m := configMapping{name: name}
		dec := json.NewDecoder(bytes.NewReader(spec))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&m); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.ref(), err))
			continue
		}
		out = append(out, m)
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return out, errs
}

// setting is one field that applies to the node, and the mapping it came
// from.
type setting struct {
	field, from string
	value       any
}

// nodeSettings merges the mappings that apply to the node: by priority,
// the higher winning, then by name.
func nodeSettings(ms []configMapping, node string, labels map[string]string) []setting {
	var apply []configMapping
	for _, m := range ms {
		if m.matches(node, labels) {
			apply = append(apply, m)
		}
	}
	sort.Slice(apply, func(i, j int) bool {
		if apply[i].Priority != apply[j].Priority {
			return apply[i].Priority < apply[j].Priority
		}
		return apply[i].name < apply[j].name
	})
	byField := map[string]setting{}
	for _, m := range apply {
		var fields map[string]any
		data, _ := json.Marshal(m.Config)
		json.Unmarshal(data, &fields)
		for f, v := range fields {
			byField[f] = setting{field: f, from: m.ref(), value: v}
		}
	}
	out := make([]setting, 0, len(byField))
	for _, s := range byField {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].field < out[j].field })
	return out
}

// clusterSettings is what the daemon does with the settings.
type clusterSettings struct {
	applied    []string                  // "logLevel: debug (from ...)"
	notApplied []string                  // "cpuModel (from ...): why"
	plugins    map[string]map[string]any // plugin manifest name → config keys
}

// notApplied says why each of Virtlet's settings that have no counterpart
// here is not applied.
var notApplied = map[string]string{
	"enableRegexpImageTranslation": "regexp translations always apply",
	"cpuModel":                     "a VM's CPU model is its pod's VirtletCPUModel annotation; there is no node default",
	"calicoSubnetSize":             "Calico's /32 addresses work as they are (README, Compatibility)",
	"enableSriov":                  "SR-IOV is refused by name until a node with VFs can test it (ARCHITECTURE.md)",
	"databasePath":                 "the daemon's state is under its stateDir",
	"imageDir":                     "images are under the daemon's stateDir",
	"fdServerSocketPath":           "there is no fd server: the network plugin hands the VM its tap device",
	"disableLogging":               "the console log is what kubectl logs shows; it is always kept",
	"kubeletRootDir":               "volumes come from kubelet's CRI mounts, not its root directory",
}

// applySettings applies the settings to cfg where the node's own
// configuration leaves the key unset (explicit), and gathers the plugins'
// keys.
func applySettings(cfg *config, explicit map[string]bool, settings []setting) clusterSettings {
	out := clusterSettings{plugins: map[string]map[string]any{}}
	set := func(s setting, key string, value string, target *string) {
		if explicit[key] {
			out.notApplied = append(out.notApplied, fmt.Sprintf("%s (from %s): the node's own %s wins", s.field, s.from, named(key)))
			return
		}
		*target = value
		out.applied = append(out.applied, fmt.Sprintf("%s: %s (from %s's %s)", key, value, s.from, s.field))
	}
	plugin := func(s setting, name, key string, value any) {
		if out.plugins[name] == nil {
			out.plugins[name] = map[string]any{}
		}
		out.plugins[name][key] = value
		out.applied = append(out.applied, fmt.Sprintf("plugin %s config %s: %v (from %s's %s)", name, key, value, s.from, s.field))
	}
	for _, s := range settings {
		str, _ := s.value.(string)
		b, _ := s.value.(bool)
		n, _ := s.value.(float64)
		switch s.field {
		case "criSocketPath":
			set(s, "listen", "unix://"+str, &cfg.Listen)
		case "imageTranslationConfigsDir":
			set(s, "imageTranslationsDir", str, &cfg.ImageTranslations)
		case "skipImageTranslation":
			if b {
				cfg.skipTranslations = true
				out.applied = append(out.applied, fmt.Sprintf("no image translations (from %s's %s)", s.from, s.field))
			}
		case "streamPort":
			// The server stays on loopback: kubelet proxies the streams.
			set(s, "streamingAddress", "127.0.0.1:"+strconv.Itoa(int(n)), &cfg.StreamingAddress)
		case "logLevel":
			// Virtlet's glog verbosity: 3 and above were its debug output.
			level := "info"
			if n >= 4 {
				level = "trace"
			} else if n >= 3 {
				level = "debug"
			}
			set(s, "logLevel", level, &cfg.LogLevel)
		case "libvirtURI":
			plugin(s, "libvirt", "uri", str)
		case "disableKVM":
			if b {
				plugin(s, "libvirt", "accelerator", "tcg")
			}
		case "rawDevices":
			var globs []string
			for _, g := range strings.Split(str, ",") {
				if g = strings.TrimSpace(g); g != "" {
					globs = append(globs, "/dev/"+strings.TrimPrefix(g, "/dev/"))
				}
			}
			plugin(s, "raw", "allowedPaths", globs)
		case "cniPluginDir":
			plugin(s, "cni", "binDirs", []string{str})
		case "cniConfigDir":
			plugin(s, "cni", "confDir", str)
		case "downloadProtocol":
			if str != "https" {
				out.notApplied = append(out.notApplied, fmt.Sprintf("%s %q (from %s): names without a translation are downloaded with https; "+
					"translate them to http:// URLs instead", s.field, str, s.from))
			}
		default:
			why := notApplied[s.field]
			if why == "" {
				why = "not one of Virtlet's settings"
			}
			out.notApplied = append(out.notApplied, fmt.Sprintf("%s (from %s): %s", s.field, s.from, why))
		}
	}
	return out
}

// applyPluginSettings puts the settings' plugin keys into the config of
// the manifests of those names, where the manifest leaves the key unset.
func applyPluginSettings(ms []manifest.Manifest, cs *clusterSettings) error {
	for name, keys := range cs.plugins {
		i := -1
		for j := range ms {
			if ms[j].Name == name {
				i = j
			}
		}
		if i < 0 {
			for k := range keys {
				cs.notApplied = append(cs.notApplied, fmt.Sprintf("plugin %s config %s: no plugin manifest is named %s", name, k, name))
			}
			continue
		}
		conf := map[string]any{}
		if len(ms[i].Config) > 0 {
			if err := json.Unmarshal(ms[i].Config, &conf); err != nil {
				return fmt.Errorf("plugin manifest %s: config: %w", ms[i].File, err)
			}
		}
		for k, v := range keys {
			if _, ok := conf[k]; ok {
				cs.notApplied = append(cs.notApplied, fmt.Sprintf("plugin %s config %s: the manifest %s sets it", name, k, ms[i].File))
				continue
			}
			conf[k] = v
		}
		data, err := json.Marshal(conf)
		if err != nil {
			return err
		}
		ms[i].Config = data
	}
	return nil
}

// readClusterSettings reads the VirtletConfigMapping objects that apply to
// the daemon's node. The node is the one whose identity the daemon holds
// (system:node:<name>), else the host name, as kubelet names its node.
func readClusterSettings(ctx context.Context, c *kubeapi.Client, log logrus.FieldLogger) ([]setting, error) {
	user, _, err := c.Identity(ctx)
	if err != nil {
		return nil, err
	}
	node, ok := strings.CutPrefix(user, kubeapi.NodePrefix)
	if !ok {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("the node's name: %w", err)
		}
		node = strings.ToLower(h)
	}
	specs, err := c.ConfigMappings(ctx)
	if err != nil || len(specs) == 0 {
		return nil, err
	}
	labels, err := c.NodeLabels(ctx, node)
	switch {
	case errors.Is(err, ports.ErrNotFound):
		// A new node starts its runtime before kubelet registers it: the
		// mappings by node name and those without a selector apply.
		log.WithError(err).Warn("VirtletConfigMapping objects with a nodeSelector are not matched until the daemon restarts on the registered node")
	case err != nil:
		return nil, fmt.Errorf("the labels VirtletConfigMapping objects select on: %w", err)
	}
	ms, errs := parseConfigMappings(specs)
	for _, e := range errs {
		log.WithError(e).Warn("VirtletConfigMapping skipped")
	}
	return nodeSettings(ms, node, labels), nil
}
