package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/virtlet/virtlet/adapters/vmtools"
)

func newStatus(k *kube, name string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status POD",
		Short: "Show a VM pod's VM and what its guest agent says of the guest",
		Long: `status shows the VM of a VM pod: its state, how long it has run, its vCPUs
and memory, and, from the guest's qemu-guest-agent, the guest's OS, kernel,
host name, time zone and network interfaces with their addresses. It asks
the node's daemon through the pod's exec subresource: you need the right to
exec into the pod. A guest without an agent shows why it says nothing.`,
		Example: "  " + name + " status my-vm\n  " + name + " status my-vm --json",
		Args:    cobra.ExactArgs(1),
		RunE: k.onVMPod(func(ctx context.Context, pod *corev1.Pod, args []string) error {
			var out, errOut bytes.Buffer
			if err := k.exec(ctx, pod, []string{vmtools.Status}, nil, &out, &errOut); err != nil {
				return fmt.Errorf("status of %s: %w %s", args[0], err, strings.TrimSpace(errOut.String()))
			}
			if asJSON {
				_, err := os.Stdout.Write(out.Bytes())
				return err
			}
			var st vmtools.VMStatus
			if err := json.Unmarshal(out.Bytes(), &st); err != nil {
				return fmt.Errorf("status of %s: the daemon's answer: %w", args[0], err)
			}
			return printStatus(os.Stdout, st, time.Now())
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the daemon's JSON answer")
	return cmd
}

// printStatus writes st for people.
func printStatus(w io.Writer, st vmtools.VMStatus, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	state := st.State
	switch {
	case st.State == "running" && !st.StartedAt.IsZero():
		state += fmt.Sprintf(" for %s (since %s)", now.Sub(st.StartedAt).Round(time.Second), st.StartedAt.UTC().Format(time.RFC3339))
	case st.State == "halted" && !st.HaltedAt.IsZero():
		state += fmt.Sprintf(" for %s (since %s; the pod and disks are kept: start boots it)", now.Sub(st.HaltedAt).Round(time.Second), st.HaltedAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "Pod:\t%s\n", st.Pod)
	fmt.Fprintf(tw, "VM:\t%s\n", st.VM)
	fmt.Fprintf(tw, "State:\t%s\n", state)
	fmt.Fprintf(tw, "vCPUs:\t%d\n", st.VCPUs)
	fmt.Fprintf(tw, "Memory:\t%d MiB\n", st.MemoryBytes>>20)
	if g := st.Guest; g != nil {
		system := g.OS
		if g.Kernel != "" {
			system = strings.TrimSpace(system + " (kernel " + g.Kernel + ")")
		}
		fmt.Fprintf(tw, "Guest OS:\t%s\n", orUnknown(system))
		fmt.Fprintf(tw, "Hostname:\t%s\n", orUnknown(g.Hostname))
		fmt.Fprintf(tw, "Time zone:\t%s\n", orUnknown(g.TimeZone))
		for i, iface := range g.Interfaces {
			label := ""
			if i == 0 {
				label = "Interfaces:"
			}
			fmt.Fprintf(tw, "%s\t%s %s %s\n", label, iface.Name, iface.MAC, strings.Join(iface.Addresses, " "))
		}
	} else {
		fmt.Fprintf(tw, "Guest:\tno answer: %s\n", st.GuestError)
	}
	return tw.Flush()
}

func orUnknown(s string) string {
	if s == "" {
		return "(not reported)"
	}
	return s
}
