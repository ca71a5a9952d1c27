// Package kubedir serves ConfigMaps and Secrets from a directory of
// Kubernetes manifests (YAML or JSON, several documents per file allowed),
// for nodes without an API server and for tests. The directory is read on
// every call, so objects can be added while the daemon runs. A Secret's
// stringData is merged into its data as the API server would.
package kubedir

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/adapters/kubeapi"
	"github.com/virtlet/virtlet/ports"
)

// Dir is a ports.KubeObjects over a manifest directory.
type Dir struct{ path string }

// New returns the adapter for dir, which must exist.
func New(dir string) (*Dir, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("Kubernetes objects directory: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("Kubernetes objects directory %s: not a directory", dir)
	}
	return &Dir{path: dir}, nil
}

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// find returns the document of the object kind namespace/name.
func (d *Dir) find(kind, namespace, name string) ([]byte, error) {
	var files []string
	for _, pat := range []string{"*.yaml", "*.yml", "*.json"} {
		m, err := filepath.Glob(filepath.Join(d.path, pat))
		if err != nil {
			return nil, err
		}
		files = append(files, m...)
	}
	sort.Strings(files)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		r := utilyaml.NewYAMLReader(bufioReader(raw))
		for i := 1; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", f, i, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			var h header
			if err := yaml.Unmarshal(doc, &h); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", f, i, err)
			}
			ns := h.Metadata.Namespace
			if ns == "" {
				ns = "default"
			}
			if h.APIVersion == "v1" && h.Kind == kind && h.Metadata.Name == name && ns == namespace {
				return doc, nil
			}
		}
	}
	return nil, fmt.Errorf("%s %s/%s in %s: %w", strings.ToLower(kind), namespace, name, d.path, ports.ErrNotFound)
}

// ConfigMap returns a ConfigMap's data and binaryData.
func (d *Dir) ConfigMap(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	doc, err := d.find("ConfigMap", namespace, name)
	if err != nil {
		return nil, err
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(doc, &cm); err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %w", namespace, name, err)
	}
	return kubeapi.ConfigMapData(&cm), nil
}

// Secret returns a Secret's data, with stringData merged in.
func (d *Dir) Secret(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	doc, err := d.find("Secret", namespace, name)
	if err != nil {
		return nil, err
	}
	var s corev1.Secret
	if err := yaml.UnmarshalStrict(doc, &s); err != nil {
		// The decoder's message may quote the document: keep it out.
		return nil, fmt.Errorf("secret %s/%s: not a valid Secret manifest", namespace, name)
	}
	return kubeapi.SecretData(&s), nil
}

var _ ports.KubeObjects = (*Dir)(nil)

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
