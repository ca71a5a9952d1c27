package ports

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
)

// PluginKind names a port that can be served by an out-of-process plugin.
type PluginKind string

const (
	KindHypervisor PluginKind = "hypervisor"
	KindImage      PluginKind = "image"
	KindVolume     PluginKind = "volume"
	KindDatasource PluginKind = "datasource"
	KindNetwork    PluginKind = "network"
)

// PluginKinds lists every kind, in the order the daemon starts them.
var PluginKinds = []PluginKind{KindHypervisor, KindImage, KindVolume, KindDatasource, KindNetwork}

// Valid reports whether k is a known kind.
func (k PluginKind) Valid() bool {
	for _, known := range PluginKinds {
		if k == known {
			return true
		}
	}
	return false
}

// PluginInfo is what every plugin says about itself.
type PluginInfo struct {
	Name string     // plugin's own name, e.g. "libvirt"
	Kind PluginKind // which port it serves
	// Version is the plugin's release version; an adapter that leaves it
	// empty reports its binary's build (the version make stamps into
	// every binary, else its module's).
	Version    string
	APIVersion int // protocol version of the kind it serves
	// Handles lists what the plugin is responsible for: volume types for
	// volume plugins, datasource names (nocloud, configdrive) for datasource
	// plugins, URL schemes / transports (https, docker) for image plugins,
	// the hypervisor flavour (libvirt) for hypervisor plugins, the network
	// flavour (cni) for network plugins.
	Handles []string
	// ConfigSchema is the JSON Schema (draft 2020-12) of the plugin's
	// manifest config, which the daemon checks the manifest against before
	// Configure; empty when the plugin declares none. The plugin SDK makes
	// it from the adapter's ConfigDefaulter.
	ConfigSchema []byte
	// RootfsTypes, for a volume plugin, lists the volume types of Handles
	// whose flexvolumes may hold the VM's persistent root filesystem
	// (RootfsOption): Prepare then gets VolumeRequest.Rootfs and returns
	// the disk the VM boots. The core refuses the option on other types.
	RootfsTypes []string
}

// Describer is implemented by every adapter that is served as a plugin.
type Describer interface {
	PluginInfo() PluginInfo
}

// PluginConfig is handed to a plugin once after each launch.
type PluginConfig struct {
	// Config is the manifest's `config` object, as JSON (may be empty).
	Config []byte
	// StateDir is a directory reserved for this plugin (created 0700).
	StateDir string
}

// Configurer is implemented by adapters that accept configuration. Plugins
// that do not implement it refuse a non-empty manifest `config`.
type Configurer interface {
	Configure(ctx context.Context, cfg PluginConfig) error
}

// ConfigDefaulter is implemented by Configurers to declare their config:
// DefaultConfig returns it with every default filled in. Its type is the
// config's schema (the JSON names of its fields, each described by a
// `jsonschema_description` tag; see github.com/invopop/jsonschema), its
// values the defaults the schema shows. The daemon checks a manifest's
// config against that schema before Configure, naming the manifest file
// and the key of every problem.
type ConfigDefaulter interface {
	DefaultConfig() any
}

// Decode reads the manifest config into v strictly: an unknown field is an
// invalid argument naming it. An empty config leaves v as it is.
func (c PluginConfig) Decode(v interface{}) error {
	if len(c.Config) == 0 || string(c.Config) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(c.Config))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("plugin config: %v: %w", err, ErrInvalidArgument)
	}
	return nil
}
