package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/plugins/manifest"
)

func mappings(t *testing.T, specs map[string]string) []configMapping {
	t.Helper()
	raw := map[string][]byte{}
	for n, s := range specs {
		raw[n] = []byte(s)
	}
	ms, errs := parseConfigMappings(raw)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return ms
}

// The mappings that select the node, merged as Virtlet merged them: a
// higher priority wins field by field; the node name and every selector
// label must match.
func TestNodeSettings(t *testing.T) {
	ms := mappings(t, map[string]string{
		"all":        `{"config": {"streamPort": 10010, "logLevel": 1}}`,
		"virtlet":    `{"priority": 5, "nodeSelector": {"extraRuntime": "virtlet"}, "config": {"streamPort": 10020}}`,
		"this-node":  `{"priority": 10, "nodeName": "node-1", "config": {"logLevel": 3}}`,
		"other-node": `{"priority": 20, "nodeName": "node-2", "config": {"logLevel": 4}}`,
		"gpu":        `{"priority": 20, "nodeSelector": {"gpu": "yes", "extraRuntime": "virtlet"}, "config": {"libvirtURI": "qemu:///gpu"}}`,
		"empty":      `{"priority": 30}`,
	})
	for _, tc := range []struct {
		node   string
		labels map[string]string
		want   string
	}{
		{"node-1", map[string]string{"extraRuntime": "virtlet"},
			"logLevel=3 (VirtletConfigMapping kube-system/this-node) streamPort=10020 (VirtletConfigMapping kube-system/virtlet)"},
		{"node-1", nil, "logLevel=3 (VirtletConfigMapping kube-system/this-node) streamPort=10010 (VirtletConfigMapping kube-system/all)"},
		{"node-3", map[string]string{"extraRuntime": "virtlet", "gpu": "yes"},
			"libvirtURI=qemu:///gpu (VirtletConfigMapping kube-system/gpu) logLevel=1 (VirtletConfigMapping kube-system/all) streamPort=10020 (VirtletConfigMapping kube-system/virtlet)"},
	} {
		var got []string
		for _, s := range nodeSettings(ms, tc.node, tc.labels) {
			got = append(got, fmt.Sprintf("%s=%v (%s)", s.field, s.value, s.from))
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s %v:\n got %s\nwant %s", tc.node, tc.labels, strings.Join(got, " "), tc.want)
		}
	}
}

// A mapping that does not decode is named, with its problem.
func TestConfigMappingErrors(t *testing.T) {
	_, errs := parseConfigMappings(map[string][]byte{
		"typo":  []byte(`{"config": {"logLvel": 3}}`),
		"wrong": []byte(`{"priority": "high"}`),
		"good":  []byte(`{"config": {"logLevel": 3}}`),
	})
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), `VirtletConfigMapping kube-system/typo: json: unknown field "logLvel"`) ||
		!strings.Contains(errs[1].Error(), "VirtletConfigMapping kube-system/wrong") {
		t.Errorf("errors %v", errs)
	}
}

// Each of Virtlet's settings goes to its counterpart where the node's own
// configuration leaves it unset; the others are not applied, each with
// its reason.
func TestApplySettings(t *testing.T) {
	ms := mappings(t, map[string]string{"m": `{"config": {
		"criSocketPath": "/run/virtlet-x.sock", "imageTranslationConfigsDir": "/etc/x/images", "streamPort": 10010,
		"logLevel": 3, "libvirtURI": "qemu:///system", "disableKVM": true, "rawDevices": "loop*, sd*",
		"cniPluginDir": "/opt/cni/bin", "cniConfigDir": "/etc/cni/net.d", "cpuModel": "Haswell",
		"downloadProtocol": "http", "enableSriov": true, "skipImageTranslation": true}}`})
	cfg := defaults()
	explicit := map[string]bool{"logLevel": true}
	cs := applySettings(&cfg, explicit, nodeSettings(ms, "n", nil))
	if cfg.Listen != "unix:///run/virtlet-x.sock" || cfg.ImageTranslations != "/etc/x/images" || cfg.StreamingAddress != "127.0.0.1:10010" ||
		!cfg.skipTranslations {
		t.Errorf("config %+v", cfg)
	}
	if cfg.LogLevel != "info" {
		t.Errorf("log level %s: the node's own (info) must win", cfg.LogLevel)
	}
	plugins, _ := json.Marshal(cs.plugins)
	if want := `{"cni":{"binDirs":["/opt/cni/bin"],"confDir":"/etc/cni/net.d"},"libvirt":{"accelerator":"tcg","uri":"qemu:///system"},"raw":{"allowedPaths":["/dev/loop*","/dev/sd*"]}}`; string(plugins) != want {
		t.Errorf("plugins' keys %s\nwant %s", plugins, want)
	}
	notApplied := strings.Join(cs.notApplied, "\n")
	for _, want := range []string{
		"cpuModel (from VirtletConfigMapping kube-system/m): a VM's CPU model is its pod's VirtletCPUModel annotation",
		`downloadProtocol "http" (from VirtletConfigMapping kube-system/m): names without a translation are downloaded with https`,
		"enableSriov (from VirtletConfigMapping kube-system/m): SR-IOV is refused",
		"logLevel (from VirtletConfigMapping kube-system/m): the node's own logLevel (--log-level) wins",
	} {
		if !strings.Contains(notApplied, want) {
			t.Errorf("not applied:\n%s\nlacks %q", notApplied, want)
		}
	}
	if len(cs.notApplied) != 4 {
		t.Errorf("%d not applied, want 4:\n%s", len(cs.notApplied), notApplied)
	}

	// The plugins' keys go into the manifests of those names, unless the
	// manifest sets the key itself.
	manifests := []manifest.Manifest{
		{Name: "libvirt", File: "10-libvirt.yaml", Config: json.RawMessage(`{"uri": "qemu:///own", "pool": {"size": 2}}`)},
		{Name: "raw", File: "raw.yaml"},
	}
	if err := applyPluginSettings(manifests, &cs); err != nil {
		t.Fatal(err)
	}
	if got := string(manifests[0].Config); got != `{"accelerator":"tcg","pool":{"size":2},"uri":"qemu:///own"}` {
		t.Errorf("libvirt config %s", got)
	}
	if got := string(manifests[1].Config); got != `{"allowedPaths":["/dev/loop*","/dev/sd*"]}` {
		t.Errorf("raw config %s", got)
	}
	notApplied = strings.Join(cs.notApplied, "\n")
	for _, want := range []string{"plugin libvirt config uri: the manifest 10-libvirt.yaml sets it",
		"plugin cni config binDirs: no plugin manifest is named cni", "plugin cni config confDir: no plugin manifest is named cni"} {
		if !strings.Contains(notApplied, want) {
			t.Errorf("not applied:\n%s\nlacks %q", notApplied, want)
		}
	}
}

// What the node's config file sets is its own, as its flags are.
func TestExplicitKeys(t *testing.T) {
	path := t.TempDir() + "/virtlet.yaml"
	if err := os.WriteFile(path, []byte("apiVersion: "+configAPIVersion+"\nkind: "+configKind+"\nlogLevel: debug\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := parseConfig([]string{"--config", path, "--listen", "unix:///run/x.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.explicit["logLevel"] || !cfg.explicit["listen"] || cfg.explicit["streamingAddress"] {
		t.Errorf("explicit keys %v", cfg.explicit)
	}
}
