package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
)

// kube is the connection to the API server, configured as kubectl's is:
// --kubeconfig (else $KUBECONFIG, else ~/.kube/config), --context,
// -n/--namespace (else the context's namespace).
type kube struct {
	kubeconfig, context, namespace string

	config *rest.Config
	client kubernetes.Interface
	ns     string
}

func (k *kube) addFlags(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&k.context, "context", "", "the kubeconfig context to use")
	f.StringVarP(&k.namespace, "namespace", "n", "", "the namespace of the pod (default: the context's namespace)")
}

// connect loads the kubeconfig and makes the client.
func (k *kube) connect() error {
	if k.client != nil {
		return nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if k.kubeconfig != "" {
		rules.ExplicitPath = k.kubeconfig
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: k.context}
	if k.namespace != "" {
		overrides.Context.Namespace = k.namespace
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return fmt.Errorf("load the kubeconfig: %w (set --kubeconfig or $KUBECONFIG)", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return fmt.Errorf("the kubeconfig's namespace: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("API client: %w", err)
	}
	k.config, k.client, k.ns = cfg, client, ns
	return nil
}

// onVMPod makes a command's RunE that finds the VM pod its first argument
// names, then runs run with it.
func (k *kube) onVMPod(run func(ctx context.Context, pod *corev1.Pod, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		pod, err := k.vmPod(cmd.Context(), args[0])
		if err != nil {
			return err
		}
		return run(cmd.Context(), pod, args)
	}
}

// vmPod finds a running VM pod by name in the namespace.
func (k *kube) vmPod(ctx context.Context, name string) (*corev1.Pod, error) {
	if err := k.connect(); err != nil {
		return nil, err
	}
	pod, err := k.client.CoreV1().Pods(k.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", k.ns, name, err)
	}
	if !isVMPod(pod) {
		return nil, fmt.Errorf("pod %s/%s is not a Virtlet VM pod (no kubernetes.io/target-runtime: virtlet.cloud annotation, no virtlet RuntimeClass, no virtlet.cloud/ image)", k.ns, name)
	}
	if pod.Status.Phase != corev1.PodRunning {
		return nil, fmt.Errorf("pod %s/%s is %s, not Running: its VM must run first (kubectl describe pod %s -n %s tells why)", k.ns, name, pod.Status.Phase, name, k.ns)
	}
	return pod, nil
}

func isVMPod(pod *corev1.Pod) bool {
	if pod.Annotations["kubernetes.io/target-runtime"] == "virtlet.cloud" {
		return true
	}
	if rc := pod.Spec.RuntimeClassName; rc != nil && *rc == "virtlet" {
		return true
	}
	for _, c := range pod.Spec.Containers {
		if strings.HasPrefix(c.Image, "virtlet.cloud/") {
			return true
		}
	}
	return false
}

// exec runs cmd in the pod's container through the API server (the
// daemon serves Virtlet's own commands itself).
func (k *kube) exec(ctx context.Context, pod *corev1.Pod, cmd []string, stdin io.Reader, stdout, stderr io.Writer) error {
	req := k.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: pod.Spec.Containers[0].Name, Command: cmd,
			Stdin: stdin != nil, Stdout: stdout != nil, Stderr: stderr != nil,
		}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(k.config, http.MethodPost, req.URL())
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}
