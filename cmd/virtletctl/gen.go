package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/virtlet/virtlet/deploy"
)

func newGen(name string) *cobra.Command {
	var nodes []string
	cmd := &cobra.Command{
		Use:   "gen [--node NAME]...",
		Short: "Print the cluster objects a Virtlet node needs (pipe to kubectl apply -f -)",
		Long: "gen prints the cluster-side objects of a Virtlet install: the RuntimeClass virtlet, Virtlet's custom resources\n" +
			"VirtletImageMapping (image name translations) and VirtletConfigMapping (node settings), in kube-system, with a\n" +
			"ClusterRole that lets nodes read them, and, for each --node, the node's " + deploy.NodeLabel + "=" + deploy.NodeLabelValue + " label. It grants nothing\n" +
			"else: node daemons read ConfigMaps and Secrets with their node's identity (system:node:<name>), as kubelet does.\n" +
			"  " + name + " gen --node node-1 | kubectl apply -f -",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, n := range nodes {
				if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
					return fmt.Errorf("--node %q: not a node name: %s", n, errs[0])
				}
			}
			out, err := deploy.Manifests(nodes)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringArrayVar(&nodes, "node", nil, "label this node as a Virtlet node (repeatable)")
	return cmd
}
