package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/client-go/util/exec"

	"github.com/virtlet/virtlet/adapters/vmtools"
)

func newVirsh(k *kube, name string) *cobra.Command {
	return &cobra.Command{
		Use:   "virsh POD -- VIRSH-COMMAND [ARGS...] | virsh VIRSH-COMMAND @POD [ARGS...]",
		Short: "Run a read-only virsh command against a VM pod's domain",
		Long: `virsh runs one virsh command that only reads (dominfo, dumpxml, domstats,
domblklist, domiflist, dommemstat, vcpuinfo, ...) against the VM pod's
libvirt domain on its node, on a read-only connection; the daemon adds the
domain name. The pod comes first, or anywhere as @POD in Virtlet's way;
virsh's own options go after -- (virsh -- dumpxml @my-vm --inactive).
Commands that change anything, and options or arguments that could reach
another domain, are refused. It goes through the pod's exec subresource:
you need the right to exec into the pod.`,
		Example: "  " + name + " virsh my-vm -- dominfo\n  " + name + " virsh dumpxml @my-vm\n  " + name + " virsh -- dumpxml @my-vm --inactive",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			podName, virshArgs, err := virshTarget(args)
			if err != nil {
				return err
			}
			pod, err := k.vmPod(cmd.Context(), podName)
			if err != nil {
				return err
			}
			err = k.exec(cmd.Context(), pod, append([]string{vmtools.Virsh}, virshArgs...), nil, os.Stdout, os.Stderr)
			var ee exec.CodeExitError
			if errors.As(err, &ee) {
				return exitError{ee.Code}
			}
			return err
		},
	}
}

// virshTarget splits virsh's arguments into the pod and the virsh
// command: the one @POD argument names the pod (Virtlet's form: virsh
// dumpxml @my-vm), else the first argument does (virsh my-vm -- dumpxml).
func virshTarget(args []string) (string, []string, error) {
	pod, rest := "", []string{}
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "@"); ok {
			if pod != "" {
				return "", nil, fmt.Errorf("virsh reaches one pod's domain: @%s and %s", pod, a)
			}
			if name == "" {
				return "", nil, fmt.Errorf("@ names no pod: write @POD")
			}
			pod = name
			continue
		}
		rest = append(rest, a)
	}
	if pod == "" {
		return args[0], args[1:], nil
	}
	return pod, rest, nil
}
