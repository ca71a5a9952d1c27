package ports

import "context"

// KubeObjects reads Kubernetes objects a VM pod refers to.
type KubeObjects interface {
	// ConfigMap returns a ConfigMap's data and binaryData keys.
	ConfigMap(ctx context.Context, namespace, name string) (map[string][]byte, error)
	// Secret returns a Secret's data keys. Values are never logged.
	Secret(ctx context.Context, namespace, name string) (map[string][]byte, error)
}
