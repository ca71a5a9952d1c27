package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

// make cluster-up and make cluster-down (issue 28) as a person runs them:
// up starts the test cluster in the background and prints how to reach
// it; the printed KUBECONFIG and PATH give a kubectl that sees its nodes
// Ready and runs the cluster example's VM pods, whose console kubectl
// logs shows and whose Service a VM reaches; a second up shows the
// running cluster; down stops it and leaves nothing of its run on the
// host. Two nodes, not the default three: what a third adds TestKubeCluster
// covers.
func TestMakeClusterUpAndDown(t *testing.T) {
	parallel(t)
	state := filepath.Join(t.TempDir(), "cluster")
	make := func(target string) string {
		t.Helper()
		cmd := exec.Command("make", "-s", target)
		cmd.Dir = harness.RepoRoot()
		cmd.Env = append(os.Environ(), "CLUSTER_STATE="+state, "CLUSTER_NODES=2")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make %s: %v\n%s", target, err, out)
		}
		return string(out)
	}
	down := func() string { return make("cluster-down") }
	t.Cleanup(func() {
		if _, err := os.Stat(state); err == nil {
			down()
		}
	})

	start := time.Now()
	out := make("cluster-up")
	t.Logf("make cluster-up took %s", time.Since(start).Round(time.Second))
	m := regexp.MustCompile(`export KUBECONFIG=(\S+) PATH=(\S+):\$PATH`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "the cluster is up") {
		t.Fatalf("make cluster-up printed no KUBECONFIG and PATH:\n%s", out)
	}
	b, err := os.ReadFile(filepath.Join(state, "run"))
	if err != nil {
		t.Fatal(err)
	}
	run := strings.TrimSpace(string(b))
	kubectl := func(args ...string) (string, error) {
		cmd := exec.Command("kubectl", args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+m[1], "PATH="+m[2]+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	waitFor := func(what string, timeout time.Duration, args []string, done func(string) bool) string {
		t.Helper()
		var out string
		var err error
		for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(time.Second) {
			if out, err = kubectl(args...); err == nil && done(out) {
				return out
			}
		}
		t.Fatalf("%s: not within %s: kubectl %s: %v\n%s", what, timeout, strings.Join(args, " "), err, out)
		return ""
	}
	ready := `{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`
	waitFor("both nodes Ready", 2*time.Minute, []string{"get", "nodes", "-o", "jsonpath=" + ready}, func(s string) bool {
		return s == "node-1=True\nnode-2=True"
	})

	// The example the printed instructions name.
	if out, err := kubectl("apply", "-f", filepath.Join(harness.RepoRoot(), "examples", "cluster-vms.yaml")); err != nil {
		t.Fatalf("kubectl apply -f examples/cluster-vms.yaml: %v\n%s", err, out)
	}
	podsReady := `{range .items[*]}{.spec.nodeName}:{.status.containerStatuses[0].ready}{"\n"}{end}`
	waitFor("the example's three VM pods ready on both nodes", 5*time.Minute, []string{"get", "pods", "-l", "app=vms", "-o", "jsonpath=" + podsReady}, func(s string) bool {
		lines := strings.Fields(s)
		for _, l := range lines {
			if l != "node-1:true" && l != "node-2:true" {
				return false
			}
		}
		return len(lines) == 3 && strings.Contains(s, "node-1:") && strings.Contains(s, "node-2:")
	})
	waitFor("kubectl logs deploy/vms shows the VM's console", time.Minute, []string{"logs", "deploy/vms"}, func(s string) bool {
		return strings.Contains(s, "@@TINY-READY")
	})
	ip, err := kubectl("get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil || ip == "" {
		t.Fatalf("the example's Service: %v %s", err, ip)
	}
	waitFor("a VM reaches the Service", time.Minute, []string{"exec", "deploy/vms", "--", "wget", "-q", "-O", "-", "http://" + ip + "/"}, func(s string) bool {
		return strings.HasPrefix(s, "tiny vms-")
	})

	if again := make("cluster-up"); !strings.Contains(again, "the cluster is up (run "+run) {
		t.Errorf("a second make cluster-up does not show the running cluster:\n%s", again)
	}

	if out := down(); !strings.Contains(out, "the cluster is down") {
		t.Errorf("make cluster-down printed:\n%s", out)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("make cluster-down left its state directory %s: %v", state, err)
	}
	check := exec.Command("go", "run", "./testing/hostcheck", "left", run)
	check.Dir = harness.RepoRoot()
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("make cluster-down left on the host (run %s): %v\n%s", run, err, out)
	}
}
