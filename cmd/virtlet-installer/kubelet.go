package main

import (
	"fmt"
	"io/fs"
	"os"

	"sigs.k8s.io/yaml"
)

// defaultEndpoint is kubelet's runtime when its configuration names none:
// containerd's socket (kubelet has no built-in default since dockershim
// went; kubeadm and every distribution set containerd's).
const defaultEndpoint = "unix:///run/containerd/containerd.sock"

// kubeletConfig is kubelet's KubeletConfiguration file as read.
type kubeletConfig struct {
	raw    []byte
	mode   fs.FileMode
	fields map[string]interface{}
}

func readKubeletConfig(p string) (*kubeletConfig, error) {
	info, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	kc := &kubeletConfig{raw: raw, mode: info.Mode().Perm()}
	if err := yaml.Unmarshal(raw, &kc.fields); err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	if kind, _ := kc.fields["kind"].(string); kind != "KubeletConfiguration" {
		return nil, fmt.Errorf("kind %q: want KubeletConfiguration", kind)
	}
	return kc, nil
}

// endpoint is the runtime kubelet uses.
func (kc *kubeletConfig) endpoint() string {
	if e, _ := kc.fields["containerRuntimeEndpoint"].(string); e != "" {
		return e
	}
	return defaultEndpoint
}

// volumePluginDir is where kubelet looks for flexvolume drivers.
func (kc *kubeletConfig) volumePluginDir() string {
	if d, _ := kc.fields["volumePluginDir"].(string); d != "" {
		return d
	}
	return defaultPluginDir
}

// withRuntime is the configuration with kubelet's runtime set to
// endpoint, and the feature gate that makes kubelet take pods' usage from
// the runtime (QEMU runs outside the pod's cgroup, where cAdvisor looks).
func (kc *kubeletConfig) withRuntime(endpoint string) ([]byte, error) {
	fields := map[string]interface{}{}
	for k, v := range kc.fields {
		fields[k] = v
	}
	fields["containerRuntimeEndpoint"] = endpoint
	gates := map[string]interface{}{}
	if g, ok := fields["featureGates"].(map[string]interface{}); ok {
		for k, v := range g {
			gates[k] = v
		}
	}
	gates["PodAndContainerStatsFromCRI"] = true
	fields["featureGates"] = gates
	return yaml.Marshal(fields)
}
