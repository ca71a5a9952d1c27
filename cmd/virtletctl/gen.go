package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/virtlet/virtlet/deploy"
)

func newGen(name string) *cobra.Command {
	var (
		nodes       []string
		tag         string
		noInstaller bool
	)
	cmd := &cobra.Command{
		Use:   "gen [--node NAME]... [--tag TAG] [--no-installer]",
		Short: "Print the cluster objects a Virtlet node needs (pipe to kubectl apply -f -)",
		Long: "gen prints the cluster-side objects of a Virtlet install: the RuntimeClass virtlet, Virtlet's custom resources\n" +
			"VirtletImageMapping (image name translations) and VirtletConfigMapping (node settings), in kube-system, with a\n" +
			"ClusterRole that lets nodes read them; the node installer's DaemonSet (kube-system/virtlet-installer, image\n" +
			deploy.InstallerImage + ":TAG), which makes every node labelled " + deploy.NodeLabel + "=" + deploy.NodeLabelValue + " a Virtlet node; and, for each\n" +
			"--node, that label. It grants nothing else: node daemons read ConfigMaps and Secrets with their node's identity\n" +
			"(system:node:<name>), as kubelet does. `kubectl apply -k deploy/` applies the same objects from a checkout.\n" +
			"  " + name + " gen --tag v1 --node node-1 | kubectl apply -f -",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, n := range nodes {
				if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
					return fmt.Errorf("--node %q: not a node name: %s", n, errs[0])
				}
			}
			if tag != "" {
				if errs := validation.IsValidLabelValue(tag); len(errs) > 0 || strings.ContainsAny(tag, "/:@") {
					return fmt.Errorf("--tag %q: not an image tag", tag)
				}
			}
			out, err := deploy.Manifests(deploy.Options{Nodes: nodes, Tag: tag, NoInstaller: noInstaller})
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringArrayVar(&nodes, "node", nil, "label this node as a Virtlet node (repeatable)")
	cmd.Flags().StringVar(&tag, "tag", "", "the installer image's tag (make image's; default: the kustomization's, latest)")
	cmd.Flags().BoolVar(&noInstaller, "no-installer", false, "leave out the installer's DaemonSet (nodes installed with make install)")
	return cmd
}
