package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
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
the ReplicaSet's pod-template-hash label while the VM moves, so that the
ReplicaSet does not count it; once the VM is in it, it gets the label,
the source pod goes, and the ReplicaSet adopts the receiving pod. A StatefulSet's, a
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
	lost := err != nil && !strings.Contains(err.Error(), "live migration") && k.migratedAway(ctx, pod)
	if err != nil && !lost {
		// The VM runs on where it was; the receiving pod goes.
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := k.client.CoreV1().Pods(pod.Namespace).Delete(cleanup, created.Name, metav1.DeleteOptions{}); derr != nil {
			fmt.Fprintf(os.Stderr, "delete the receiving pod %s: %v\n", created.Name, derr)
		}
		return fmt.Errorf("migrate %s to %s: %w %s (the VM runs on in %s; the receiving pod %s is deleted)", id, to, err, strings.TrimSpace(errOut.String()), id, created.Name)
	}
	if lost {
		fmt.Fprintf(os.Stderr, "the migration's answer was lost (%v), but the source container ended Migrated\n", err)
	}
	// The VM is in the receiving pod: what is left has its own time, not
	// what the migration left of --timeout.
	after, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	if err := k.handOver(after, pod, created, held); err != nil {
		return fmt.Errorf("the VM of %s moved to %s/%s on %s: %w", id, created.Namespace, created.Name, to, err)
	}
	if lost {
		fmt.Printf("%s's VM runs in pod %s on node %s (its figures were lost with the answer)\n", id, created.Name, to)
		return nil
	}
	var st ports.MigrationStats
	if err := json.Unmarshal([]byte(out.String()), &st); err != nil {
		return fmt.Errorf("the VM of %s moved to %s/%s on %s, but the daemon's figures: %w", id, created.Namespace, created.Name, to, err)
	}
	paused := st.Downtime.String()
	if st.PausedThroughout {
		paused += " (the whole copy: a TCG guest is not copied live)"
	}
	fmt.Printf("%s's VM runs in pod %s on node %s: took %s, guest paused %s, %d MiB of memory and %d MiB of disk copied\n",
		id, created.Name, to, st.Total.Round(time.Millisecond), paused, st.MemoryBytes>>20, st.DiskBytes>>20)
	return nil
}

// receivingPod is the source pod's twin on node to, receiving its VM,
// without the labels held back from it. A ReplicaSet's pod's twin names
// the ReplicaSet as an owner, not as its controller: the garbage
// collector removes it with the ReplicaSet, and the ReplicaSet may adopt
// it once it has the labels.
func receivingPod(pod *corev1.Pod, to, from string, held map[string]string) *corev1.Pod {
	name := pod.Name
	var owners []metav1.OwnerReference
	if owner := metav1.GetControllerOf(pod); owner != nil && len(held) > 0 {
		name = owner.Name // named as its ReplicaSet names its pods
		owners = []metav1.OwnerReference{{APIVersion: owner.APIVersion, Kind: owner.Kind, Name: owner.Name, UID: owner.UID}}
	}
	recv := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: name + "-", Namespace: pod.Namespace,
			Labels: map[string]string{}, Annotations: map[string]string{},
			OwnerReferences: owners,
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

// heldLabels is the label the receiving pod of a ReplicaSet's pod gets
// only once the VM is in it: one its ReplicaSet selects its pods by, so
// that the ReplicaSet neither counts the receiving pod while the VM moves
// (and deletes one of the two as a surplus replica) nor loses its pod if
// the migration fails. A Deployment's ReplicaSet's pod-template-hash is
// the one held back: the receiving pod keeps the labels Services,
// NetworkPolicies and PodDisruptionBudgets select it by. A bare pod holds
// none back; a pod of another controller is refused.
func (k *kube) heldLabels(ctx context.Context, pod *corev1.Pod) (map[string]string, error) {
	id := pod.Namespace + "/" + pod.Name
	owner := metav1.GetControllerOf(pod)
	if owner == nil {
		return nil, nil
	}
	if owner.Kind != "ReplicaSet" || !strings.HasPrefix(owner.APIVersion, "apps/") {
		return nil, fmt.Errorf("pod %s is managed by %s %s: only a bare pod or a ReplicaSet's (a Deployment's) can migrate; a StatefulSet's, a DaemonSet's or a Job's pod has its name or node as its identity", id, owner.Kind, owner.Name)
	}
	rs, err := k.liveReplicaSet(ctx, pod.Namespace, owner)
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", id, err)
	}
	selector, err := metav1.LabelSelectorAsSelector(rs.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("pod %s: ReplicaSet %s's selector: %w", id, rs.Name, err)
	}
	if !selector.Matches(labels.Set(pod.Labels)) {
		return nil, fmt.Errorf("pod %s: ReplicaSet %s's selector %q does not match it (the ReplicaSet is releasing it)", id, rs.Name, selector)
	}
	keys := slices.Sorted(maps.Keys(rs.Spec.Selector.MatchLabels))
	if i := slices.Index(keys, appsv1.DefaultDeploymentUniqueLabelKey); i > 0 {
		keys[0], keys[i] = keys[i], keys[0]
	}
	for _, key := range keys {
		rest := labels.Set{}
		for k, v := range pod.Labels {
			if k != key {
				rest[k] = v
			}
		}
		if !selector.Matches(rest) {
			return map[string]string{key: pod.Labels[key]}, nil
		}
	}
	return nil, fmt.Errorf("pod %s: ReplicaSet %s's selector %q has no matchLabels key whose absence hides its receiving pod: the ReplicaSet would count it as a surplus replica", id, rs.Name, selector)
}

// liveReplicaSet is the ReplicaSet owner names, if it is still that one
// (its UID) and not being deleted.
func (k *kube) liveReplicaSet(ctx context.Context, namespace string, owner *metav1.OwnerReference) (*appsv1.ReplicaSet, error) {
	rs, err := k.client.AppsV1().ReplicaSets(namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("its ReplicaSet: %w", err)
	}
	if rs.UID != owner.UID || rs.DeletionTimestamp != nil || rs.Spec.Selector == nil {
		return nil, fmt.Errorf("its ReplicaSet %s is gone, being deleted or without a selector", owner.Name)
	}
	return rs, nil
}

// handOver makes the receiving pod recv, which holds the VM now, the VM's
// pod: a bare source pod is deleted; a ReplicaSet's source pod gets the
// lowest deletion cost, and once recv cannot rank before it in the
// ReplicaSet's scale-down, recv gets the labels held back, the source pod
// is deleted, and the ReplicaSet adopts recv (an orphan it selects). The
// ReplicaSet sees recv's labels before the source pod's deletion (one
// watch, in order), so it never counts one replica too few.
func (k *kube) handOver(ctx context.Context, pod, recv *corev1.Pod, held map[string]string) error {
	if len(held) == 0 {
		return k.deleteSource(ctx, pod)
	}
	owner := metav1.GetControllerOf(pod)
	var give []string
	for k, v := range held {
		give = append(give, k+"="+v)
	}
	hint := fmt.Sprintf("the receiving pod holds the VM: give it its labels with `kubectl label pod -n %s %s %s` and delete %s", pod.Namespace, recv.Name, strings.Join(give, " "), pod.Name)
	pods := k.client.CoreV1().Pods(pod.Namespace)
	cost, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{podDeletionCost: strconv.Itoa(math.MinInt32)}}})
	if _, err := pods.Patch(ctx, pod.Name, types.MergePatchType, cost, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("mark the source pod %s to go first: %w (%s)", pod.Name, err, hint)
	}
	// The ReplicaSet ranks a pod that is not Running, then one that is
	// not Ready, before the deletion cost: the receiving pod must not rank
	// first by kubelet's yet stale statuses.
	if err := k.waitRanksAfter(ctx, pod.Namespace, recv.Name, pod.Name); err != nil {
		return fmt.Errorf("%w (%s)", err, hint)
	}
	if _, err := k.liveReplicaSet(ctx, pod.Namespace, owner); err != nil {
		return fmt.Errorf("%w: the receiving pod %s keeps the VM without a controller; delete it to stop the VM", err, recv.Name)
	}
	join, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": held}})
	if _, err := pods.Patch(ctx, recv.Name, types.MergePatchType, join, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("give the receiving pod %s its ReplicaSet's labels: %w (%s)", recv.Name, err, hint)
	}
	if err := k.deleteSource(ctx, pod); err != nil {
		return fmt.Errorf("delete the source pod %s: %w", pod.Name, err)
	}
	for {
		p, err := pods.Get(ctx, recv.Name, metav1.GetOptions{})
		switch {
		case err == nil && p.DeletionTimestamp != nil:
			return fmt.Errorf("the receiving pod %s, holding the VM, is being deleted", recv.Name)
		case err == nil:
			if ref := metav1.GetControllerOf(p); ref != nil && ref.UID == owner.UID {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s %s did not adopt the receiving pod %s: %w", owner.Kind, owner.Name, recv.Name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitRanksAfter waits until the pod named keep ranks after the pod named
// drop in a ReplicaSet's scale-down before their deletion costs: it is
// Running, and Ready unless drop is not Ready either (drop gone: Ready,
// for the ReplicaSet may have replaced it).
func (k *kube) waitRanksAfter(ctx context.Context, namespace, keep, drop string) error {
	pods := k.client.CoreV1().Pods(namespace)
	deadline := time.Now().Add(2 * time.Minute)
	why := "is not known yet"
	for time.Now().Before(deadline) {
		kept, err := pods.Get(ctx, keep, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("the receiving pod %s: %w", keep, err)
		}
		dropReady := true
		if dropped, err := pods.Get(ctx, drop, metav1.GetOptions{}); err == nil {
			dropReady = podReady(dropped)
		} else if !apierrors.IsNotFound(err) {
			return fmt.Errorf("the source pod %s: %w", drop, err)
		}
		switch {
		case kept.Status.Phase != corev1.PodRunning:
			why = fmt.Sprintf("is not Running (%q)", kept.Status.Phase)
		case !podReady(kept) && dropReady:
			why = "is not Ready, and the source pod is Ready or gone"
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
			// kubelet restarts the container (refused: the VM moved) and
			// keeps the Migrated end as its last state.
			for _, cs := range p.Status.ContainerStatuses {
				for _, t := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
					if t != nil && t.Reason == ports.ReasonMigrated {
						return true
					}
				}
			}
		}
		time.Sleep(time.Second)
	}
	return false
}
