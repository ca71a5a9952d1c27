// Package kubeapi reads ConfigMaps and Secrets from the Kubernetes API
// server with client-go. The daemon should hold its node's identity
// (system:node:<name> in system:nodes, as kubelet does): the Node
// authorizer then lets it read only what the pods bound to its node
// reference.
package kubeapi

import (
	"context"
	"fmt"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/virtlet/virtlet/ports"
)

// CallTimeout bounds one API request.
const CallTimeout = 15 * time.Second

// Client is a ports.KubeObjects on the API server.
type Client struct {
	cs kubernetes.Interface
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
	return NewForClientset(cs), nil
}

// NewForClientset wraps an existing clientset.
func NewForClientset(cs kubernetes.Interface) *Client { return &Client{cs: cs} }

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

var _ ports.KubeObjects = (*Client)(nil)
