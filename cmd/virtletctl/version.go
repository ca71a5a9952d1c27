package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtlet/virtlet/plugins/buildinfo"
)

func newVersion(k *kube, name string) *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the client's version and the Virtlet daemons' (per node)",
		Long: `version prints this client's version and, unless --client, the version of the
Virtlet daemon on each node whose container runtime is Virtlet (as kubelet
reports it in the node's status).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "client: %s\n", buildinfo.Version())
			if clientOnly {
				return nil
			}
			if err := k.connect(); err != nil {
				return err
			}
			nodes, err := k.client.CoreV1().Nodes().List(cmd.Context(), metav1.ListOptions{})
			if err != nil {
				return fmt.Errorf("list nodes (--client prints the client's version only): %w", err)
			}
			var lines []string
			for _, n := range nodes.Items {
				if v, ok := strings.CutPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "virtlet://"); ok {
					lines = append(lines, fmt.Sprintf("node %s: virtlet %s", n.Name, v))
				}
			}
			if len(lines) == 0 {
				fmt.Fprintln(w, "no node runs Virtlet")
				return nil
			}
			sort.Strings(lines)
			fmt.Fprintln(w, strings.Join(lines, "\n"))
			return nil
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print the client's version only")
	return cmd
}
