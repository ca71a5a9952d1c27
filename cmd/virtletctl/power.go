package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/virtlet/virtlet/adapters/vmtools"
)

// Power commands: a VM pod's VM stopped, started or restarted in place,
// its pod, container and disks kept (KubeVirt's run strategies, README
// "Run strategies").
func newPower(k *kube, name string) []*cobra.Command {
	type power struct {
		use, short, long, command string
		grace                     bool
	}
	powers := []power{
		{"stop POD", "Halt a VM pod's VM and keep its pod, container and disks",
			`stop shuts the VM of a VM pod down (the ACPI power button, then forced off
after the grace period) and keeps it halted: the pod, its container, its IP
addresses and the VM's disks stay, whatever its root file system is, and
kubelet does not restart it (its container stays running; exec, attach,
port-forward and stats say the VM is halted, and readiness probes fail).
"start" boots the same VM again.`, vmtools.Stop, true},
		{"start POD", "Boot a VM pod's halted VM", `start boots the halted VM of a VM pod (see "stop") from the same disks.`, vmtools.Start, false},
		{"restart POD", "Power-cycle a VM pod's VM in place",
			`restart stops the VM of a VM pod (the ACPI power button, then forced off after
the grace period) and boots it again from the same disks, in the same pod
and container (kubelet's restart count does not change). A halted VM is just
started.`, vmtools.Restart, true},
	}
	var cmds []*cobra.Command
	for _, p := range powers {
		var grace time.Duration
		cmd := &cobra.Command{
			Use: p.use, Short: p.short,
			Long:    p.long + "\nIt asks the node's daemon through the pod's exec subresource: you need the right to exec into the pod.",
			Example: "  " + name + " " + strings.Fields(p.use)[0] + " my-vm",
			Args:    cobra.ExactArgs(1),
			RunE: k.onVMPod(func(ctx context.Context, pod *corev1.Pod, args []string) error {
				argv := []string{p.command}
				if p.grace {
					if grace < 0 {
						return fmt.Errorf("--grace-period %s: want 0 or more", grace)
					}
					argv = append(argv, strconv.Itoa(int(grace.Round(time.Second)/time.Second)))
				}
				var errOut strings.Builder
				if err := k.exec(ctx, pod, argv, nil, os.Stdout, &errOut); err != nil {
					return fmt.Errorf("%s %s: %w %s", strings.Fields(p.use)[0], args[0], err, strings.TrimSpace(errOut.String()))
				}
				return nil
			}),
		}
		if p.grace {
			cmd.Flags().DurationVar(&grace, "grace-period", vmtools.DefaultGracePeriod, "how long the guest may take to shut down before the VM is forced off (whole seconds)")
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}
