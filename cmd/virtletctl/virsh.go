package main

import (
	"context"
	"errors"
	"os"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/exec"

	"github.com/virtlet/virtlet/adapters/vmtools"
)

func newVirsh(k *kube, name string) *cobra.Command {
	return &cobra.Command{
		Use:   "virsh POD -- VIRSH-COMMAND [ARGS...]",
		Short: "Run a read-only virsh command against a VM pod's domain",
		Long: `virsh runs one virsh command that only reads (dominfo, dumpxml, domstats,
domblklist, domiflist, dommemstat, vcpuinfo, ...) against the VM pod's
libvirt domain on its node, on a read-only connection; the daemon adds the
domain name. Commands that change anything, and options or arguments
that could reach another domain, are refused. It goes through
the pod's exec subresource: you need the right to exec into the pod.`,
		Example: "  " + name + " virsh my-vm -- dominfo\n  " + name + " virsh my-vm -- dumpxml",
		Args:    cobra.MinimumNArgs(2),
		RunE: k.onVMPod(func(ctx context.Context, pod *corev1.Pod, args []string) error {
			err := k.exec(ctx, pod, append([]string{vmtools.Virsh}, args[1:]...), nil, os.Stdout, os.Stderr)
			var ee exec.CodeExitError
			if errors.As(err, &ee) {
				return exitError{ee.Code}
			}
			return err
		}),
	}
}
