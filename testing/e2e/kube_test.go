package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/deploy"
	"github.com/virtlet/virtlet/testing/harness"
)

// The suites that need a real kubelet and API server are named TestKube*:
// `make e2e-k8s` runs them, `make e2e` the others.

// kubeNode is one node of a loopback cluster whose runtime is the daemon,
// set up as an operator would: the cluster objects `virtletctl gen` prints,
// the daemon reading ConfigMaps and Secrets as its node (system:node:<name>,
// under the API server's Node authorizer),
// kubelet taking its cgroup driver from the daemon, container pods
// forwarded to containerd (a mixed node; both share the pod network).
type kubeNode struct {
	k    *harness.Kube
	d    *harness.Daemon
	c    *harness.Crictl
	tn   *harness.TestNetwork
	ctrd *harness.Containerd
}

func startKubeNode(t *testing.T, netIndex int) *kubeNode {
	t.Helper()
	kubeBin, err := harness.KubeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	k := harness.StartControlPlane(t, kubeBin)
	objects, err := deploy.Manifests(deploy.Options{NoInstaller: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Apply(objects); err != nil {
		t.Fatal(err)
	}
	kubeconfig := k.NodeKubeconfig("virtlet-node-daemon")

	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: netIndex})
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(plugins(), tn.Plugin(bins)))
	d.Translate("test-images.yaml", translation)
	// The seeds' image names, translated to the test images: cirros by a
	// VirtletImageMapping object (gen's custom resource, read with the
	// node's identity), the Ubuntu image by a file.
	cloudTranslation(t) // serves cloud.qcow2
	seedNames, err := images.Translation(map[string]string{
		"cloud-images.ubuntu.com/xenial/current/xenial-server-cloudimg-amd64-disk1.img": "cloud.qcow2",
	})
	if err != nil {
		t.Fatal(err)
	}
	d.Translate("seed-images.yaml", seedNames)
	cirros, err := images.Translation(map[string]string{"cirros": "tiny.qcow2"})
	if err != nil {
		t.Fatal(err)
	}
	applyMapping(t, k, "VirtletImageMapping", "seed-images", cirros)
	// A malformed one is skipped, named in the daemon's log (seed-001).
	applyMapping(t, k, "VirtletImageMapping", "broken", "translations:\n- name: cirros\n  url: ftp://example.com/cirros.img\n")
	// Node settings in Virtlet's VirtletConfigMapping objects: this node's
	// (priority 10) wins over every node's (1); another node's label
	// selects no setting here. The streaming server kubelet proxies exec,
	// attach and port-forward to listens where the mapping says
	// (checkClusterSettings).
	streamPort := harness.FreePort(t)
	applyMapping(t, k, "VirtletConfigMapping", "every-node", fmt.Sprintf("priority: 1\nconfig: {streamPort: %d, rawDevices: 'loop*'}", harness.FreePort(t)))
	applyMapping(t, k, "VirtletConfigMapping", "this-node", fmt.Sprintf("priority: 10\nnodeName: %s\nconfig: {streamPort: %d, cpuModel: Haswell}", k.Node, streamPort))
	applyMapping(t, k, "VirtletConfigMapping", "other-nodes", "priority: 20\nnodeSelector: {virtlet-test: other}\nconfig: {streamPort: 1}")
	ctrd := harness.StartContainerd(t, tn, harness.ContainerdOptions{})
	d.Start("--kubeconfig", kubeconfig, "--forward-runtime", ctrd.Endpoint)
	k.FlexvolumeDriver = filepath.Join(bins, "virtlet-flexvolume-driver")
	k.StartKubelet(d)
	k.StartKubeProxy()
	// The node label, as `virtletctl gen --node` prints it.
	label, err := deploy.Manifests(deploy.Options{Nodes: []string{k.Node}, NoInstaller: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Apply(label); err != nil {
		t.Fatal(err)
	}
	checkClusterSettings(t, d, streamPort)
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	return &kubeNode{k: k, d: d, c: c, tn: tn, ctrd: ctrd}
}

// checkClusterSettings checks that the daemon applied startKubeNode's
// VirtletConfigMapping settings, said which it did not apply and why, and
// serves streams on the mapping's port.
func checkClusterSettings(t *testing.T, d *harness.Daemon, streamPort int) {
	t.Helper()
	var applied, notApplied []string
	for _, e := range d.LogEntries() {
		switch e["msg"] {
		case "settings from VirtletConfigMapping objects applied":
			applied = append(applied, fmt.Sprint(e["settings"]))
		case "a VirtletConfigMapping setting is not applied":
			notApplied = append(notApplied, fmt.Sprint(e["setting"]))
		}
	}
	got := strings.Join(applied, " ")
	for _, want := range []string{
		fmt.Sprintf("streamingAddress: 127.0.0.1:%d (from VirtletConfigMapping kube-system/this-node's streamPort)", streamPort),
		"plugin raw config allowedPaths: [/dev/loop*] (from VirtletConfigMapping kube-system/every-node's rawDevices)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the daemon's applied settings %q lack %q", got, want)
		}
	}
	if len(notApplied) != 1 || !strings.HasPrefix(notApplied[0], "cpuModel (from VirtletConfigMapping kube-system/this-node)") {
		t.Errorf("settings not applied: %q; want this-node's cpuModel, with its reason", notApplied)
	}
	if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", streamPort), 5*time.Second); err != nil {
		t.Errorf("the streaming server is not on the mapping's port: %v", err)
	} else {
		conn.Close()
	}
}

// applyMapping applies one of Virtlet's mappings (kind VirtletImageMapping
// or VirtletConfigMapping) in kube-system with spec (YAML); the API server
// serves the kind a moment after its CustomResourceDefinition is applied.
func applyMapping(t *testing.T, k *harness.Kube, kind, name, spec string) {
	t.Helper()
	obj := fmt.Sprintf("apiVersion: virtlet.k8s/v1\nkind: %s\nmetadata: {name: %s, namespace: kube-system}\nspec:\n", kind, name)
	for _, line := range strings.Split(strings.TrimRight(spec, "\n"), "\n") {
		obj += "  " + line + "\n"
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := k.Apply(obj)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("apply the %s %s: %v", kind, name, err)
		}
		time.Sleep(time.Second)
	}
}

func (n *kubeNode) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := n.k.Kubectl(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// waitFor polls until ok, or fails showing what kubelet and the pods say.
func (n *kubeNode) waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	waitKube(t, n.k, what, timeout, ok)
}

// waitKube polls until ok, or fails showing what k's kubelet and the
// pods of every namespace say.
func waitKube(t *testing.T, k *harness.Kube, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			pods, _ := k.Kubectl("get", "pods", "-A", "-o", "wide")
			events, _ := k.Kubectl("get", "events", "-A", "--sort-by=.lastTimestamp")
			nodes, _ := k.Kubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}: {range .status.conditions[*]}{.type}={.status} ({.reason}: {.message}) {end}{"\n"}{end}`)
			t.Fatalf("%s: not after %s\npods:\n%s\nevents:\n%s\nnodes:\n%s\nkubelet log tail:\n%s%s", what, timeout, pods, tail(events, 3000), nodes,
				tail(k.Log("kubelet"), 3000), nodeKubeletTrouble(k))
		}
		time.Sleep(time.Second)
	}
}

// nodeKubeletTrouble is, for each node kubelet of a cluster, its last
// error and warning lines (klog's E and W).
func nodeKubeletTrouble(k *harness.Kube) string {
	logs, _ := filepath.Glob(filepath.Join(k.Dir, "kubelet-*.log"))
	var b strings.Builder
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		var trouble []string
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "E") || strings.HasPrefix(line, "W") {
				trouble = append(trouble, line)
			}
		}
		trouble = trouble[max(0, len(trouble)-15):]
		fmt.Fprintf(&b, "\n%s, its last errors and warnings:\n%s\n", filepath.Base(l), strings.Join(trouble, "\n"))
	}
	return b.String()
}

// podLogs is kubectl logs of a pod (empty while it has none).
func (n *kubeNode) podLogs(pod string) string {
	out, err := n.k.Kubectl("logs", pod)
	if err != nil {
		return ""
	}
	return out
}

// ipamLeases lists the addresses host-local holds on the test network.
func (n *kubeNode) ipamLeases() []string {
	entries, _ := os.ReadDir(filepath.Join(n.tn.IPAMDir, n.tn.Name))
	var out []string
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// assertEmptyNode: no pod, container, domain, VM file, cloud-init medium,
// address or pod link (on the node's pod bridge) is left on the node.
func (n *kubeNode) assertEmptyNode(t *testing.T) {
	t.Helper()
	assertNothingLeft(t, n.d, n.c)
	if pods := n.c.Must(t, "pods", "-q"); pods != "" {
		t.Errorf("pod sandboxes left: %s", pods)
	}
	if leases := n.ipamLeases(); len(leases) != 0 {
		t.Errorf("pod addresses left: %v", leases)
	}
	if left := bridgePorts(t, n.tn.Bridge); len(left) != 0 {
		t.Errorf("pod links left on the node's pod bridge: %v", left)
	}
}

// seed001 is the cirros-vm pod of the Virtlet docs' "Defining a VM Pod",
// unchanged: its image name is translated to the tiny test guest.
const seed001 = `apiVersion: v1
kind: Pod
metadata:
  name: cirros-vm
  annotations:
    kubernetes.io/target-runtime: virtlet.cloud
    VirtletVCPUCount: "1"
    VirtletDiskDriver: virtio
    VirtletSSHKeys: |
      ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCaJEcFDXEK2ZbX0ZLS1EIYFZRbDAcRfuVjpstSc0De8+sV1aiu+dePxdkuDRwqFtCyk6dEZkssjOkBXtri00MECLkir6FcH3kKOJtbJ6vy3uaJc9w1ERo+wyl6SkAh/+JTJkp7QRXj8oylW5E20LsbnA/dIwWzAF51PPwF7A7FtNg9DnwPqMkxFo1Th/buOMKbP5ZA1mmNNtmzbMpMfJATvVyiv3ccsSJKOiyQr6UG+j7sc/7jMVz5Xk34Vd0l8GwcB0334MchHckmqDB142h/NCWTr8oLakDNvkfC1YneAfAO41hDkUbxPtVBG5M/o7P4fxoqiHEX+ZLfRxDtHB53 me@localhost
    VirtletRootVolumeSize: 1Gi
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - key: extraRuntime
            operator: In
            values:
            - virtlet
  containers:
  - name: cirros-vm
    image: virtlet.cloud/cirros
    imagePullPolicy: IfNotPresent
    tty: true
    stdin: true
    resources:
      limits:
        memory: 160Mi
`

// seed002 is the k8s-in-k8s example of the Virtlet docs ("Using higher-level
// Kubernetes objects") scaled to 2 replicas: the provisioning script
// reports to the console instead of running kubeadm (this machine reaches
// no package repository from a guest).
const seed002 = `apiVersion: v1
kind: Service
metadata:
  name: k8s
  labels:
    app: k8s
spec:
  ports:
  - port: 22
    name: ssh
  clusterIP: None
  selector:
    app: inner-k8s
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: k8s
spec:
  serviceName: k8s
  replicas: 2
  selector:
    matchLabels:
      app: inner-k8s
  template:
    metadata:
      labels:
        app: inner-k8s
      annotations:
        kubernetes.io/target-runtime: virtlet.cloud
        # set root volume size
        VirtletRootVolumeSize: 4Gi
        VirtletCloudInitUserData: |
          write_files:
          - path: /usr/local/bin/provision.sh
            permissions: "0755"
            owner: root
            content: |
              #!/bin/sh
              set -u -e
              echo "@@PROVISIONED $(hostname)" > /dev/ttyS0
          users:
          - name: root
            # VirtletSSHKeys only affects the default user, but we want root access
            ssh_authorized_keys:
            - ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCaJEcFDXEK2ZbX0ZLS1EIYFZRbDAcRfuVjpstSc0De8+sV1aiu+dePxdkuDRwqFtCyk6dEZkssjOkBXtri00MECLkir6FcH3kKOJtbJ6vy3uaJc9w1ERo+wyl6SkAh/+JTJkp7QRXj8oylW5E20LsbnA/dIwWzAF51PPwF7A7FtNg9DnwPqMkxFo1Th/buOMKbP5ZA1mmNNtmzbMpMfJATvVyiv3ccsSJKOiyQr6UG+j7sc/7jMVz5Xk34Vd0l8GwcB0334MchHckmqDB142h/NCWTr8oLakDNvkfC1YneAfAO41hDkUbxPtVBG5M/o7P4fxoqiHEX+ZLfRxDtHB53 me@localhost
          runcmd:
          - /usr/local/bin/provision.sh
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - key: extraRuntime
                operator: In
                values:
                - virtlet
      containers:
      - name: ubuntu-vm
        image: virtlet.cloud/cloud-images.ubuntu.com/xenial/current/xenial-server-cloudimg-amd64-disk1.img
        imagePullPolicy: IfNotPresent
        # tty and stdin required for kubectl attach -t to work
        tty: true
        stdin: true
        readinessProbe:
          tcpSocket:
            port: 22
          initialDelaySeconds: 5
`

// A node whose runtime is the daemon, behind a real kubelet and API
// server, runs the seeds' pods through kubectl: the scheduler places
// them by the node label, kubelet runs, logs, attaches to, restarts and
// removes them, and its log shows no runtime error.
func TestKubeNode(t *testing.T) {
	parallel(t) // the only test that runs kube-proxy (the host's nftables tables)
	n := startKubeNode(t, 89)

	t.Run("seed-001 cirros-vm", func(t *testing.T) {
		applied := time.Now()
		if err := n.k.Apply(seed001); err != nil {
			t.Fatal(err)
		}
		n.waitFor(t, "cirros-vm Running", 3*time.Minute, func() bool {
			out, _ := n.k.Kubectl("get", "pod", "cirros-vm", "-o", "jsonpath={.status.phase}")
			return out == "Running"
		})
		running := time.Since(applied)
		n.waitFor(t, "the guest's ready marker in kubectl logs", 3*time.Minute, func() bool {
			return strings.Contains(n.podLogs("cirros-vm"), "@@TINY-READY")
		})
		t.Logf("kubectl apply → Running %s, → guest ready marker %s", running.Round(10*time.Millisecond), time.Since(applied).Round(10*time.Millisecond))
		logs := n.podLogs("cirros-vm")
		// The example's annotations reached the guest: one vCPU, the root
		// disk grown to 1Gi on virtio, the SSH key in the meta-data, the
		// service account's projected token as a cloud-init file.
		if got := marker(t, logs, "CPUS"); got != "1" {
			t.Errorf("vCPUs %s, want 1", got)
		}
		if !regexp.MustCompile(`@@DISK vda SIZE_BYTES=1073741824 `).MatchString(logs) {
			t.Errorf("no 1Gi virtio root disk in the console:\n%s", tail(logs, 3000))
		}
		for _, want := range []string{"me@localhost", "/var/run/secrets/kubernetes.io/serviceaccount/token"} {
			if !strings.Contains(logs, want) {
				t.Errorf("no %q in the guest's cloud-init data:\n%s", want, tail(logs, 3000))
			}
		}
		// The image came through the seed-images mapping; the broken one
		// was named in the log and skipped.
		var source, broken bool
		for _, e := range n.d.LogEntries() {
			msg, errText := fmt.Sprint(e["msg"]), fmt.Sprint(e["error"])
			source = source || strings.Contains(fmt.Sprint(e), "VirtletImageMapping kube-system/seed-images")
			broken = broken || msg == "image translation config skipped" &&
				strings.Contains(errText, "VirtletImageMapping kube-system/broken spec field translations[0].url")
		}
		if !source || !broken {
			t.Errorf("the daemon's log: the pull named the seed-images mapping: %v; the broken mapping was reported: %v", source, broken)
		}
		if node := n.kubectl(t, "get", "pod", "cirros-vm", "-o", "jsonpath={.spec.nodeName}"); node != n.k.Node {
			t.Errorf("scheduled on %q, want %s (the node label)", node, n.k.Node)
		}

		// logs -f follows the console while kubectl attach types into it.
		follow := exec.Command(filepath.Join(n.k.Bin, "kubectl"), "--kubeconfig", n.k.Kubeconfig, "logs", "-f", "--tail=1", "cirros-vm")
		followed := &harness.Screen{}
		follow.Stdout, follow.Stderr = followed, followed
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		defer follow.Process.Kill()
		// kubectl attach -it needs a terminal: script(1) gives it one.
		attach := exec.Command("script", "-q", "-e", "-c",
			fmt.Sprintf("%s --kubeconfig %s attach -it cirros-vm", filepath.Join(n.k.Bin, "kubectl"), n.k.Kubeconfig), "/dev/null")
		stdin, _ := attach.StdinPipe()
		attached := &harness.Screen{}
		attach.Stdout, attach.Stderr = attached, attached
		if err := attach.Start(); err != nil {
			t.Fatal(err)
		}
		defer attach.Process.Kill()
		n.waitFor(t, "kubectl attach connected", time.Minute, func() bool {
			io.WriteString(stdin, "typed-through-kubectl-attach\r")
			return strings.Contains(n.podLogs("cirros-vm"), "@@ECHO typed-through-kubectl-attach")
		})
		n.waitFor(t, "kubectl logs -f shows the echo", 30*time.Second, func() bool {
			return strings.Contains(followed.String(), "@@ECHO typed-through-kubectl-attach")
		})
		if !harness.EventuallyOK(30*time.Second, func() bool { return strings.Contains(attached.String(), "@@ECHO typed-through-kubectl-attach") }) {
			t.Errorf("kubectl attach did not show the console's answer:\n%s", tail(attached.String(), 2000))
		}
		stdin.Close()

		n.kubectl(t, "delete", "pod", "cirros-vm", "--wait=true", "--timeout=3m")
		n.waitFor(t, "the VM pod removed from the node", 2*time.Minute, func() bool {
			return n.c.Must(t, "pods", "-q") == ""
		})
		n.assertEmptyNode(t)
	})

	// Virtlet's ubuntu-vm example on the cloud image (the example's image name,
	// translated), with real cloud-init: the daemon reads the ConfigMap and
	// the Secret from the API server as its node: the namespace lets the
	// nodes read those two by name (README), for the Node authorizer allows
	// only what pods reference in their spec; kubelet's ConfigMap and Secret volumes
	// become files written by cloud-init, its qcow2 flexvolume (through
	// Virtlet's driver, which kubelet runs) a disk mounted where the pod
	// says. kubectl exec, through the guest agent, shows what the guest got.
	t.Run("seed-004 ubuntu-vm on the cloud image, through the API", func(t *testing.T) {
		objects := `apiVersion: v1
kind: ConfigMap
metadata: {name: vm-user-data}
data:
  runcmd: |
    - echo user-data-from-configmap
---
apiVersion: v1
kind: Secret
metadata: {name: mysecret}
stringData:
  authorized_keys: ssh-rsa AAAAkey-from-the-secret secret@example.com
---
apiVersion: v1
kind: ConfigMap
metadata: {name: foobar-files}
data: {foobar.conf: "configmap-volume-file"}
---
apiVersion: v1
kind: Secret
metadata: {name: baz-files}
stringData: {baz.key: "secret-volume-file"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: vm-pod-objects}
rules:
- apiGroups: [""]
  resources: [configmaps, secrets]
  resourceNames: [vm-user-data, mysecret]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: vm-pod-objects}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: vm-pod-objects}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: system:nodes}
---
apiVersion: v1
kind: Pod
metadata:
  name: ubuntu-vm
  annotations:
    kubernetes.io/target-runtime: virtlet.cloud
    VirtletCloudInitMetaData: |
      instance-id: foobar
    VirtletCloudInitUserData: |
      users:
      - name: cloudy
        gecos: Magic Cloud App Daemon User
        inactive: "5"
        system: true
    VirtletCloudInitUserDataSource: configmap/vm-user-data
    VirtletSSHKeys: |
      ssh-rsa AAAAkey-one one@example.com
    VirtletSSHKeySource: secret/mysecret
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - {key: extraRuntime, operator: In, values: [virtlet]}
  containers:
  - name: ubuntu-vm
    image: virtlet.cloud/cloud-images.ubuntu.com/xenial/current/xenial-server-cloudimg-amd64-disk1.img
    volumeMounts:
    - {name: config, mountPath: /etc/foobar}
    - {name: secret, mountPath: /etc/baz}
    - {name: extra, mountPath: /var/lib/docker}
    resources:
      limits: {memory: 512Mi}
  volumes:
  - name: config
    configMap: {name: foobar-files}
  - name: secret
    secret: {secretName: baz-files}
  - name: extra
    flexVolume:
      driver: virtlet/flexvolume_driver
      options: {type: qcow2, capacity: 256MiB}
`
		if err := n.k.Apply(objects); err != nil {
			t.Fatal(err)
		}
		applied := time.Now()
		n.waitFor(t, "ubuntu-vm Running", 3*time.Minute, func() bool {
			out, _ := n.k.Kubectl("get", "pod", "ubuntu-vm", "-o", "jsonpath={.status.phase}")
			return out == "Running"
		})
		// An exec waits for the booting guest's agent (agentWait).
		var status string
		n.waitFor(t, "cloud-init done in the guest", 8*time.Minute, func() bool {
			status, _ = n.k.Kubectl("exec", "ubuntu-vm", "--", "cloud-init", "status", "--wait")
			return strings.Contains(status, "status: done")
		})
		t.Logf("kubectl apply → cloud-init done %s", time.Since(applied).Round(time.Second))
		exec := func(cmd ...string) string {
			out, err := n.k.Kubectl(append([]string{"exec", "ubuntu-vm", "--"}, cmd...)...)
			if err != nil {
				t.Errorf("kubectl exec %s: %v %s", strings.Join(cmd, " "), err, out)
			}
			return out
		}
		for _, c := range []struct {
			cmd  []string
			want string
		}{
			{[]string{"hostname"}, "ubuntu-vm"},
			{[]string{"cat", "/var/lib/cloud/data/instance-id"}, "foobar"},                              // VirtletCloudInitMetaData
			{[]string{"getent", "passwd", "cloudy"}, "Magic Cloud App Daemon User"},                     // VirtletCloudInitUserData
			{[]string{"grep", "-c", "user-data-from-configmap", "/var/log/cloud-init-output.log"}, "1"}, // the ConfigMap's runcmd, merged
			// The example's users list has no "default": its keys reach
			// cloud-init, which has no default user to give them to.
			{[]string{"cloud-init", "query", "v1.public_ssh_keys"}, "ssh-rsa AAAAkey-one"},     // VirtletSSHKeys
			{[]string{"cloud-init", "query", "v1.public_ssh_keys"}, "AAAAkey-from-the-secret"}, // VirtletSSHKeySource, through the API
			{[]string{"cat", "/etc/foobar/foobar.conf"}, "configmap-volume-file"},              // ConfigMap volume
			{[]string{"cat", "/etc/baz/baz.key"}, "secret-volume-file"},                        // Secret volume
			{[]string{"findmnt", "-n", "-o", "FSTYPE", "/var/lib/docker"}, "ext4"},             // qcow2 flexvolume
		} {
			if got := exec(c.cmd...); !strings.Contains(got, c.want) {
				t.Errorf("kubectl exec %s: %q, want %q", strings.Join(c.cmd, " "), got, c.want)
			}
		}
		n.kubectl(t, "delete", "pod", "ubuntu-vm", "--wait=true", "--timeout=3m")
		n.kubectl(t, "delete", "configmap", "vm-user-data", "foobar-files")
		n.kubectl(t, "delete", "secret", "mysecret", "baz-files")
		n.kubectl(t, "delete", "role,rolebinding", "vm-pod-objects")
		n.waitFor(t, "the VM pod removed from the node", 2*time.Minute, func() bool {
			return n.c.Must(t, "pods", "-q") == ""
		})
		n.assertEmptyNode(t)
	})

	// The daemon reads as its node: a Secret that exists, but that no pod on
	// the node references and no Role lets the nodes read, is the API
	// server's to refuse, and the pod's events say so.
	t.Run("a VM pod naming a Secret its node may not read", func(t *testing.T) {
		pod := strings.Replace(tinyPod(forbiddenSecretPod, "Never"), "    kubernetes.io/target-runtime: virtlet.cloud\n",
			"    kubernetes.io/target-runtime: virtlet.cloud\n    VirtletSSHKeySource: secret/other-tenant-keys\n", 1)
		if err := n.k.Apply("apiVersion: v1\nkind: Secret\nmetadata: {name: other-tenant-keys}\nstringData: {authorized_keys: ssh-ed25519 AAAAnot-yours}\n---\n" + pod); err != nil {
			t.Fatal(err)
		}
		var events string
		n.waitFor(t, "the refusal in the pod's events", 3*time.Minute, func() bool {
			events, _ = n.k.Kubectl("get", "events", "--field-selector", "involvedObject.name="+forbiddenSecretPod, "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
			return strings.Contains(events, "no relationship found between node")
		})
		for _, want := range []string{"VirtletSSHKeySource", "secret default/other-tenant-keys: the node may not read it", "forbidden"} {
			if !strings.Contains(events, want) {
				t.Errorf("the pod's events lack %q:\n%s", want, events)
			}
		}
		// kubelet records the event before it syncs the pod's status.
		n.waitFor(t, "the container waiting in CreateContainerError", time.Minute, func() bool {
			state, _ := n.k.Kubectl("get", "pod", forbiddenSecretPod, "-o", "jsonpath={.status.containerStatuses[0].state.waiting.reason}")
			return state == "CreateContainerError"
		})
		n.kubectl(t, "delete", "pod", forbiddenSecretPod, "--wait=true", "--timeout=3m")
		n.kubectl(t, "delete", "secret", "other-tenant-keys")
		n.waitFor(t, "the VM pod removed from the node", 2*time.Minute, func() bool {
			return n.c.Must(t, "pods", "-q") == ""
		})
		n.assertEmptyNode(t)
	})

	t.Run("a VM that fails is restarted by kubelet", func(t *testing.T) {
		if err := n.k.Apply(tinyPod("crashy", "OnFailure")); err != nil {
			t.Fatal(err)
		}
		n.waitFor(t, "crashy ready", 3*time.Minute, func() bool { return strings.Contains(n.podLogs("crashy"), "@@TINY-READY") })
		ctr := n.c.Must(t, "ps", "--name", "crashy", "-q")
		domain := inspectCtr(t, n.c, ctr).VM.Name
		pid := qemuPID(t, domain)
		if err := exec.Command("kill", "-9", pid).Run(); err != nil {
			t.Fatalf("kill QEMU %s: %v", pid, err)
		}
		n.waitFor(t, "crashy restarted and Running", 3*time.Minute, func() bool {
			out, _ := n.k.Kubectl("get", "pod", "crashy", "-o", `jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.running.startedAt}`)
			f := strings.Fields(out)
			return len(f) == 2 && f[0] == "1"
		})
		last := n.kubectl(t, "get", "pod", "crashy", "-o", `jsonpath={.status.containerStatuses[0].lastState.terminated.exitCode} {.status.containerStatuses[0].lastState.terminated.reason}`)
		if last != "1 Failed" {
			t.Errorf("last state %q, want exit code 1, reason Failed (QEMU killed)", last)
		}
		n.kubectl(t, "delete", "pod", "crashy", "--wait=true", "--timeout=3m")
	})

	t.Run("a Deployment of VM pods behind a Service", func(t *testing.T) {
		tmpl := tinyPod("web", "Always")
		spec := tmpl[strings.Index(tmpl, "spec:\n")+len("spec:\n"):]
		deployment := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations:
        kubernetes.io/target-runtime: virtlet.cloud
    spec:
%s---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
  - port: 80
`, indent(spec, "      "))
		if err := n.k.Apply(deployment); err != nil {
			t.Fatal(err)
		}
		n.waitFor(t, "2 web replicas ready", 4*time.Minute, func() bool {
			out, _ := n.k.Kubectl("get", "deployment", "web", "-o", "jsonpath={.status.readyReplicas}")
			return out == "2"
		})
		// Pod IPs are the VMs' addresses: each guest's DHCP lease is its
		// pod's IP, the Service's endpoints are those IPs, and each
		// answers from the node.
		pods := strings.Fields(n.kubectl(t, "get", "pods", "-l", "app=web", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.podIP} {end}"))
		if len(pods) != 4 {
			t.Fatalf("web pods: %v", pods)
		}
		var podIPs []string
		for i := 0; i < len(pods); i += 2 {
			name, ip := pods[i], pods[i+1]
			podIPs = append(podIPs, ip)
			n.waitFor(t, name+"'s DHCP lease", 2*time.Minute, func() bool {
				return strings.Contains(n.podLogs(name), "@@DHCP-BOUND iface=eth0 ip="+ip+" ")
			})
			// Its web server starts after the lease (the guest's init pings
			// the gateway first): ready once it says so.
			n.waitFor(t, name+" ready", 2*time.Minute, func() bool {
				return strings.Contains(n.podLogs(name), "@@TINY-READY")
			})
			if err := ping(t, ip); err != nil {
				t.Errorf("pod %s at %s: %v", name, ip, err)
			}
			// The guest's web server on the Service's port answers from
			// the VM's address.
			if page, err := httpGet("http://" + ip + "/"); err != nil || !strings.Contains(page, "tiny") {
				t.Errorf("pod %s: GET http://%s/: %q, %v", name, ip, page, err)
			}
		}
		sort.Strings(podIPs)
		n.waitFor(t, "the Service's endpoints are the pod IPs", time.Minute, func() bool {
			out, _ := n.k.Kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "jsonpath={range .items[*].endpoints[*]}{.addresses[0]} {end}")
			eps := strings.Fields(out)
			sort.Strings(eps)
			return strings.Join(eps, " ") == strings.Join(podIPs, " ")
		})
		// The Service's ClusterIP, from the node through kube-proxy's
		// rules, reaches both VMs' web servers.
		clusterIP := n.kubectl(t, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")
		answered := map[string]bool{}
		n.waitFor(t, "both VMs answering on the ClusterIP "+clusterIP, 2*time.Minute, func() bool {
			if page, err := httpGet("http://" + clusterIP + "/"); err == nil {
				answered[strings.TrimSpace(page)] = true
			}
			return len(answered) == 2
		})
		t.Logf("ClusterIP %s answered by %v", clusterIP, answered)

		n.kubectl(t, "scale", "deployment", "web", "--replicas=0")
		n.waitFor(t, "scaled to 0: no pods on the node", 3*time.Minute, func() bool {
			out, _ := n.k.Kubectl("get", "pods", "-l", "app=web", "-o", "name")
			return out == "" && n.c.Must(t, "pods", "-q") == ""
		})
		n.assertEmptyNode(t)
		n.kubectl(t, "delete", "deployment", "web")
		n.kubectl(t, "delete", "service", "web")
	})

	// Virtlet's k8s-in-k8s example's shape, scaled: a headless Service and a
	// StatefulSet of 2 VM pods of the cloud image (the example's Ubuntu image
	// name, translated), cloud-init user-data with a provisioning script
	// and root's SSH key, a tcp/22 readiness probe; the pods become Ready
	// in order and keep their stable names as hostnames.
	t.Run("seed-002 StatefulSet of VM pods, Ready in order", func(t *testing.T) {
		if err := n.k.Apply(seed002); err != nil {
			t.Fatal(err)
		}
		n.waitFor(t, "k8s-0 and k8s-1 Ready", 25*time.Minute, func() bool {
			out, _ := n.k.Kubectl("get", "statefulset", "k8s", "-o", "jsonpath={.status.readyReplicas}")
			return out == "2"
		})
		ready0 := n.kubectl(t, "get", "pod", "k8s-0", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].lastTransitionTime}`)
		created1 := n.kubectl(t, "get", "pod", "k8s-1", "-o", "jsonpath={.metadata.creationTimestamp}")
		r0, err0 := time.Parse(time.RFC3339, ready0)
		c1, err1 := time.Parse(time.RFC3339, created1)
		if err0 != nil || err1 != nil || c1.Before(r0) {
			t.Errorf("k8s-1 created at %q, before k8s-0 was Ready at %q (%v, %v)", created1, ready0, err0, err1)
		}
		t.Logf("k8s-0 Ready %s, k8s-1 created %s", ready0, created1)
		for _, pod := range []string{"k8s-0", "k8s-1"} {
			n.waitFor(t, pod+" provisioned", 3*time.Minute, func() bool {
				return strings.Contains(n.podLogs(pod), "@@PROVISIONED "+pod)
			})
			ip := n.kubectl(t, "get", "pod", pod, "-o", "jsonpath={.status.podIP}")
			if banner, err := sshBanner(ip); err != nil || !strings.HasPrefix(banner, "SSH-2.0-") {
				t.Errorf("%s: ssh on %s:22: %q, %v", pod, ip, banner, err)
			}
		}
		// The headless Service's endpoints are the two VMs.
		out := n.kubectl(t, "get", "endpointslices", "-l", "kubernetes.io/service-name=k8s", "-o", "jsonpath={range .items[*].endpoints[*]}{.hostname} {end}")
		if got := strings.Fields(out); len(got) != 2 || !slices.Contains(got, "k8s-0") || !slices.Contains(got, "k8s-1") {
			t.Errorf("headless Service endpoints' hostnames: %q", out)
		}
		n.kubectl(t, "delete", "statefulset", "k8s")
		n.kubectl(t, "delete", "service", "k8s")
		n.waitFor(t, "the StatefulSet's pods gone", 4*time.Minute, func() bool {
			out, _ := n.k.Kubectl("get", "pods", "-l", "app=inner-k8s", "-o", "name")
			return out == "" && n.c.Must(t, "pods", "-q") == ""
		})
		n.assertEmptyNode(t)
	})

	t.Run("a mixed node: a container pod beside a VM pod", func(t *testing.T) {
		box := `apiVersion: v1
kind: Pod
metadata:
  name: mixed-box
spec:
  dnsPolicy: Default
  terminationGracePeriodSeconds: 1
  containers:
  - name: box
    image: ` + harness.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo hello-from-the-container-pod; while true; do sleep 1; done"]
`
		if err := n.k.Apply(tinyPod("mixed-vm", "Always") + "---\n" + box); err != nil {
			t.Fatal(err)
		}
		n.waitFor(t, "both pods Running", 3*time.Minute, func() bool {
			out, _ := n.k.Kubectl("get", "pods", "mixed-vm", "mixed-box", "-o", "jsonpath={.items[*].status.phase}")
			return out == "Running Running"
		})
		wide := n.kubectl(t, "get", "pods", "mixed-vm", "mixed-box", "-o", "wide")
		t.Logf("kubectl get pods -o wide:\n%s", wide)
		for _, name := range []string{"mixed-vm", "mixed-box"} {
			ip := n.kubectl(t, "get", "pod", name, "-o", "jsonpath={.status.podIP}")
			if !strings.HasPrefix(ip, strings.TrimSuffix(n.tn.Gateway, "1")) || !regexp.MustCompile(name+`\s+1/1\s+Running\s+0\s+\S+\s+`+regexp.QuoteMeta(ip)+`\s+`+n.k.Node).MatchString(wide) {
				t.Errorf("pod %s (IP %q) not Running on %s in the test network:\n%s", name, ip, n.k.Node, wide)
			}
		}
		n.waitFor(t, "the container pod's log", time.Minute, func() bool {
			return strings.Contains(n.podLogs("mixed-box"), "hello-from-the-container-pod")
		})
		if out := n.kubectl(t, "exec", "mixed-box", "--", "echo", "exec-through-kubelet"); out != "exec-through-kubelet" {
			t.Errorf("kubectl exec in the container pod: %q", out)
		}
		// containerd runs the container, Virtlet the VM.
		boxID := n.c.Must(t, "ps", "--name", "box", "-q")
		vmID := n.c.Must(t, "ps", "--name", "mixed-vm", "-q")
		tasks, err := n.ctrd.Ctr("tasks", "ls")
		if err != nil || !strings.Contains(tasks, boxID) || strings.Contains(tasks, vmID) || boxID == "" || vmID == "" {
			t.Errorf("containerd's tasks (want %q, not %q): %v\n%s", boxID, vmID, err, tasks)
		}
		if inspectCtr(t, n.c, vmID).VM.Name == "" {
			t.Errorf("the VM pod's container %s has no domain", vmID)
		}
		n.kubectl(t, "delete", "pod", "mixed-vm", "mixed-box", "--wait=true", "--timeout=3m")
		n.waitFor(t, "no pods on the node", 3*time.Minute, func() bool { return n.c.Must(t, "pods", "-q") == "" })
		if ctrs, _ := n.ctrd.Ctr("containers", "ls", "-q"); strings.TrimSpace(ctrs) != "" {
			t.Errorf("containerd keeps containers: %s", ctrs)
		}
		n.assertEmptyNode(t)
	})

	// Last: everything above ran through kubelet; its log must show no
	// runtime error (what it logs when a CRI call fails or is missing).
	t.Run("kubelet's log is free of runtime errors", func(t *testing.T) {
		assertKubeletLogClean(t, n.k.Log("kubelet"))
	})
}

// kubeletRuntimeErrors are what kubelet logs when the runtime fails it or
// lacks a call.
var kubeletRuntimeErrors = regexp.MustCompile(`(?i)not implemented|Unimplemented|failed to get summary stats|` +
	`from runtime service failed|"Failed to .*(sandbox|container|image|stats)|rpc error`)

// kubeletNoise are lines that match kubeletRuntimeErrors without being
// the runtime's doing, each with the reason.
var kubeletNoise = []*regexp.Regexp{
	// The pod whose VirtletSSHKeySource the Node authorizer refuses, on
	// purpose ("a VM pod naming a Secret its node may not read").
	regexp.MustCompile(`secrets \W*other-tenant-keys\W* is forbidden: .*no relationship found between node`),
	// This machine: cgroup v1 with split hierarchies, and a kubelet that
	// lacks CAP_SYS_RESOURCE in the test's namespace.
	regexp.MustCompile(`Failed to get the kubelet's cgroup`),
	regexp.MustCompile(`Failed to ensure process in container with oom score`),
	// cAdvisor probes for CRI-O at start-up.
	regexp.MustCompile(`Registration of the crio container factory failed`),
	// The eviction manager's first pass runs before the node registers.
	regexp.MustCompile(`failed to get summary stats" err="failed to get node info: node .* not found`),
	// kubelet's container deletor asks for the containers of a sandbox it
	// has just removed; CRI's RemovePodSandbox removes them (containerd
	// answers NotFound the same way).
	regexp.MustCompile(`(ContainerStatus from runtime service failed|DeleteContainer returned error).*code = NotFound`),
	// kubelet's log GC asks about every dead symlink in the host-wide
	// /var/log/containers, a run killed before its cleanup's included
	// (an info line; kubelet's own TODO: kubernetes#63336).
	regexp.MustCompile(`"Error getting ContainerStatus for containerID".*code = NotFound`),
}

func assertKubeletLogClean(t *testing.T, log string) {
	t.Helper()
	if bad := runtimeErrorLines(log); len(bad) > 0 {
		n := len(bad)
		if n > 30 {
			bad = append(bad[:30], fmt.Sprintf("… and %d more", n-30))
		}
		t.Errorf("kubelet logged %d runtime errors:\n%s", n, strings.Join(bad, "\n"))
	}
}

// runtimeErrorLines are the lines of kubelet's log that blame the runtime.
func runtimeErrorLines(log string) []string {
	var bad []string
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		if !kubeletRuntimeErrors.MatchString(line) {
			continue
		}
		for _, noise := range kubeletNoise {
			if noise.MatchString(line) {
				continue lines
			}
		}
		bad = append(bad, line)
	}
	return bad
}

// forbiddenSecretPod names a Secret its node may not read.
const forbiddenSecretPod = "forbidden-secret-vm"

// tinyPod is a VM pod of the tiny guest with a restart policy.
func tinyPod(name, restart string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  labels: {app: %[1]s}
  annotations:
    kubernetes.io/target-runtime: virtlet.cloud
spec:
  restartPolicy: %[2]s
  nodeSelector: {extraRuntime: virtlet}
  containers:
  - name: %[1]s
    image: %[3]s
    tty: true
    stdin: true
    resources:
      limits: {memory: 128Mi}
`, name, restart, tinyRef)
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

// The log check catches what kubelet logged against the runtime before
// RuntimeConfig and the stats calls existed, and passes its own noise.
func TestKubeletLogCheck(t *testing.T) {
	parallel(t)
	for _, tc := range []struct {
		line string
		bad  bool
	}{
		{`E1123 10:00:00.000000 1 kubelet.go:1] "Failed to get runtime configuration" err="rpc error: code = Unimplemented desc = method RuntimeConfig not implemented"`, true},
		{`E1123 10:00:00.000000 1 eviction_manager.go:297] "Eviction manager: failed to get summary stats" err="failed to list pod stats: rpc error: code = Unimplemented"`, true},
		{`E1123 10:00:00.000000 1 remote_runtime.go:569] "ContainerStatus from runtime service failed" err="rpc error: code = Unknown desc = boom"`, true},
		{`E1123 10:00:00.000000 1 eviction_manager.go:297] "Eviction manager: failed to get summary stats" err="failed to get node info: node \"vm\" not found"`, false},
		{`E1123 10:00:00.000000 1 remote_runtime.go:569] "ContainerStatus from runtime service failed" err="rpc error: code = NotFound desc = container a: not found"`, false},
		{`I1123 10:00:00.000000 1 kuberuntime_gc.go:364] "Error getting ContainerStatus for containerID" containerID="ee2f" err="rpc error: code = NotFound desc = not found"`, false},
		{`I1123 10:00:00.000000 1 kuberuntime_gc.go:364] "Error getting ContainerStatus for containerID" containerID="ee2f" err="rpc error: code = Unavailable desc = down"`, true},
		{`E1128 00:42:06.898648 10510 pod_workers.go:1338] "Error syncing pod, skipping" err="failed to \"StartContainer\" for \"forbidden-secret-vm\" with CreateContainerError: \"pod default/forbidden-secret-vm: annotation VirtletSSHKeySource: read secret default/other-tenant-keys: secret default/other-tenant-keys: the node may not read it (…): secrets \\\"other-tenant-keys\\\" is forbidden: User \\\"system:node:vm\\\" cannot get resource \\\"secrets\\\" in API group \\\"\\\" in the namespace \\\"default\\\": no relationship found between node 'vm' and this object\""`, false},
		{`E1123 10:00:00.000000 1 log.go:32] "CreateContainer in sandbox from runtime service failed" err="rpc error: code = FailedPrecondition desc = annotation VirtletSSHKeySource: read secret default/other-tenant-keys: secret default/other-tenant-keys: the node may not read it (…): secrets \"other-tenant-keys\" is forbidden: User \"system:node:vm\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'vm' and this object"`, false},
		{`E1123 10:00:00.000000 1 log.go:32] "CreateContainer in sandbox from runtime service failed" err="rpc error: code = FailedPrecondition desc = annotation VirtletSSHKeySource: read secret default/mysecret: secret default/mysecret: the node may not read it (…): secrets \"mysecret\" is forbidden: User \"system:node:vm\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'vm' and this object"`, true},
		{`I1123 10:00:00.000000 1 kubelet.go:1] "Pod started"`, false},
	} {
		if flagged := len(runtimeErrorLines(tc.line)) > 0; flagged != tc.bad {
			t.Errorf("flagged %v, want %v: %s", flagged, tc.bad, tc.line)
		}
	}
}
