// Package deploy holds the cluster-side objects of a Virtlet install: the
// RuntimeClass, Virtlet's VirtletImageMapping and VirtletConfigMapping
// custom resources, the node labels, and the node installer's DaemonSet
// (cmd/virtlet-installer). The cluster objects grant one thing: nodes (the
// group system:nodes) may read those mappings. A node daemon reads
// ConfigMaps and Secrets with its node's identity, which the Node
// authorizer limits to what the node's pods reference. `virtletctl gen`
// prints them; `kubectl apply -k deploy/` applies the same from a checkout
// (kustomization.yaml lists them).
package deploy

import (
	"embed"
	"fmt"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

//go:embed *.yaml
var files embed.FS

// NodeLabel marks the nodes that run Virtlet: Virtlet's example VM pods select
// it in their node affinity, the RuntimeClass in its scheduling, and the
// installer's DaemonSet in its node selector.
const NodeLabel, NodeLabelValue = "extraRuntime", "virtlet"

// InstallerImage is the node installer's image, without its tag.
const InstallerImage = "ghcr.io/virtlet/virtlet-node"

// installerFile is the DaemonSet's file.
const installerFile = "installer-daemonset.yaml"

// Options choose what Manifests prints.
type Options struct {
	// Nodes: each adds a Node object that labels that node (kubectl
	// apply merges it into the existing node).
	Nodes []string
	// Tag is the installer image's tag ("": the kustomization's).
	Tag string
	// NoInstaller leaves the installer's DaemonSet out: for nodes
	// installed by `make install`.
	NoInstaller bool
}

var imageLine = regexp.MustCompile(`(?m)^(\s*image: ` + regexp.QuoteMeta(InstallerImage) + `):\S+$`)

// Manifests returns the objects as one YAML stream, in the order
// kustomization.yaml lists their files.
func Manifests(o Options) (string, error) {
	names, err := resources()
	if err != nil {
		return "", err
	}
	var docs []string
	for _, n := range names {
		if n == installerFile && o.NoInstaller {
			continue
		}
		b, err := files.ReadFile(n)
		if err != nil {
			return "", err
		}
		doc := strings.TrimSpace(string(b))
		if n == installerFile && o.Tag != "" {
			doc = imageLine.ReplaceAllString(doc, "${1}:"+o.Tag)
		}
		docs = append(docs, fmt.Sprintf("# deploy/%s\n%s", n, doc))
	}
	for _, node := range o.Nodes {
		docs = append(docs, fmt.Sprintf("# the node %[1]s runs Virtlet\napiVersion: v1\nkind: Node\nmetadata:\n  name: %[1]s\n  labels:\n    %s: %s", node, NodeLabel, NodeLabelValue))
	}
	return strings.Join(docs, "\n---\n") + "\n", nil
}

// resources are kustomization.yaml's resources.
func resources() ([]string, error) {
	b, err := files.ReadFile("kustomization.yaml")
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("deploy/kustomization.yaml: %w", err)
	}
	return k.Resources, nil
}
