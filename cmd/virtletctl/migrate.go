package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// newMigrate is `virtletctl migrate POD --to NODE`: a live migration of a
// VM pod's VM to another node, in a receiving pod there (docs/migration.md).
func newMigrate(k *kube, name string) *cobra.Command {
	var to string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "migrate POD --to NODE",
		Short: "Move a VM pod's running VM to another node, live",
		Long: `migrate moves the running VM of a VM pod to another node without stopping
its guest: its processes, memory and uptime continue there.

It creates a receiving pod on NODE: the pod's spec, labels and annotations,
named after it, with the annotation VirtletMigrateFrom naming the VM. The
pod's node's daemon then copies the VM's root disk and memory to NODE's
daemon while the guest runs (mutual TLS between the daemons), pauses it for
the last of it, and the guest resumes in the receiving pod, which takes a
new IP address of NODE's (the guest is made to ask for it at once). The
source pod's container ends with reason Migrated, and migrate deletes that
pod. If the migration fails, the VM runs on where it was and migrate
deletes the receiving pod.

It needs the rights to exec into the pod, to create and delete pods in its
namespace, and to read nodes. A pod a controller owns (a ReplicaSet's, a
StatefulSet's) is refused for now: its controller would count the
receiving pod as a surplus replica.`,
		Example: "  " + name + " migrate my-vm --to node-2",
		Args:    cobra.ExactArgs(1),
		RunE: k.onVMPod(func(ctx context.Context, pod *corev1.Pod, args []string) error {
			if to == "" {
				return fmt.Errorf("--to NODE is required")
			}
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return k.migrate(ctx, pod, to)
		}),
	}
	cmd.Flags().StringVar(&to, "to", "", "the node to move the VM to")
	cmd.Flags().DurationVar(&timeout, "timeout", 15*time.Minute, "how long the whole migration may take")
	return cmd
}

func (k *kube) migrate(ctx context.Context, pod *corev1.Pod, to string) error {
	id := pod.Namespace + "/" + pod.Name
	if owner := metav1.GetControllerOf(pod); owner != nil {
		return fmt.Errorf("pod %s is managed by %s %s: migrating a controller's pod is not supported yet (its controller would delete the receiving pod as a surplus replica)", id, owner.Kind, owner.Name)
	}
	if pod.Spec.NodeName == to {
		return fmt.Errorf("pod %s runs on node %s already", id, to)
	}
	node, err := k.client.CoreV1().Nodes().Get(ctx, to, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", to, err)
	}
	address := ""
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && address == "" {
			address = a.Address
		}
	}
	if address == "" {
		return fmt.Errorf("node %s has no InternalIP address to reach its daemon at", to)
	}
	// What the receiving pod's daemon needs of the VM.
	var out, errOut strings.Builder
	if err := k.exec(ctx, pod, []string{vmtools.MigrationSource}, nil, &out, &errOut); err != nil {
		return fmt.Errorf("migrate %s: %w %s", id, err, strings.TrimSpace(errOut.String()))
	}
	var src annotations.MigrationSource
	if err := json.Unmarshal([]byte(out.String()), &src); err != nil {
		return fmt.Errorf("migrate %s: the daemon's answer: %w", id, err)
	}
	src.Node = pod.Spec.NodeName
	from, err := json.Marshal(src)
	if err != nil {
		return err
	}
	recv := receivingPod(pod, to, string(from))
	created, err := k.client.CoreV1().Pods(pod.Namespace).Create(ctx, recv, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("migrate %s: create the receiving pod on %s: %w", id, to, err)
	}
	fmt.Fprintf(os.Stderr, "receiving pod %s/%s created on node %s; migrating\n", created.Namespace, created.Name, to)
	out.Reset()
	errOut.Reset()
	err = k.exec(ctx, pod, []string{vmtools.Migrate, string(created.UID), to, address}, nil, &out, &errOut)
	// A failure the daemon reported names the migration; any other (the
	// exec's stream broke) may have come after the guest moved: the
	// source container then ends Migrated, and the receiving pod must stay.
	if err != nil && !strings.Contains(err.Error(), "live migration") && k.migratedAway(ctx, pod) {
		fmt.Fprintf(os.Stderr, "the migration's answer was lost (%v), but the source container ended Migrated\n", err)
		if derr := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); derr != nil {
			return fmt.Errorf("the VM of %s moved to %s/%s on %s; deleting the source pod: %w", id, created.Namespace, created.Name, to, derr)
		}
		fmt.Printf("%s's VM runs in pod %s on node %s (its figures were lost with the answer)\n", id, created.Name, to)
		return nil
	}
	if err != nil {
		// The VM runs on where it was; the receiving pod goes.
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := k.client.CoreV1().Pods(pod.Namespace).Delete(cleanup, created.Name, metav1.DeleteOptions{}); derr != nil {
			fmt.Fprintf(os.Stderr, "delete the receiving pod %s: %v\n", created.Name, derr)
		}
		return fmt.Errorf("migrate %s to %s: %w %s (the VM runs on in %s; the receiving pod %s is deleted)", id, to, err, strings.TrimSpace(errOut.String()), id, created.Name)
	}
	var st ports.MigrationStats
	if err := json.Unmarshal([]byte(out.String()), &st); err != nil {
		return fmt.Errorf("migrate %s: the daemon's figures: %w", id, err)
	}
	if err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("the VM of %s moved to %s/%s on %s; deleting the source pod: %w", id, created.Namespace, created.Name, to, err)
	}
	fmt.Printf("%s's VM runs in pod %s on node %s: took %s, guest paused %s, %d MiB of memory and %d MiB of disk copied\n",
		id, created.Name, to, st.Total.Round(time.Millisecond), st.Downtime, st.MemoryBytes>>20, st.DiskBytes>>20)
	return nil
}

// receivingPod is the source pod's twin on node to, receiving its VM.
func receivingPod(pod *corev1.Pod, to, from string) *corev1.Pod {
	recv := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: pod.Name + "-", Namespace: pod.Namespace,
			Labels: pod.Labels, Annotations: map[string]string{},
		},
		Spec: *pod.Spec.DeepCopy(),
	}
	for k, v := range pod.Annotations {
		if k != corev1.LastAppliedConfigAnnotation {
			recv.Annotations[k] = v
		}
	}
	recv.Annotations[annotations.MigrateFrom] = from
	recv.Spec.NodeName = to
	return recv
}

// migratedAway reports whether pod's container ended with reason Migrated
// (kubelet reports it within a few seconds).
func (k *kube) migratedAway(ctx context.Context, pod *corev1.Pod) bool {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		p, err := k.client.CoreV1().Pods(pod.Namespace).Get(context.WithoutCancel(ctx), pod.Name, metav1.GetOptions{})
		if err == nil {
			for _, cs := range p.Status.ContainerStatuses {
				if t := cs.State.Terminated; t != nil && t.Reason == ports.ReasonMigrated {
					return true
				}
			}
		}
		time.Sleep(time.Second)
	}
	return false
}
