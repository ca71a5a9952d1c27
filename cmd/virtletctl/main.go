// Command virtletctl reaches Virtlet's VM pods the way kubectl reaches
// pods: through the API server. `virtletctl ssh` forwards a port to the
// VM's sshd and runs ssh; `vnc` forwards its VNC display; `virsh` and
// `diag` ask the daemon on the VM's node, through the pod's exec
// subresource (see adapters/vmtools). Installed as `kubectl-virtlet`, it is
// the kubectl plugin `kubectl virtlet`.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/virtlet/virtlet/plugins/buildinfo"
)

func main() {
	root := newRoot(filepath.Base(os.Args[0]))
	if err := root.Execute(); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// exitError carries a remote command's exit code (ssh, virsh).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit code %d", e.code) }

// commandName is how the user called us: "kubectl virtlet" for the kubectl
// plugin (kubectl runs kubectl-virtlet), else "virtletctl".
func commandName(argv0 string) string {
	if argv0 == "kubectl-virtlet" {
		return "kubectl virtlet"
	}
	return "virtletctl"
}

func argv0Or(argv0 string) string {
	if argv0 == "kubectl-virtlet" {
		return argv0
	}
	return "virtletctl"
}

func newRoot(argv0 string) *cobra.Command {
	name := commandName(argv0)
	k := &kube{}
	root := &cobra.Command{
		Use:         argv0Or(argv0),
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: name},
		Short:       "Reach Virtlet's VM pods: ssh, VNC, virsh, status, diagnostics",
		Long: name + ` reaches the VMs of Virtlet's VM pods through the Kubernetes API server,
with your kubeconfig, as kubectl does. It needs the rights kubectl port-forward
(ssh, vnc) and kubectl exec (virsh, diag) need on the pod.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildinfo.Version(), // --version: this client's
	}
	root.SetVersionTemplate("{{.DisplayName}} {{.Version}}\n")
	k.addFlags(root)
	root.AddCommand(newSSH(k, name), newVNC(k, name), newVirsh(k, name), newStatus(k, name), newDiag(k, name), newGen(name), newValidate(k, name), newVersion(k, name), newInstall(name), newMigrate(k, name))
	root.AddCommand(newPower(k, name)...)
	return root
}
