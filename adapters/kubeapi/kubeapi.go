// Package kubeapi reads ConfigMaps and Secrets, and Virtlet's
// VirtletImageMapping objects, from the Kubernetes API server with
// client-go. The daemon should hold its node's identity
// (system:node:<name> in system:nodes, as kubelet does): the Node
// authorizer then lets it read only what the pods bound to its node
// reference, and `virtletctl gen`'s ClusterRole lets system:nodes read the
// image mappings.
package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/virtlet/virtlet/ports"
)

// CallTimeout bounds one API request.
const CallTimeout = 15 * time.Second

// Client is a ports.KubeObjects on the API server.
type Client struct {
	cs  kubernetes.Interface
	dyn dynamic.Interface // custom resources: VirtletImageMapping
}

// New connects with a kubeconfig file, or with the in-cluster service
// account when kubeconfig is empty.
func New(kubeconfig string) (*Client, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster Kubernetes config (pass --kubeconfig outside a cluster): %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
	}
	cfg.UserAgent = "virtlet"
	cfg.Timeout = CallTimeout
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("Kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("Kubernetes client for custom resources: %w", err)
	}
	return NewForClientsets(cs, dyn), nil
}

// NewForClientset wraps an existing clientset, without custom resources
// (ImageMappings then reports none).
func NewForClientset(cs kubernetes.Interface) *Client { return &Client{cs: cs} }

// NewForClientsets wraps existing clientsets.
func NewForClientsets(cs kubernetes.Interface, dyn dynamic.Interface) *Client {
	return &Client{cs: cs, dyn: dyn}
}

// ConfigMap returns the ConfigMap's data and binaryData.
func (c *Client) ConfigMap(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	cm, err := c.cs.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, apiError("configmap", namespace, name, err)
	}
	return ConfigMapData(cm), nil
}

// Secret returns the Secret's data.
func (c *Client) Secret(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	s, err := c.cs.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, apiError("secret", namespace, name, err)
	}
	return SecretData(s), nil
}

// ConfigMapData is a ConfigMap's data and binaryData keys.
func ConfigMapData(cm *corev1.ConfigMap) map[string][]byte {
	out := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		out[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		out[k] = v
	}
	return out
}

// SecretData is a Secret's data, with stringData merged in as the API
// server does on write.
func SecretData(s *corev1.Secret) map[string][]byte {
	out := make(map[string][]byte, len(s.Data)+len(s.StringData))
	for k, v := range s.Data {
		out[k] = v
	}
	for k, v := range s.StringData {
		out[k] = []byte(v)
	}
	return out
}

func apiError(kind, namespace, name string, err error) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s %s/%s: %w", kind, namespace, name, ports.ErrNotFound)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s %s/%s: the node may not read it (a node reads only what its pods reference in their spec: "+
			"reference it from the pod's volumes or env, or let the group system:nodes get it with a Role in %s): %v: %w",
			kind, namespace, name, namespace, err, ports.ErrFailedPrecondition)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s %s/%s: the API server does not accept the daemon's credentials (its kubeconfig): %v: %w", kind, namespace, name, err, ports.ErrFailedPrecondition)
	default:
		return fmt.Errorf("get %s %s/%s: %v: %w", kind, namespace, name, err, ports.ErrUnavailable)
	}
}

// NodePrefix begins the user name of a node's identity.
const NodePrefix = "system:node:"

// Identity asks the API server who the client is (a SelfSubjectReview):
// its user name and groups.
func (c *Client) Identity(ctx context.Context) (user string, groups []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	r, err := c.cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("ask the API server who the daemon is: %w", err)
	}
	return r.Status.UserInfo.Username, r.Status.UserInfo.Groups, nil
}

// Virtlet's custom resources (deploy/virtlet*mapping-crd.yaml); their
// objects live in MappingNamespace, where Virtlet read them.
var (
	ImageMappingResource  = schema.GroupVersionResource{Group: "virtlet.k8s", Version: "v1", Resource: "virtletimagemappings"}
	ConfigMappingResource = schema.GroupVersionResource{Group: "virtlet.k8s", Version: "v1", Resource: "virtletconfigmappings"}
)

// MappingNamespace holds the VirtletImageMapping and VirtletConfigMapping
// objects.
const MappingNamespace = "kube-system"

// MappingReader is the ClusterRole that lets nodes read the mappings
// (deploy/virtletmapping-reader.yaml).
const MappingReader = "virtlet:mapping-reader"

// ImageMappings lists the VirtletImageMapping objects: each one's spec,
// as JSON, by name. None while the custom resource is not installed.
func (c *Client) ImageMappings(ctx context.Context) (map[string][]byte, error) {
	return c.specs(ctx, ImageMappingResource, "VirtletImageMapping")
}

// ConfigMappings lists the VirtletConfigMapping objects: each one's spec,
// as JSON, by name. None while the custom resource is not installed.
func (c *Client) ConfigMappings(ctx context.Context) (map[string][]byte, error) {
	return c.specs(ctx, ConfigMappingResource, "VirtletConfigMapping")
}

func (c *Client) specs(ctx context.Context, res schema.GroupVersionResource, kind string) (map[string][]byte, error) {
	if c.dyn == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	list, err := c.dyn.Resource(res).Namespace(MappingNamespace).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil // the CRD is not installed
	case apierrors.IsForbidden(err):
		return nil, fmt.Errorf("list %s objects in %s: the node may not (apply `virtletctl gen`'s ClusterRole %s): %v: %w",
			kind, MappingNamespace, MappingReader, err, ports.ErrFailedPrecondition)
	case err != nil:
		return nil, fmt.Errorf("list %s objects in %s: %v: %w", kind, MappingNamespace, err, ports.ErrUnavailable)
	}
	out := make(map[string][]byte, len(list.Items))
	for _, item := range list.Items {
		spec, _, err := unstructured.NestedFieldNoCopy(item.Object, "spec")
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: spec: %w", kind, MappingNamespace, item.GetName(), err)
		}
		data, err := json.Marshal(spec)
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: spec: %w", kind, MappingNamespace, item.GetName(), err)
		}
		out[item.GetName()] = data
	}
	return out, nil
}

// NodeLabels returns the labels of the node name (a node may read its
// own Node object).
func (c *Client) NodeLabels(ctx context.Context, name string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	n, err := c.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("node %s is not registered: %w", name, ports.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get node %s (a node's identity reads its own): %w", name, err)
	}
	return n.Labels, nil
}

var _ ports.KubeObjects = (*Client)(nil)
