package harness

import (
	"encoding/base64"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/deploy"
)

// StartVirtletNode starts a node on n, its pods on subnet podIndex, and a
// daemon on it with the shipped plugins built in bins, the node's pod
// network, and an image translation file (translations, YAML).
func (n *NodeNet) StartVirtletNode(t testing.TB, bins string, podIndex int, translations string) (*Node, *Daemon) {
	t.Helper()
	node := n.NewNode(t, podIndex)
	d := NewDaemon(t, filepath.Join(bins, "virtlet"), append(Shipped(bins), node.CNIPlugin(bins)))
	d.Wrap = node.Wrap()
	d.Translate("test-images.yaml", translations)
	d.Start()
	return node, d
}

// StartMigratingNode starts a node on n like StartVirtletNode, whose
// daemon also serves live migrations (on the node's address, port 10262,
// mutual TLS with a node certificate of k's CA), and the node's kubelet.
// args are the daemon's migration flags, for a restart.
func (n *NodeNet) StartMigratingNode(t testing.TB, k *Kube, bins string, podIndex int, translations string) (node *Node, d *Daemon, args []string) {
	t.Helper()
	node = n.NewNode(t, podIndex)
	d = NewDaemon(t, filepath.Join(bins, "virtlet"), append(Shipped(bins), node.CNIPlugin(bins)))
	d.Wrap = node.Wrap()
	d.Translate("test-images.yaml", translations)
	cert, key, ca := k.MigrationCredentials(node.Name)
	args = []string{"--migration-address", node.IP + ":10262", "--migration-cert", cert, "--migration-key", key, "--migration-ca", ca}
	d.Start(args...)
	k.StartNodeKubelet(node, d)
	return node, d, args
}

// SpreadVMs is a Deployment of replicas tiny-guest VM pods labelled
// app=name, spread over the Virtlet nodes that are up (a tainted node is
// left out of the spread), which tolerate a failed node for
// tolerationSeconds.
func SpreadVMs(name string, replicas, tolerationSeconds int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: %[1]s
spec:
  replicas: %[2]d
  selector:
    matchLabels: {app: %[1]s}
  template:
    metadata:
      labels: {app: %[1]s}
      annotations:
        kubernetes.io/target-runtime: virtlet.cloud
        VirtletForceDHCPNetworkConfig: "true"
    spec:
      nodeSelector: {extraRuntime: virtlet}
      terminationGracePeriodSeconds: 10
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: %[3]d}
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: %[3]d}
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        nodeTaintsPolicy: Honor
        labelSelector:
          matchLabels: {app: %[1]s}
      containers:
      - name: vm
        image: virtlet.cloud/tiny
        tty: true
        stdin: true
        resources:
          limits: {memory: 160Mi}
`, name, replicas, tolerationSeconds)
}

// ClusterVM is a VM pod as the API server has it.
type ClusterVM struct{ Pod, Node, IP string }

// ReadyVMs lists the pods labelled app=app that run, are not being
// deleted, and whose tiny guest printed its ready marker (kubectl logs);
// problem says why the last pod left out was.
func (k *Kube) ReadyVMs(app string) (vms []ClusterVM, problem string) {
	out, err := k.Kubectl("get", "pods", "-l", "app="+app, "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.status.phase} {.metadata.deletionTimestamp}{"\n"}{end}`)
	if err != nil {
		return nil, err.Error()
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[3] != "Running" { // being deleted, or not running yet
			continue
		}
		if logs, err := k.Kubectl("logs", f[0]); !strings.Contains(logs, "@@TINY-READY") {
			problem = fmt.Sprintf("kubectl logs %s (on %s): %v\n%s", f[0], f[1], err, tail(logs, 1000))
			continue
		}
		vms = append(vms, ClusterVM{Pod: f[0], Node: f[1], IP: f[2]})
	}
	return vms, problem
}

// WaitVMs waits up to timeout until ReadyVMs(app) satisfy ok, polling
// every interval, and returns them.
func (k *Kube) WaitVMs(app, what string, timeout, interval time.Duration, ok func([]ClusterVM) bool) []ClusterVM {
	t := k.t
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(interval) {
		vms, problem := k.ReadyVMs(app)
		if ok(vms) {
			return vms
		}
		if time.Now().After(deadline) {
			pods, _ := k.Kubectl("get", "pods", "-A", "-o", "wide")
			events, _ := k.Kubectl("get", "events", "-A", "--sort-by=.lastTimestamp")
			t.Fatalf("%s: not after %s; ready: %v; the last problem: %s\npods:\n%s\nevents:\n%s", what, timeout, vms, problem, pods, tail(events, 3000))
		}
	}
}

// ByNode groups VM pods by node.
func ByNode(vms []ClusterVM) map[string][]ClusterVM {
	out := map[string][]ClusterVM{}
	for _, v := range vms {
		out[v.Node] = append(out[v.Node], v)
	}
	return out
}

// StatefulVM is a StatefulSet (vm, its pod vm-0 labelled
// app=stateful-vm) of one tiny-guest VM pod whose persistent
// root is the Ceph RBD image vm-root (created on first use), through a
// ceph flexvolume PV bound to its claim.
func StatefulVM(monitor, key string) string {
	return CephRoot(monitor, key, "vm-root", "root-vm-0") + fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: vm}
spec:
  clusterIP: None
  selector: {app: stateful-vm}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: vm}
spec:
  serviceName: vm
  replicas: 1
  selector:
    matchLabels: {app: stateful-vm}
  template:
    metadata:
      labels: {app: stateful-vm}
      annotations:
        kubernetes.io/target-runtime: virtlet.cloud
        VirtletForceDHCPNetworkConfig: "true"
        VirtletDiskDriver: %[1]s
    spec:
      nodeSelector: {extraRuntime: virtlet}
      terminationGracePeriodSeconds: 10
      containers:
      - name: vm
        image: virtlet.cloud/tiny
        tty: true
        stdin: true
        resources:
          limits: {memory: 160Mi}
        volumeMounts:
        - {name: root, mountPath: /persistent-root}
  volumeClaimTemplates:
  - metadata: {name: root}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: ""
      resources: {requests: {storage: 256Mi}}
`, "virtio")
}

// CephRoot is a Ceph RBD image (created at first use, 256 MiB, in pool
// rbd of the cluster at monitor) as the PersistentVolume name for the
// claim claim, a persistent root (the ceph flexvolume's rootfs: "true"),
// with the Secret of the client.libvirt key it is reached with.
func CephRoot(monitor, key, name, claim string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: ceph-libvirt, namespace: default}
type: virtlet/flexvolume_driver
data: {secret: %[2]s}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: %[3]s}
spec:
  capacity: {storage: 256Mi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {namespace: default, name: %[4]s}
  flexVolume:
    driver: virtlet/flexvolume_driver
    secretRef: {name: ceph-libvirt, namespace: default}
    options: {type: ceph, monitor: "%[1]s", pool: rbd, volume: %[3]s, user: libvirt, create: "true", capacity: 256MiB, rootfs: "true"}
`, monitor, base64.StdEncoding.EncodeToString([]byte(key)), name, claim)
}

// StartMixedNode is StartVirtletNode with a containerd of the node's own
// (in its namespaces, its pods on the node's pod network) to which the
// daemon forwards container pods, as a mixed node of a real cluster.
func (n *NodeNet) StartMixedNode(t testing.TB, bins string, podIndex int, translations string) (*Node, *Daemon, *Containerd) {
	t.Helper()
	node := n.NewNode(t, podIndex)
	ctrd := StartContainerd(t, nil, ContainerdOptions{CNIConfDir: node.ConfDir, Wrap: node.Wrap()})
	d := NewDaemon(t, filepath.Join(bins, "virtlet"), append(Shipped(bins), node.CNIPlugin(bins)))
	d.Wrap = node.Wrap()
	d.Translate("test-images.yaml", translations)
	d.Start("--forward-runtime", ctrd.Endpoint)
	return node, d, ctrd
}

// ClusterDNSIP is the cluster DNS Service's address (ClusterDNS).
const ClusterDNSIP = "198.19.96.10"

// ClusterDNS is CoreDNS (CoreDNSImage, imported into the node's
// containerd) serving the cluster's names (cluster.local) from the API
// server, on node, as the Service kube-dns at ClusterDNSIP; nothing is
// forwarded upstream (nothing leaves the machine). The nodes' kubelets
// give pods that server when Kube.ClusterDNS is set.
func ClusterDNS(node string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system}
spec:
  replicas: 1
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns, tier: containers}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      nodeSelector: {kubernetes.io/hostname: %[1]s}
      containers:
      - name: coredns
        image: %[2]s
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {containerPort: 53, protocol: UDP, name: dns}
        - {containerPort: 53, protocol: TCP, name: dns-tcp}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system}
spec:
  clusterIP: %[3]s
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
`, node, CoreDNSImage, ClusterDNSIP)
}

// StartCluster starts a cluster's network (NewNodeNet(index)) and control
// plane (StartClusterControlPlane, the pinned Kubernetes binaries) with
// Virtlet's cluster objects (deploy.Manifests: its CRDs and RuntimeClass)
// applied; the nodes are the caller's.
func StartCluster(t testing.TB, index int) (*NodeNet, *Kube) {
	t.Helper()
	kubeBin, err := KubeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	nodeNet := NewNodeNet(t, index)
	k := StartClusterControlPlane(t, kubeBin, nodeNet.HostIP)
	objects, err := deploy.Manifests(deploy.Options{NoInstaller: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Apply(objects); err != nil {
		t.Fatal(err)
	}
	return nodeNet, k
}
