package e2e

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containers/image/v5/types"

	"github.com/virtlet/virtlet/testing/containerdisk"
	"github.com/virtlet/virtlet/testing/harness"
	"github.com/virtlet/virtlet/testing/imageserver"
)

// tickerScript makes the tiny guest print a numbered tick to its console
// every 200 ms, from a process that lives as long as the guest and that
// holds a file open, appending each tick to it: a gap in the numbers is a
// guest that restarted, a gap in time one that was paused, and the file's
// line count is the tick's number as long as the same open file is
// written to.
const tickerScript = "#!/bin/sh\nmkdir -p /tmp\nexec 3>/tmp/ticks\n(i=0; while true; do i=$((i+1)); echo $i >&3; echo \"@@TICK $i lines=$(wc -l < /tmp/ticks)\"; usleep 200000; done) &\n"

var tickLine = regexp.MustCompile(`^(\S+) @@TICK (\d+) lines=(\d+)$`)

// TestKubeCheckpoint checkpoints a running VM pod through kubelet's
// checkpoint API (POST /checkpoint/{namespace}/{pod}/{container}, as the
// API server's node proxy calls it): the archive is where
// kubelet says, checkpointctl shows it, its state file is a libvirt save
// image of the pod's domain and its root disk a qcow2 overlay, and the
// guest ran on: the same process, paused only while its state was written.
func TestKubeCheckpoint(t *testing.T) {
	parallel(t)
	kubeBin, err := harness.KubeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	checkpointctl := buildCheckpointctl(t)
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 93})
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(plugins(), tn.Plugin(bins)))
	d.Translate("test-images.yaml", translation)
	d.Start()
	k := harness.StartControlPlane(t, kubeBin)
	k.StartKubelet(d)

	// The ticking VM pod, of an image or of its checkpoint.
	pod := func(name, image, memory string) string {
		script, _ := json.Marshal(tickerScript)
		p := filepath.Join(t.TempDir(), name+".yaml")
		os.WriteFile(p, []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  annotations:
    kubernetes.io/target-runtime: virtlet.cloud
    VirtletCloudInitUserDataScript: %s
spec:
  nodeName: %s
  automountServiceAccountToken: false
  containers:
  - name: vm
    image: %s
    resources:
      limits: {memory: %s}
`, name, script, k.Node, image, memory)), 0o644)
		return p
	}
	manifest := pod("cp-vm", "virtlet.cloud/tiny", "128Mi")
	if out, err := k.Kubectl("apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply: %v %s", err, out)
	}
	// kubelet removes the pod (its network namespace, its log links)
	// before it is stopped.
	t.Cleanup(func() { k.Kubectl("delete", "pod", "cp-vm", "--timeout=3m") })
	waitTicks := func(pod string, n int) []tick { return waitTicksOf(t, k, pod, n) }
	before := waitTicks("cp-vm", 5)
	startedAt, _ := k.Kubectl("get", "pod", "cp-vm", "-o", "jsonpath={.status.containerStatuses[0].state.running.startedAt}")

	asked := time.Now()
	out, err := k.KubeletPost("/checkpoint/default/cp-vm/vm", 5*time.Minute)
	took := time.Since(asked)
	if err != nil {
		t.Fatalf("kubelet's checkpoint API: %v %s\ndaemon log:\n%s", err, out, tail(d.Log(), 3000))
	}
	var answer struct{ Items []string }
	if err := json.Unmarshal([]byte(out), &answer); err != nil || len(answer.Items) != 1 {
		t.Fatalf("kubelet's answer %q: %v", out, err)
	}
	archive := answer.Items[0]
	info, err := os.Stat(archive)
	if err != nil || info.Mode().Perm() != 0o600 || !strings.Contains(filepath.Base(archive), "checkpoint-cp-vm_default-vm-") {
		t.Fatalf("the archive %s: %v %v", archive, info, err)
	}
	t.Logf("checkpoint through kubelet: %s, %d MiB", took.Round(time.Millisecond), info.Size()>>20)

	t.Run("checkpointctl shows it", func(t *testing.T) {
		out, err := exec.Command(checkpointctl, "show", archive).CombinedOutput()
		if err != nil {
			t.Fatalf("checkpointctl show: %v\n%s", err, out)
		}
		for _, want := range []string{"virtlet.cloud/tiny", "virtlet", "CHKPT SIZE"} {
			if !strings.Contains(strings.ToUpper(string(out)), strings.ToUpper(want)) {
				t.Errorf("checkpointctl show says no %q:\n%s", want, out)
			}
		}
		t.Logf("checkpointctl show:\n%s", out)
	})

	t.Run("the state is a save image of the pod's domain, the root disk its overlay", func(t *testing.T) {
		dir := t.TempDir()
		untar(t, archive, dir)
		var meta struct {
			Pod struct{ Name, Namespace string }
			VM  struct{ Name string }
		}
		data, err := os.ReadFile(filepath.Join(dir, "checkpoint/virtlet.json"))
		if err != nil || json.Unmarshal(data, &meta) != nil || meta.Pod.Name != "cp-vm" || meta.Pod.Namespace != "default" {
			t.Fatalf("virtlet.json %s: %v", data, err)
		}
		xml, err := exec.Command("virsh", "-c", "qemu:///system", "save-image-dumpxml", filepath.Join(dir, "checkpoint/memory.save")).CombinedOutput()
		if err != nil || !strings.Contains(string(xml), "<name>"+meta.VM.Name+"</name>") {
			t.Fatalf("virsh save-image-dumpxml: %v\n%s", err, tail(string(xml), 2000))
		}
		img, err := exec.Command("qemu-img", "info", "--output=json", filepath.Join(dir, "disks/root.qcow2")).CombinedOutput()
		if err != nil || !strings.Contains(string(img), `"format": "qcow2"`) || !strings.Contains(string(img), `"backing-filename"`) {
			t.Fatalf("qemu-img info of the root disk's copy: %v\n%s", err, img)
		}
	})

	t.Run("the guest ran on", func(t *testing.T) {
		after := waitTicks("cp-vm", last(before)+10)
		if st, _ := k.Kubectl("get", "pod", "cp-vm", "-o", "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.running.startedAt}"); st != "0 "+startedAt {
			t.Errorf("the container restarted: %q, was started at %s", st, startedAt)
		}
		// One process counted on: every tick is there, once, in order,
		// each written to the file it holds open.
		for i := 1; i < len(after); i++ {
			if after[i].n != after[i-1].n+1 || after[i].lines != after[i].n {
				t.Fatalf("tick %d (%d lines) after tick %d: the guest's process did not run on", after[i].n, after[i].lines, after[i-1].n)
			}
		}
		var gap time.Duration
		for i := 1; i < len(after); i++ {
			if after[i].n > last(before)-5 {
				gap = max(gap, after[i].at.Sub(after[i-1].at))
			}
		}
		t.Logf("the largest gap between the guest's 200 ms ticks around the checkpoint: %s", gap.Round(time.Millisecond))
		if gap > took+time.Second {
			t.Errorf("the guest stood still %s, longer than the whole checkpoint (%s)", gap, took)
		}
	})

	// The checkpoint, served as an image, restored in a new pod once the
	// checkpointed VM's own pod is gone (a node runs one domain of a
	// name): the guest goes on where it was, with the new pod's address.
	t.Run("restored in a new pod", func(t *testing.T) {
		d.Translate("checkpoint.yaml", serveCheckpoint(t, archive, "cp-vm-checkpoint", "127.0.0.1"))
		if out, err := k.Kubectl("delete", "pod", "cp-vm", "--timeout=3m"); err != nil {
			t.Fatalf("delete the checkpointed pod: %v %s", err, out)
		}
		// A pod whose VM differs from the checkpointed one is refused,
		// the field named where kubectl shows it.
		if out, err := k.Kubectl("apply", "-f", pod("cp-bad", "virtlet.cloud/cp-vm-checkpoint", "256Mi")); err != nil {
			t.Fatalf("kubectl apply: %v %s", err, out)
		}
		t.Cleanup(func() { k.Kubectl("delete", "pod", "cp-bad", "--timeout=3m") })
		var why string
		for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
			why, _ = k.Kubectl("get", "pod", "cp-bad", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.message}")
			if why != "" && !strings.Contains(why, "pull") {
				break
			}
		}
		if !strings.Contains(why, "resources.limits.memory") || !strings.Contains(why, "128 MiB") {
			describe, _ := k.Kubectl("describe", "pod", "cp-bad")
			t.Fatalf("the pod asking for 256Mi was not refused by name: %q\n%s", why, describe)
		}
		t.Logf("refused: %s", why)
		k.Kubectl("delete", "pod", "cp-bad", "--timeout=3m")

		applied := time.Now()
		if out, err := k.Kubectl("apply", "-f", pod("cp-restore", "virtlet.cloud/cp-vm-checkpoint", "128Mi")); err != nil {
			t.Fatalf("kubectl apply: %v %s", err, out)
		}
		t.Cleanup(func() { k.Kubectl("delete", "pod", "cp-restore", "--timeout=3m") })
		if out, err := k.Kubectl("wait", "--for=condition=Ready", "pod/cp-restore", "--timeout=3m"); err != nil {
			describe, _ := k.Kubectl("describe", "pod", "cp-restore")
			t.Fatalf("the restored pod is not Ready: %v %s\n%s\ndaemon log:\n%s", err, out, describe, tail(d.Log(), 4000))
		}
		ready := time.Since(applied)
		if ready > 20*time.Second {
			events, _ := k.Kubectl("get", "events", "--field-selector", "involvedObject.name=cp-restore", "-o", "custom-columns=AGE:.lastTimestamp,REASON:.reason,MESSAGE:.message")
			t.Logf("the restored pod took %s to be Ready:\n%s", ready, events)
		}
		first := readTicks(k, "cp-restore")
		if len(first) == 0 {
			first = waitTicks("cp-restore", 1)
		}
		from := first[0].n
		ticks := waitTicks("cp-restore", from+10)
		if from <= last(before) {
			var lines []string
			for _, l := range strings.Split(d.Log(), "\n") {
				if strings.Contains(l, "checkpoint") || strings.Contains(l, "restor") || strings.Contains(l, "cp-restore") {
					lines = append(lines, l)
				}
			}
			t.Fatalf("the restored guest's ticks start at %d, before the checkpoint's (after tick %d): it booted anew; the daemon's log of it:\n%s",
				from, last(before), tail(strings.Join(lines, "\n"), 6000))
		}
		for i := 1; i < len(ticks); i++ {
			if ticks[i].n != ticks[i-1].n+1 || ticks[i].lines != ticks[i].n {
				t.Fatalf("tick %d (%d lines) after tick %d: the restored guest's process did not run on", ticks[i].n, ticks[i].lines, ticks[i-1].n)
			}
		}
		// A boot's first line (the ready marker may come after the
		// checkpoint on a slow machine, the restored guest's init going on).
		logs, _ := k.Kubectl("logs", "cp-restore")
		if strings.Contains(logs, "@@TINY-INIT-START") {
			t.Errorf("the restored guest booted:\n%s", tail(logs, 2000))
		}
		ip, _ := k.Kubectl("get", "pod", "cp-restore", "-o", "jsonpath={.status.podIP}")
		var bound time.Duration
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
			logs, _ = k.Kubectl("logs", "cp-restore")
			if strings.Contains(logs, "@@DHCP-BOUND iface=eth0 ip="+ip+" ") {
				bound = time.Since(applied)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the restored guest did not take the pod's address %s:\n%s", ip, tail(logs, 3000))
			}
		}
		var page string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
			page, err = httpGet("http://" + ip + "/")
			if err == nil && strings.HasPrefix(page, "tiny ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the restored guest does not answer on %s: %v %q", ip, err, page)
			}
		}
		t.Logf("restored from tick %d: kubectl apply → Ready %s, → the guest took %s %s; its web server answers (%s)", from, ready.Round(time.Millisecond),
			ip, bound.Round(time.Millisecond), strings.TrimSpace(page))
	})

	// The same checkpoint pushed to a registry as CRI-O's checkpoint
	// image (one layer of the archive's files, the manifest annotated
	// io.kubernetes.cri-o.annotations.checkpoint.name), restored once
	// the previous restore's pod is gone.
	t.Run("restored from a checkpoint image in a registry", func(t *testing.T) {
		reg, err := containerdisk.StartRegistry()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reg.Close)
		sys := &types.SystemContext{DockerInsecureSkipTLSVerify: types.OptionalBoolTrue}
		if err := containerdisk.PushCheckpoint(context.Background(), "docker://"+reg.Addr+"/checkpoints/cp-vm:1", archive, "vm", sys); err != nil {
			t.Fatal(err)
		}
		d.Translate("checkpoint-image.yaml", fmt.Sprintf("translations:\n- name: cp-vm-image\n  url: docker://%s/checkpoints/cp-vm:1\n  transport: plain\n"+
			"transports:\n  plain: {tls: {insecure: true}}\n", reg.Addr))
		// The previous restore's pod went with its subtest.
		if out, err := k.Kubectl("delete", "pod", "cp-restore", "--ignore-not-found", "--timeout=3m"); err != nil {
			t.Fatalf("delete the restored pod: %v %s", err, out)
		}
		if out, err := k.Kubectl("apply", "-f", pod("cp-image", "virtlet.cloud/cp-vm-image", "128Mi")); err != nil {
			t.Fatalf("kubectl apply: %v %s", err, out)
		}
		t.Cleanup(func() { k.Kubectl("delete", "pod", "cp-image", "--timeout=3m") })
		if out, err := k.Kubectl("wait", "--for=condition=Ready", "pod/cp-image", "--timeout=3m"); err != nil {
			describe, _ := k.Kubectl("describe", "pod", "cp-image")
			t.Fatalf("the pod of the checkpoint image is not Ready: %v %s\n%s\ndaemon log:\n%s", err, out, describe, tail(d.Log(), 4000))
		}
		first := readTicks(k, "cp-image")
		if len(first) == 0 {
			first = waitTicks("cp-image", 1)
		}
		ticks := waitTicks("cp-image", first[0].n+5)
		if first[0].n <= last(before) {
			t.Fatalf("the guest of the checkpoint image ticks from %d, before the checkpoint's tick %d: it booted anew", first[0].n, last(before))
		}
		for i := 1; i < len(ticks); i++ {
			if ticks[i].n != ticks[i-1].n+1 || ticks[i].lines != ticks[i].n {
				t.Fatalf("tick %d (%d lines) after tick %d: the guest's process did not run on", ticks[i].n, ticks[i].lines, ticks[i-1].n)
			}
		}
		if logs, _ := k.Kubectl("logs", "cp-image"); strings.Contains(logs, "@@TINY-INIT-START") {
			t.Errorf("the guest of the checkpoint image booted:\n%s", tail(logs, 2000))
		}
		t.Logf("restored from the checkpoint image at tick %d", first[0].n)
	})
}

func last(ts []tick) int { return ts[len(ts)-1].n }

// serveCheckpoint serves a checkpoint archive as the image name on addr
// (https, the test CA) until the test ends, and returns the translation
// that names it.
func serveCheckpoint(t *testing.T, archive, name, addr string) string {
	t.Helper()
	www := t.TempDir()
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(www, "checkpoint.tar"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := imageserver.Start(www, addr+":0", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	tr, err := srv.Translation(map[string]string{name: "checkpoint.tar"})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

type tick struct {
	at       time.Time
	n, lines int
}

// readTicks reads the guest's ticks from kubectl logs --timestamps (the
// time each line reached the container's log).
func readTicks(k *harness.Kube, pod string) []tick {
	logs, err := k.Kubectl("logs", "--timestamps", pod)
	if err != nil {
		return nil
	}
	var out []tick
	for _, line := range strings.Split(logs, "\n") {
		m := tickLine.FindStringSubmatch(strings.TrimRight(line, "\r"))
		if m == nil {
			continue
		}
		at, err1 := time.Parse(time.RFC3339Nano, m[1])
		n, err2 := strconv.Atoi(m[2])
		lines, err3 := strconv.Atoi(m[3])
		if err1 == nil && err2 == nil && err3 == nil {
			out = append(out, tick{at, n, lines})
		}
	}
	return out
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("archive member %q is outside the archive", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(p, 0o700)
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o700)
			w, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(w, tr); err != nil {
				t.Fatal(err)
			}
			w.Close()
		default:
			t.Fatalf("archive member %q of type %c", h.Name, h.Typeflag)
		}
	}
}

// buildCheckpointctl builds (or finds in the build cache) the pinned
// checkpointctl.
func buildCheckpointctl(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(harness.RepoRoot(), "testing/checkpointctl/build.sh"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build checkpointctl: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}
