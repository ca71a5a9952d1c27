package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// kubelet's eviction manager treats VM pods as it treats containers: under
// memory pressure it evicts first the pod whose usage most exceeds its
// request, and it reads a VM pod's usage as what its QEMU holds (the
// daemon's PodSandboxStats, with PodAndContainerStatsFromCRI). Two tiny
// VM pods: "hog", whose guest holds 500 MiB against a 320 MiB request,
// and "quiet", under its 256 MiB request. Kubelet ranks first the pods
// over their requests, then by usage less request: seeing both pods at
// about zero, as it would without the VMs' figures, it would evict quiet
// first (0 − 256 Mi ranks above 0 − 320 Mi).
func TestKubeletEvictsTheVMPodThatUsesMost(t *testing.T) {
	parallel(t)
	kubeBin, err := harness.KubeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 88})
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(plugins(), tn.Plugin(bins)))
	d.Translate("test-images.yaml", translation)
	d.Start()
	k := harness.StartControlPlane(t, kubeBin)
	k.FeatureGates = "{PodAndContainerStatsFromCRI: true}"
	k.StartKubelet(d)

	pod := func(name, request, limit string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  annotations: {kubernetes.io/target-runtime: virtlet.cloud}
spec:
  nodeName: %[2]s
  automountServiceAccountToken: false
  containers:
  - name: %[1]s
    image: %[3]s
    resources:
      requests: {memory: %[4]s}
      limits: {memory: %[5]s}
`, name, k.Node, tinyRef, request, limit)
	}
	manifest := filepath.Join(t.TempDir(), "pods.yaml")
	os.WriteFile(manifest, []byte(pod("hog", "320Mi", "768Mi")+"---\n"+pod("quiet", "256Mi", "256Mi")), 0o644)
	if out, err := k.Kubectl("apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply: %v %s", err, out)
	}
	t.Cleanup(func() {
		// Even after a failure, kubelet removes the pods' sandboxes (their
		// networks) before it is stopped.
		k.Kubectl("delete", "-f", manifest, "--grace-period=0", "--force", "--wait=false")
		c := d.Crictl(crictl)
		harness.EventuallyOK(2*time.Minute, func() bool {
			out, _, err := c.Run("pods", "-q")
			return err == nil && strings.TrimSpace(out) == ""
		})
	})
	if out, err := k.Kubectl("wait", "--for=condition=Ready", "pod/hog", "pod/quiet", "--timeout=5m"); err != nil {
		describe, _ := k.Kubectl("describe", "pods")
		t.Fatalf("the VM pods are not Ready: %v %s\n%s", err, out, describe)
	}
	// dd fills a 500 MiB buffer and blocks writing it to sleep, which
	// never reads: the guest holds the memory.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := k.Kubectl("exec", "hog", "--", "sh", "-c", "(dd if=/dev/zero bs=500M count=1 | sleep 3600) </dev/null >/dev/null 2>&1 & echo started")
		if err == nil && strings.Contains(out, "started") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl exec hog: %v %s", err, out)
		}
		time.Sleep(3 * time.Second)
	}
	for {
		hog, err := podSummary(k, "hog")
		if err == nil && hog.Memory.WorkingSetBytes > 500<<20 {
			quiet, _ := podSummary(k, "quiet")
			t.Logf("working sets in kubelet's summary: hog %d MiB, quiet %d MiB", hog.Memory.WorkingSetBytes>>20, quiet.Memory.WorkingSetBytes>>20)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubelet never saw hog's memory: %v %+v", err, hog)
		}
		time.Sleep(2 * time.Second)
	}

	// The node under memory pressure: every pod's memory counts. A soft
	// threshold, so that kubelet, just restarted, has every pod's figures
	// before it ranks them.
	k.RestartKubelet(map[string]string{
		"evictionSoft":              `{memory.available: "99%"}`,
		"evictionSoftGracePeriod":   `{memory.available: "30s"}`,
		"evictionMaxPodGracePeriod": "5",
	})
	deadline = time.Now().Add(4 * time.Minute)
	for {
		// The eviction events, oldest first: pod and message.
		out, _ := k.Kubectl("get", "events", "--field-selector", "reason=Evicted", "--sort-by=.lastTimestamp",
			"-o", `jsonpath={range .items[*]}{.involvedObject.name}{"\t"}{.message}{"\n"}{end}`)
		if first, msg, ok := strings.Cut(strings.Split(out, "\n")[0], "\t"); ok {
			if first != "hog" {
				t.Fatalf("kubelet evicted %s first, not hog: %s", first, msg)
			}
			if !strings.Contains(msg, "memory") || !strings.Contains(msg, "Container hog was using") {
				t.Errorf("hog's eviction does not name its memory: %q", msg)
			}
			t.Logf("hog evicted first: %s", msg)
			break
		}
		if time.Now().After(deadline) {
			var evictions []string
			for _, l := range strings.Split(k.Log("kubelet"), "\n") {
				if strings.Contains(strings.ToLower(l), "evict") {
					evictions = append(evictions, l)
				}
			}
			// kubelet ranks pods by the daemon's stats: when it did not
			// rank at all, how the daemon answered them tells why.
			var stats []string
			for _, l := range strings.Split(d.Log(), "\n") {
				if strings.Contains(l, "Stats") || strings.Contains(l, "stats") {
					stats = append(stats, l)
				}
			}
			t.Fatalf("no pod was evicted under memory pressure; kubelet's eviction log:\n%s\nthe daemon's stats calls:\n%s",
				tail(strings.Join(evictions, "\n"), 4000), tail(strings.Join(stats, "\n"), 3000))
		}
		time.Sleep(2 * time.Second)
	}
	// Deleted, the pods' VMs, sandboxes and networks go: kubelet keeps an
	// evicted pod's sandbox until then.
	if out, err := k.Kubectl("delete", "-f", manifest, "--timeout=3m"); err != nil {
		t.Fatalf("kubectl delete: %v %s", err, out)
	}
	c := d.Crictl(crictl)
	harness.Eventually(t, 3*time.Minute, "the pods' sandboxes removed", func() bool {
		out, _, err := c.Run("pods", "-q")
		return err == nil && strings.TrimSpace(out) == ""
	})
	if out := c.Must(t, "ps", "-a", "-q"); out != "" {
		t.Errorf("containers left after kubectl delete: %s", out)
	}
}
