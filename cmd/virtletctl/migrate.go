package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

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

A Deployment's pod (a ReplicaSet's) moves too: its receiving pod lacks
the labels of the ReplicaSet's selector while the VM moves, so that the
ReplicaSet does not count it; once the VM is in it, it gets them, the
ReplicaSet adopts it, and the source pod goes. A StatefulSet's, a
DaemonSet's or a Job's pod is refused: the pod's name or node is its
identity there.

It needs the rights to exec into the pod, to create, patch and delete pods
in its namespace, to read nodes, and to read ReplicaSets.`,
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
	held, err := k.heldLabels(ctx, pod)
	if err != nil {
		return err
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
	recv := receivingPod(pod, to, string(from), held)
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
		if jerr := k.joinController(ctx, pod, created, held); jerr != nil {
			return fmt.Errorf("the VM of %s moved to %s/%s on %s: %w", id, created.Namespace, created.Name, to, jerr)
		}
		if derr := k.deleteSource(ctx, pod); derr != nil {
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
	if err := k.joinController(ctx, pod, created, held); err != nil {
		return fmt.Errorf("the VM of %s moved to %s/%s on %s: %w", id, created.Namespace, created.Name, to, err)
	}
	if err := k.deleteSource(ctx, pod); err != nil {
		return fmt.Errorf("the VM of %s moved to %s/%s on %s; deleting the source pod: %w", id, created.Namespace, created.Name, to, err)
	}
	fmt.Printf("%s's VM runs in pod %s on node %s: took %s, guest paused %s, %d MiB of memory and %d MiB of disk copied\n",
		id, created.Name, to, st.Total.Round(time.Millisecond), st.Downtime, st.MemoryBytes>>20, st.DiskBytes>>20)
	return nil
}

// receivingPod is the source pod's twin on node to, receiving its VM,
// without the labels held back from it (and no owner).
func receivingPod(pod *corev1.Pod, to, from string, held map[string]string) *corev1.Pod {
	name := pod.Name
	if owner := metav1.GetControllerOf(pod); owner != nil && len(held) > 0 {
		name = owner.Name // named as its ReplicaSet names its pods
	}
	recv := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: name + "-", Namespace: pod.Namespace,
			Labels: map[string]string{}, Annotations: map[string]string{},
		},
		Spec: *pod.Spec.DeepCopy(),
	}
	for k, v := range pod.Labels {
		if _, ok := held[k]; !ok {
			recv.Labels[k] = v
		}
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

// heldLabels are the labels the receiving pod of a controller's pod may
// only have once the VM is in it: those its ReplicaSet selects its pods
// by, so that the ReplicaSet neither counts the receiving pod while the
// VM moves (and deletes one of the two as a surplus replica) nor loses
// its pod if the migration fails. A bare pod holds none back; a pod of
// another controller is refused.
func (k *kube) heldLabels(ctx context.Context, pod *corev1.Pod) (map[string]string, error) {
	id := pod.Namespace + "/" + pod.Name
	owner := metav1.GetControllerOf(pod)
	if owner == nil {
		return nil, nil
	}
	if owner.Kind != "ReplicaSet" || !strings.HasPrefix(owner.APIVersion, "apps/") {
		return nil, fmt.Errorf("pod %s is managed by %s %s: only a bare pod or a ReplicaSet's (a Deployment's) can migrate; a StatefulSet's, a DaemonSet's or a Job's pod has its name or node as its identity", id, owner.Kind, owner.Name)
	}
	rs, err := k.client.AppsV1().ReplicaSets(pod.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("pod %s: its ReplicaSet: %w", id, err)
	}
	if rs.UID != owner.UID || rs.Spec.Selector == nil {
		return nil, fmt.Errorf("pod %s: its ReplicaSet %s is gone or has no selector", id, owner.Name)
	}
	selector, err := metav1.LabelSelectorAsSelector(rs.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("pod %s: ReplicaSet %s's selector: %w", id, rs.Name, err)
	}
	held, rest := map[string]string{}, labels.Set{}
	for k, v := range pod.Labels {
		if _, ok := rs.Spec.Selector.MatchLabels[k]; ok {
			held[k] = v
		} else {
			rest[k] = v
		}
	}
	if selector.Matches(rest) {
		return nil, fmt.Errorf("pod %s: ReplicaSet %s's selector %q would match its receiving pod even without its matchLabels: the ReplicaSet would count it as a surplus replica", id, rs.Name, selector)
	}
	return held, nil
}

// joinController gives the receiving pod recv, whose VM the source pod's
// was, the labels held back from it: its ReplicaSet adopts it as an
// orphan it selects, and scales down the source pod, which ranks first
// to go (its container ended Migrated, and its deletion cost is the
// lowest).
func (k *kube) joinController(ctx context.Context, pod, recv *corev1.Pod, held map[string]string) error {
	if len(held) == 0 {
		return nil
	}
	pods := k.client.CoreV1().Pods(pod.Namespace)
	cost, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{podDeletionCost: strconv.Itoa(math.MinInt32)}}})
	if _, err := pods.Patch(ctx, pod.Name, types.MergePatchType, cost, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("mark the source pod %s to go first: %w", pod.Name, err)
	}
	// The ReplicaSet ranks a pod that is not Running, then one that is
	// not Ready, before the deletion cost: the receiving pod must not rank
	// first by kubelet's yet stale statuses.
	if err := k.waitRanksAfter(ctx, pod.Namespace, recv.Name, pod.Name); err != nil {
		return err
	}
	join, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": held}})
	if _, err := pods.Patch(ctx, recv.Name, types.MergePatchType, join, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("give the receiving pod %s its controller's labels %v (add them by hand): %w", recv.Name, held, err)
	}
	owner := metav1.GetControllerOf(pod)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		p, err := pods.Get(ctx, recv.Name, metav1.GetOptions{})
		if err == nil {
			if ref := metav1.GetControllerOf(p); ref != nil && ref.UID == owner.UID {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s %s did not adopt the receiving pod %s within a minute", owner.Kind, owner.Name, recv.Name)
}

// waitRanksAfter waits until the pod named keep ranks after the pod named
// drop in a ReplicaSet's scale-down before their deletion costs: it is
// Running, and Ready unless drop is not Ready either.
func (k *kube) waitRanksAfter(ctx context.Context, namespace, keep, drop string) error {
	pods := k.client.CoreV1().Pods(namespace)
	deadline := time.Now().Add(2 * time.Minute)
	var why string
	for time.Now().Before(deadline) {
		kept, err := pods.Get(ctx, keep, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("the receiving pod %s: %w", keep, err)
		}
		dropped, err := pods.Get(ctx, drop, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("the source pod %s: %w", drop, err)
		}
		switch {
		case kept.Status.Phase != corev1.PodRunning:
			why = "is " + string(kept.Status.Phase)
		case !podReady(kept) && podReady(dropped):
			why = "is not Ready, and the source pod still is"
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the receiving pod %s %s: %w", keep, why, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("the receiving pod %s %s after 2 minutes: its ReplicaSet would scale it down rather than the source pod %s", keep, why, drop)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podDeletionCost ranks a ReplicaSet's pods for a scale-down: the lowest
// goes first.
const podDeletionCost = "controller.kubernetes.io/pod-deletion-cost"

// deleteSource deletes the source pod, which its ReplicaSet may have
// deleted already.
func (k *kube) deleteSource(ctx context.Context, pod *corev1.Pod) error {
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
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
