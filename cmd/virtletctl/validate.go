package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtlet/virtlet/deploy"
)

// runtimeClassName is the RuntimeClass `virtletctl gen` makes.
const runtimeClassName = "virtlet"

func newValidate(k *kube, name string) *cobra.Command {
	return &cobra.Command{
		Use:   "validate",
		Short: "Check that the cluster's Virtlet nodes are ready to run VM pods",
		Long: `validate checks the cluster as Virtlet's own validate did, through the API
server alone (it starts no pod and mounts nothing of the nodes):
  - some nodes carry the label ` + deploy.NodeLabel + `=` + deploy.NodeLabelValue + `, and the RuntimeClass
    ` + runtimeClassName + ` exists with the handler ` + runtimeClassName + `;
  - each such node is Ready (kubelet reports the runtime's and the pod network's
    readiness there), and its container runtime is Virtlet;
  - each such node's kubelet (its /configz, read through the API server's node
    proxy) sends both runtime and image calls to that runtime's socket (an image
    service endpoint elsewhere would pull VM images into another runtime), and
    has the feature gate ` + statsGate + ` on, without which it
    reads a VM pod's usage from the pod's cgroup, which QEMU is not in.
It prints what it checked, what it could not check (a warning: the API
server proxies to no kubelet on a loopback address, and reading /configz
needs get on nodes/proxy), and each problem with what to do, and exits 1
when it found any.`,
		Example: "  " + name + " validate",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := k.connect(); err != nil {
				return err
			}
			v := validator{k: k, configz: k.kubeletConfig}
			return v.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
}

// validator checks a cluster's Virtlet nodes; configz reads a node's
// kubelet configuration (a seam: tests have no node proxy).
type validator struct {
	k       *kube
	configz func(ctx context.Context, node string) (kubeletConfig, error)
}

// kubeletConfig holds the fields of kubelet's /configz answer that
// validate checks.
type kubeletConfig struct {
	ContainerRuntimeEndpoint string          `json:"containerRuntimeEndpoint"`
	ImageServiceEndpoint     string          `json:"imageServiceEndpoint"`
	FeatureGates             map[string]bool `json:"featureGates"`
}

// statsGate makes kubelet take a pod's usage from the runtime: a VM's
// QEMU runs outside the pod's cgroup, where kubelet otherwise reads it.
const statsGate = "PodAndContainerStatsFromCRI"

func (k *kube) kubeletConfig(ctx context.Context, node string) (kubeletConfig, error) {
	raw, err := k.client.CoreV1().RESTClient().Get().
		AbsPath("/api/v1/nodes", node, "proxy", "configz").DoRaw(ctx)
	if err != nil {
		// The API server's own words ("address not allowed": it proxies
		// to no loopback kubelet) come in the body.
		if said := strings.TrimSpace(string(raw)); said != "" && len(said) < 300 {
			err = fmt.Errorf("%w: %s", err, said)
		}
		return kubeletConfig{}, err
	}
	var answer struct {
		KubeletConfig kubeletConfig `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		return kubeletConfig{}, fmt.Errorf("kubelet's /configz: %w", err)
	}
	return answer.KubeletConfig, nil
}

func (v validator) run(ctx context.Context, out io.Writer) error {
	var problems []string
	problem := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	selector := deploy.NodeLabel + "=" + deploy.NodeLabelValue
	nodes, err := v.k.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return fmt.Errorf("list the nodes labelled %s: %w", selector, err)
	}
	rc, err := v.k.client.NodeV1().RuntimeClasses().Get(ctx, runtimeClassName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		problem("RuntimeClass %s does not exist: pods naming it are refused (apply `virtletctl gen`'s objects)", runtimeClassName)
	case err != nil:
		problem("RuntimeClass %s: %v", runtimeClassName, err)
	case rc.Handler != runtimeClassName:
		problem("RuntimeClass %s has handler %q, not %q: kubelet would ask Virtlet for another runtime", runtimeClassName, rc.Handler, runtimeClassName)
	default:
		fmt.Fprintf(out, "RuntimeClass %s: handler %s\n", runtimeClassName, rc.Handler)
	}
	if len(nodes.Items) == 0 {
		problem("no node has the label %s: VM pods have nowhere to run (kubectl label node NAME %s, or virtletctl gen --node NAME)", selector, selector)
	}
	sort.Slice(nodes.Items, func(i, j int) bool { return nodes.Items[i].Name < nodes.Items[j].Name })
	for i := range nodes.Items {
		n := &nodes.Items[i]
		var unchecked []string
		found := v.checkNode(ctx, n, &unchecked)
		for _, p := range found {
			problem("node %s: %s", n.Name, p)
		}
		for _, u := range unchecked {
			fmt.Fprintf(out, "warning: node %s: not checked: %s\n", n.Name, u)
		}
		if len(found) == 0 {
			fmt.Fprintf(out, "node %s: ready; runtime %s; kubelet %s\n", n.Name, n.Status.NodeInfo.ContainerRuntimeVersion, n.Status.NodeInfo.KubeletVersion)
		}
	}
	for _, p := range problems {
		fmt.Fprintln(out, "problem:", p)
	}
	if len(problems) > 0 {
		return fmt.Errorf("found %d problem(s)", len(problems))
	}
	fmt.Fprintln(out, "validation successful")
	return nil
}

// checkNode returns what is wrong with a Virtlet node.
// What it could not check it adds to unchecked.
func (v validator) checkNode(ctx context.Context, n *corev1.Node, unchecked *[]string) []string {
	var found []string
	ready := false
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		ready = c.Status == corev1.ConditionTrue
		if !ready {
			found = append(found, fmt.Sprintf("not Ready (%s: %s)", c.Reason, c.Message))
		}
	}
	if !ready && len(found) == 0 {
		found = append(found, "kubelet has not reported the node Ready")
	}
	if rt := n.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(rt, "virtlet://") {
		found = append(found, fmt.Sprintf("its container runtime is %q, not Virtlet: point kubelet's containerRuntimeEndpoint at the daemon's socket", rt))
	}
	cfg, err := v.configz(ctx, n.Name)
	if err != nil {
		reason := err.Error()
		if apierrors.IsForbidden(err) {
			reason = "you need get on nodes/proxy"
		}
		*unchecked = append(*unchecked, "kubelet's configuration (/configz through the node proxy): "+reason)
		return found
	}
	if cfg.ImageServiceEndpoint != "" && cfg.ImageServiceEndpoint != cfg.ContainerRuntimeEndpoint {
		found = append(found, fmt.Sprintf("kubelet's imageServiceEndpoint %q is not its containerRuntimeEndpoint %q: VM images would be pulled by another runtime (leave imageServiceEndpoint empty)",
			cfg.ImageServiceEndpoint, cfg.ContainerRuntimeEndpoint))
	}
	if !cfg.FeatureGates[statsGate] {
		found = append(found, fmt.Sprintf("kubelet's feature gate %s is off: its summary API, kubectl top and the eviction manager see almost none of the VMs' memory and CPU (set featureGates: {%s: true})",
			statsGate, statsGate))
	}
	return found
}
