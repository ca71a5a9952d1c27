package main

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/virtlet/virtlet/core/annotations"
)

func TestHeldLabelsOfAControllersPod(t *testing.T) {
	rs := func(sel *metav1.LabelSelector) *appsv1.ReplicaSet {
		return &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: "web-5d8f", Namespace: "default", UID: "rs-uid"},
			Spec:       appsv1.ReplicaSetSpec{Selector: sel},
		}
	}
	owned := func(kind, apiVersion, uid string) *corev1.Pod {
		yes := true
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: "web-5d8f-abcde", Namespace: "default",
			Labels: map[string]string{"app": "web", "pod-template-hash": "5d8f", "tier": "vm"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: apiVersion, Kind: kind, Name: "web-5d8f", UID: types.UID(uid), Controller: &yes,
			}},
		}}
	}
	for _, tt := range []struct {
		name string
		rs   *appsv1.ReplicaSet
		pod  *corev1.Pod
		held map[string]string
		err  string
	}{
		{name: "bare pod", pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "default", Labels: map[string]string{"app": "vm"}}}},
		{
			name: "a Deployment's ReplicaSet: its pod-template-hash only",
			rs:   rs(&metav1.LabelSelector{MatchLabels: map[string]string{"app": "web", "pod-template-hash": "5d8f"}}),
			pod:  owned("ReplicaSet", "apps/v1", "rs-uid"),
			held: map[string]string{"pod-template-hash": "5d8f"},
		},
		{
			name: "a ReplicaSet of its own: one matchLabels key",
			rs: rs(&metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}, MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "tier", Operator: metav1.LabelSelectorOpExists},
			}}),
			pod:  owned("ReplicaSet", "apps/v1", "rs-uid"),
			held: map[string]string{"app": "web"},
		},
		{
			name: "a pod its ReplicaSet no longer selects",
			rs:   rs(&metav1.LabelSelector{MatchLabels: map[string]string{"app": "other"}}),
			pod:  owned("ReplicaSet", "apps/v1", "rs-uid"),
			err:  "does not match it",
		},
		{
			name: "a selector that matches without its matchLabels",
			rs: rs(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "tier", Operator: metav1.LabelSelectorOpExists},
			}}),
			pod: owned("ReplicaSet", "apps/v1", "rs-uid"),
			err: "has no matchLabels key whose absence hides its receiving pod",
		},
		{
			name: "a ReplicaSet replaced under the same name",
			rs:   rs(&metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}),
			pod:  owned("ReplicaSet", "apps/v1", "other-uid"),
			err:  "is gone",
		},
		{name: "a StatefulSet's pod", pod: owned("StatefulSet", "apps/v1", "ss-uid"), err: "managed by StatefulSet web-5d8f: only a bare pod or a ReplicaSet's"},
		{name: "a Job's pod", pod: owned("Job", "batch/v1", "job-uid"), err: "managed by Job web-5d8f"},
		{name: "a missing ReplicaSet", pod: owned("ReplicaSet", "apps/v1", "rs-uid"), err: "its ReplicaSet"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewSimpleClientset()
			if tt.rs != nil {
				client = fake.NewSimpleClientset(tt.rs)
			}
			k := &kube{client: client}
			held, err := k.heldLabels(context.Background(), tt.pod)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(held) != len(tt.held) {
				t.Fatalf("held %v, want %v", held, tt.held)
			}
			for k, v := range tt.held {
				if held[k] != v {
					t.Fatalf("held %v, want %v", held, tt.held)
				}
			}
			// The receiving pod has the pod's labels but those held back,
			// the ReplicaSet as an owner but not its controller, and the
			// annotation naming the VM.
			recv := receivingPod(tt.pod, "node-2", `{"pod":"x"}`, held)
			if recv.Spec.NodeName != "node-2" || recv.Annotations[annotations.MigrateFrom] != `{"pod":"x"}` || metav1.GetControllerOf(recv) != nil {
				t.Fatalf("receiving pod: owners %v, node %q, annotations %v", recv.OwnerReferences, recv.Spec.NodeName, recv.Annotations)
			}
			if owners := recv.OwnerReferences; len(held) > 0 != (len(owners) == 1 && owners[0].UID == "rs-uid" && owners[0].Kind == "ReplicaSet") {
				t.Fatalf("receiving pod's owners %v (held back %v)", owners, held)
			}
			want := tt.pod.Name + "-"
			if len(held) > 0 {
				want = "web-5d8f-" // as its ReplicaSet names its pods
			}
			if recv.GenerateName != want {
				t.Fatalf("receiving pod named %q, want %q", recv.GenerateName, want)
			}
			for k, v := range tt.pod.Labels {
				_, isHeld := held[k]
				if got, ok := recv.Labels[k]; ok == isHeld || (ok && got != v) {
					t.Fatalf("receiving pod's labels %v (the pod's %v, held back %v)", recv.Labels, tt.pod.Labels, held)
				}
			}
		})
	}
}

// The receiving pod gets its labels only once it cannot rank before the
// source pod in its ReplicaSet's scale-down.
func TestWaitRanksAfter(t *testing.T) {
	pod := func(name string, phase corev1.PodPhase, ready bool) *corev1.Pod {
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Status:     corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
		}
	}
	for _, tt := range []struct {
		name       string
		recv, src  *corev1.Pod
		rankedLast bool
	}{
		{"receiving pod Ready", pod("recv", corev1.PodRunning, true), pod("src", corev1.PodRunning, true), true},
		{"neither Ready", pod("recv", corev1.PodRunning, false), pod("src", corev1.PodRunning, false), true},
		{"source gone, receiving pod Ready", pod("recv", corev1.PodRunning, true), nil, true},
		{"source gone, receiving pod not Ready yet", pod("recv", corev1.PodRunning, false), nil, false},
		{"receiving pod not Ready yet, the source still Ready", pod("recv", corev1.PodRunning, false), pod("src", corev1.PodRunning, true), false},
		{"receiving pod Pending", pod("recv", corev1.PodPending, false), pod("src", corev1.PodRunning, false), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewSimpleClientset(tt.recv)
			if tt.src != nil {
				client = fake.NewSimpleClientset(tt.recv, tt.src)
			}
			k := &kube{client: client}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err := k.waitRanksAfter(ctx, "default", "recv", "src")
			if tt.rankedLast && err != nil {
				t.Fatalf("waitRanksAfter: %v", err)
			}
			if !tt.rankedLast && (err == nil || !strings.Contains(err.Error(), "the receiving pod recv is not")) {
				t.Fatalf("waitRanksAfter: %v, want the receiving pod's rank named", err)
			}
		})
	}
}

// handOver, for a ReplicaSet's pod: the source pod's deletion cost first,
// then the receiving pod's labels, then the source pod's deletion, then
// the ReplicaSet's adoption (played here by a reactor).
func TestHandOverToAReplicaSet(t *testing.T) {
	yes := true
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web-5d8f", Namespace: "default", UID: "rs-uid"},
		Spec:       appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web", "pod-template-hash": "5d8f"}}},
	}
	running := corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	src := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-5d8f-abcde", Namespace: "default",
		Labels:          map[string]string{"app": "web", "pod-template-hash": "5d8f"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f", UID: "rs-uid", Controller: &yes}}},
		Status: running}
	held := map[string]string{"pod-template-hash": "5d8f"}
	recv := receivingPod(src, "node-2", "{}", held)
	recv.Name, recv.Status = "web-5d8f-xyz12", running
	client := fake.NewSimpleClientset(rs, src, recv)
	var steps []string
	client.PrependReactor("*", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch a := a.(type) {
		case k8stesting.PatchAction:
			steps = append(steps, "patch "+a.GetName()+" "+string(a.GetPatch()))
		case k8stesting.DeleteAction:
			steps = append(steps, "delete "+a.GetName())
			// The ReplicaSet adopts the receiving pod, which it selects now.
			p, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), "default", recv.Name)
			if err != nil {
				t.Error(err)
				return false, nil, nil
			}
			adopted := p.(*corev1.Pod).DeepCopy()
			adopted.OwnerReferences[0].Controller = &yes
			if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), adopted, "default"); err != nil {
				t.Error(err)
			}
		}
		return false, nil, nil
	})
	k := &kube{client: client}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := k.handOver(ctx, src, recv, held); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`patch web-5d8f-abcde {"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"-2147483648"}}}`,
		`patch web-5d8f-xyz12 {"metadata":{"labels":{"pod-template-hash":"5d8f"}}}`,
		"delete web-5d8f-abcde",
	}
	if strings.Join(steps, "\n") != strings.Join(want, "\n") {
		t.Fatalf("steps:\n%s\nwant:\n%s", strings.Join(steps, "\n"), strings.Join(want, "\n"))
	}
	if _, err := client.CoreV1().Pods("default").Get(ctx, src.Name, metav1.GetOptions{}); err == nil {
		t.Fatal("the source pod is still there")
	}
	got, _ := client.CoreV1().Pods("default").Get(ctx, recv.Name, metav1.GetOptions{})
	if got.Labels["pod-template-hash"] != "5d8f" || got.Labels["app"] != "web" {
		t.Fatalf("the receiving pod's labels: %v", got.Labels)
	}

	// A ReplicaSet deleted while the VM moved: the labels are not given,
	// and the error says the VM has no controller.
	client = fake.NewSimpleClientset(src, recv)
	k = &kube{client: client}
	err := k.handOver(ctx, src, recv, held)
	if err == nil || !strings.Contains(err.Error(), "keeps the VM without a controller") {
		t.Fatalf("handOver without the ReplicaSet: %v", err)
	}
	if got, _ := client.CoreV1().Pods("default").Get(ctx, recv.Name, metav1.GetOptions{}); got.Labels["pod-template-hash"] != "" {
		t.Fatalf("the receiving pod got the label of a ReplicaSet that is gone: %v", got.Labels)
	}
}
