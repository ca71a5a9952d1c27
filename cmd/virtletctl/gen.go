package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// errNoManifests: the node deployment (RuntimeClass, RBAC, node label,
// install) belongs to the real-node work, which has not landed.
var errNoManifests = errors.New("gen has nothing to print yet: the node deployment manifests (RuntimeClass virtlet, RBAC for reading ConfigMaps and Secrets, the node label) come with the real-node install, which this build does not have; until then follow README's \"Running the daemon\"")

func newGen(name string) *cobra.Command {
	return &cobra.Command{
		Use:   "gen",
		Short: "Print the cluster objects a Virtlet node needs (not available yet)",
		Long:  "gen will print the cluster-side objects of a Virtlet node install. This build has none: it fails saying so.",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return errNoManifests },
	}
}
