// Package deploy holds the cluster-side objects of a Virtlet install: the
// RuntimeClass, Virtlet's VirtletImageMapping and VirtletConfigMapping
// custom resources, and the node labels. It grants one thing: nodes (the
// group system:nodes) may read those mappings. A node daemon reads ConfigMaps and Secrets with its
// node's identity, which the Node authorizer limits to what the node's pods
// reference. `virtletctl gen` prints them; `kubectl apply -f deploy/`
// applies them from a checkout.
package deploy

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

//go:embed *.yaml
var files embed.FS

// NodeLabel marks the nodes that run Virtlet: Virtlet's example VM pods select
// it in their node affinity, and the RuntimeClass in its scheduling.
const NodeLabel, NodeLabelValue = "extraRuntime", "virtlet"

// Manifests returns the cluster objects as one YAML stream; each name in
// nodes adds a Node object that labels that node (kubectl apply merges it
// into the existing node).
func Manifests(nodes []string) (string, error) {
	names, err := fs.Glob(files, "*.yaml")
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	var docs []string
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			return "", err
		}
		docs = append(docs, fmt.Sprintf("# deploy/%s\n%s", n, strings.TrimSpace(string(b))))
	}
	for _, node := range nodes {
		docs = append(docs, fmt.Sprintf("# the node %[1]s runs Virtlet\napiVersion: v1\nkind: Node\nmetadata:\n  name: %[1]s\n  labels:\n    %s: %s", node, NodeLabel, NodeLabelValue))
	}
	return strings.Join(docs, "\n---\n") + "\n", nil
}
