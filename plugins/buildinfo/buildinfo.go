// Package buildinfo holds what the build stamps into the binaries: the
// daemon, virtletctl, and every plugin, whose PluginInfo reports it unless
// its adapter names a version of its own.
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Set with -ldflags "-X github.com/virtlet/virtlet/plugins/buildinfo.version=..." (see the Makefile).
var (
	version         string
	pluginChecksums string // name=sha256,name=sha256: the default plugins built with the daemon
)

// Version is the build's version: the stamped one, else the module's.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// PluginChecksums returns the checksums of the default plugins stamped at
// build time, by plugin name.
func PluginChecksums() map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(pluginChecksums, ",") {
		if name, sum, ok := strings.Cut(kv, "="); ok && name != "" {
			out[name] = sum
		}
	}
	return out
}
