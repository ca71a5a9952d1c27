package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/plugins/buildinfo"
)

// versions is what version reports: the client's and, per node whose
// container runtime is Virtlet, its daemon's.
type versions struct {
	Client string        `json:"clientVersion"`
	Nodes  []nodeVersion `json:"nodes,omitempty"`
}

type nodeVersion struct {
	Node    string `json:"node"`
	Virtlet string `json:"virtletVersion"`
}

func newVersion(k *kube, name string) *cobra.Command {
	var clientOnly, short bool
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the client's version and the Virtlet daemons' (per node)",
		Long: `version prints this client's version and, unless --client, the version of the
Virtlet daemon on each node whose container runtime is Virtlet (as kubelet
reports it in the node's status). -o json or -o yaml prints them as an
object; --short prints the versions alone, as kubectl did.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != "json" && output != "yaml" {
				return fmt.Errorf("-o %q: want json or yaml", output)
			}
			v := versions{Client: buildinfo.Version()}
			if !clientOnly {
				if err := k.connect(); err != nil {
					return err
				}
				nodes, err := k.client.CoreV1().Nodes().List(cmd.Context(), metav1.ListOptions{})
				if err != nil {
					return fmt.Errorf("list nodes (--client prints the client's version only): %w", err)
				}
				for _, n := range nodes.Items {
					if ver, ok := strings.CutPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "virtlet://"); ok {
						v.Nodes = append(v.Nodes, nodeVersion{Node: n.Name, Virtlet: ver})
					}
				}
				sort.Slice(v.Nodes, func(i, j int) bool { return v.Nodes[i].Node < v.Nodes[j].Node })
			}
			return printVersions(cmd.OutOrStdout(), v, output, short, clientOnly)
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print the client's version only")
	cmd.Flags().BoolVar(&short, "short", false, "print the versions alone")
	cmd.Flags().StringVarP(&output, "output", "o", "", "print the versions as json or yaml")
	return cmd
}

// printVersions writes v in the form asked for.
func printVersions(w io.Writer, v versions, output string, short, clientOnly bool) error {
	switch output {
	case "json":
		out, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", out)
		return err
	case "yaml":
		out, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	}
	if short {
		fmt.Fprintf(w, "Client Version: %s\n", v.Client)
		for _, n := range v.Nodes {
			fmt.Fprintf(w, "Server Version (%s): %s\n", n.Node, n.Virtlet)
		}
		return nil
	}
	fmt.Fprintf(w, "client: %s\n", v.Client)
	if clientOnly {
		return nil
	}
	if len(v.Nodes) == 0 {
		fmt.Fprintln(w, "no node runs Virtlet")
	}
	for _, n := range v.Nodes {
		fmt.Fprintf(w, "node %s: virtlet %s\n", n.Node, n.Virtlet)
	}
	return nil
}
