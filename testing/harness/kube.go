package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Kube is a loopback-only control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler), a kube-proxy and a
// kubelet whose container runtime is a Virtlet daemon: the path kubectl
// and virtletctl take to a VM pod. Every process runs under the test and
// is stopped by its PID; nothing listens beyond loopback.
//
// This machine's quirks: cgroup v1 (kubelet needs failCgroupV1: false and
// the cgroupfs driver); kubelet would set host sysctls, so it runs in its
// own mount namespace with those /proc/sys files bound over; the API
// server reaches the kubelet by the node's host name, which resolves to a
// loopback address here.
type Kube struct {
	t          testing.TB
	Dir        string
	Bin        string // kube-apiserver, kubelet, kubectl
	Node       string
	Kubeconfig string // admin
	APIServer  string // https://127.0.0.1:port
	// KubeletPort is the kubelet's HTTPS port on 127.0.0.1.
	KubeletPort int
	// FlexvolumeDriver, when set before StartKubelet, is installed as
	// kubelet's virtlet/flexvolume_driver, talking to the daemon's admin
	// socket.
	FlexvolumeDriver string
	// FeatureGates, when set before StartKubelet, are kubelet's feature
	// gates, a YAML flow mapping ("{PodAndContainerStatsFromCRI: true}").
	FeatureGates string
	// ClusterDNS, when set before StartNodeKubelet, is the cluster DNS
	// server kubelet gives pods (ClusterDNSIP), with cluster.local.
	ClusterDNS    string
	mu            sync.Mutex // procs and kubeletDone, which RestartKubeletProcess changes
	procs         []*exec.Cmd
	kubelet       []string // the kubelet's command line, for RestartKubelet
	kubeletDone   <-chan struct{}
	rootDir       string
	cgroupRoot    string   // the kubelet's, in every hierarchy (KubeletCgroupRoot)
	serverIPs     []net.IP // more addresses of the servers' certificates
	ca            *x509.Certificate
	caKey         *ecdsa.PrivateKey
	serial        int64
	proxyIdentity sync.Once // kube-proxy's certificate, issued once for every node's
}

// KubeBinaries builds (or finds in the cache) the Kubernetes binaries.
func KubeBinaries() (string, error) {
	cmd := exec.Command(filepath.Join(RepoRoot(), "testing", "k8s", "build.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build the Kubernetes binaries: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// StartKube runs the control plane and a kubelet pointed at the daemon's
// CRI socket, and waits for the node to be Ready.
func StartKube(t testing.TB, bin string, d *Daemon) *Kube {
	t.Helper()
	k := StartControlPlane(t, bin)
	k.StartKubelet(d)
	return k
}

// StartControlPlane runs etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler, with every admission plugin of a default cluster, and
// waits until the default namespace has its service account.
func StartControlPlane(t testing.TB, bin string) *Kube {
	t.Helper()
	return startControlPlane(t, bin, "")
}

// StartClusterControlPlane is StartControlPlane listening on address, the
// host's address on a NodeNet, where kubelets on Nodes reach it and it
// reaches them by their InternalIP.
func StartClusterControlPlane(t testing.TB, bin, address string) *Kube {
	t.Helper()
	return startControlPlane(t, bin, address)
}

func startControlPlane(t testing.TB, bin, address string) *Kube {
	t.Helper()
	node, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if addrs, err := net.LookupHost(node); err != nil || len(addrs) == 0 || !net.ParseIP(addrs[0]).IsLoopback() {
		t.Fatalf("the host name %s must resolve to a loopback address (the API server reaches the kubelet by it): %v %v", node, addrs, err)
	}
	dir, err := os.MkdirTemp("", "virtlet-kube-")
	if err != nil {
		t.Fatal(err)
	}
	k := &Kube{t: t, Dir: dir, Bin: bin, Node: node}
	bind, preferred := "127.0.0.1", "Hostname,InternalIP"
	if address != "" {
		bind, preferred = address, "InternalIP,Hostname"
		k.serverIPs = append(k.serverIPs, net.ParseIP(address))
	}
	// kubelet's and kube-proxy's iptables chains (KUBE-FIREWALL with its
	// INPUT and OUTPUT jumps, KUBE-KUBELET-CANARY, ...) go after the test,
	// once they have stopped (cleanups run last-registered first).
	RemoveNewChains(t, "KUBE-")
	t.Cleanup(func() { k.stop(); os.RemoveAll(dir) })
	pki := k.makePKI()
	etcdClient, etcdPeer, apiPort := FreePort(t), FreePort(t), FreePort(t)
	k.APIServer = fmt.Sprintf("https://%s:%d", bind, apiPort)

	k.start("etcd", "etcd", "--name", "virtlet-test", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdClient), "--advertise-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdClient),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeer), "--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeer),
		"--initial-cluster", fmt.Sprintf("virtlet-test=http://127.0.0.1:%d", etcdPeer), "--unsafe-no-fsync")
	k.start("kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdClient),
		"--bind-address="+bind, fmt.Sprintf("--secure-port=%d", apiPort), "--advertise-address="+bind,
		"--tls-cert-file="+pki("apiserver.crt"), "--tls-private-key-file="+pki("apiserver.key"), "--client-ca-file="+pki("ca.crt"),
		"--service-account-key-file="+pki("sa.pub"), "--service-account-signing-key-file="+pki("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc", "--service-cluster-ip-range="+ServiceCIDR,
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--kubelet-client-certificate="+pki("apiserver-kubelet-client.crt"), "--kubelet-client-key="+pki("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority="+pki("ca.crt"), "--kubelet-preferred-address-types="+preferred,
		// The kubernetes Service's endpoint is the API server's address:
		// a cluster's, on its node bridge, which pods reach (CoreDNS
		// reads the API through it); loopback is no endpoint.
		"--endpoint-reconciler-type="+map[bool]string{false: "none", true: "lease"}[address != ""],
		// As kubeadm sets it: node agents (the installer DaemonSet) run privileged.
		"--allow-privileged=true")
	k.Kubeconfig = k.kubeconfig("admin")
	k.wait("the API server", 3*time.Minute, func() bool { _, err := k.Kubectl("get", "--raw", "/readyz"); return err == nil })
	// Port 0: neither serves HTTPS (their health is the objects they make).
	controllers := []string{"--kubeconfig=" + k.kubeconfig("controller-manager"), "--leader-elect=false", "--secure-port=0",
		"--service-account-private-key-file=" + pki("sa.key"), "--root-ca-file=" + pki("ca.crt"),
		"--use-service-account-credentials=true", "--service-cluster-ip-range=" + ServiceCIDR,
		"--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller"}
	if address != "" {
		// A cluster's nodes renew their leases every 2 s
		// (StartNodeKubelet): a node silent for 16 s is taken for gone
		// (the default, 50 s, would make a node failure test wait).
		controllers = append(controllers, "--node-monitor-grace-period=16s")
	}
	k.start("kube-controller-manager", filepath.Join(bin, "kube-controller-manager"), controllers...)
	k.start("kube-scheduler", filepath.Join(bin, "kube-scheduler"),
		"--kubeconfig="+k.kubeconfig("scheduler"), "--leader-elect=false", "--secure-port=0")
	k.wait("the default service account", 3*time.Minute, func() bool {
		_, err := k.Kubectl("get", "serviceaccount", "default", "-n", "default")
		return err == nil
	})
	return k
}

// ServiceCIDR is the test cluster's service range: test addresses
// (198.18.0.0/15) that StartKubeProxy routes into a bridge without ports, so a
// packet to a ClusterIP that kube-proxy does not rewrite ends on the node.
const ServiceCIDR = "198.19.96.0/24"

// serviceLink is the portless bridge the service range is routed into:
// the run's bridge prefix and 0, an index no test network has.
func serviceLink() string { return RunBridgePrefix(RunID()) + "0" }

// StartKubeProxy runs kube-proxy in nftables mode, so the node reaches
// ClusterIPs as a real node does. Its rules live in nftables tables of
// its own ("kube-proxy", ip and ip6), deleted when the test ends; it is
// told to leave conntrack's sysctls alone; the service range is routed
// into a bridge without ports, so nothing sent to it can leave the machine.
func (k *Kube) StartKubeProxy() {
	t := k.t
	t.Helper()
	serviceLink := serviceLink()
	for _, args := range [][]string{
		{"link", "add", serviceLink, "type", "bridge"}, // no ports: what reaches it goes nowhere
		{"link", "set", serviceLink, "up"},
		{"route", "add", ServiceCIDR, "dev", serviceLink},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			exec.Command("ip", "link", "del", serviceLink).Run()
			t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	k.issue("kube-proxy", "system:kube-proxy", nil, false, nil)
	config := filepath.Join(k.Dir, "kube-proxy.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
nodePortAddresses: [127.0.0.1/32]
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, k.kubeconfig("kube-proxy"), k.Node, FreePort(t), FreePort(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	done := k.start("kube-proxy", filepath.Join(k.Bin, "kube-proxy"), "--config="+config, "--v=2")
	proxy := k.procs[len(k.procs)-1].Process
	// Stopped before its tables go, or it would make them again.
	t.Cleanup(func() {
		proxy.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			proxy.Kill()
			<-done
		}
		for _, family := range []string{"ip", "ip6"} {
			exec.Command("nft", "delete", "table", family, "kube-proxy").Run()
		}
		exec.Command("ip", "link", "del", serviceLink).Run()
	})
	k.wait("kube-proxy's rules", time.Minute, func() bool {
		return exec.Command("nft", "list", "table", "ip", "kube-proxy").Run() == nil
	})
}

// KubeProxyTables lists the nftables tables kube-proxy holds on the host
// ("ip kube-proxy"...): none once the test has ended.
func KubeProxyTables() []string {
	out, _ := exec.Command("nft", "list", "tables").Output()
	var tables []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasSuffix(line, " kube-proxy") {
			tables = append(tables, strings.TrimPrefix(line, "table "))
		}
	}
	return tables
}

// StartKubelet runs a kubelet whose container runtime is d and waits for
// the node to be Ready.
func (k *Kube) StartKubelet(d *Daemon) {
	k.t.Helper()
	k.StartKubeletOn("unix://"+d.Socket, d.AdminSocket())
}

// StartKubeletOn runs a kubelet whose container runtime is at endpoint
// (adminSocket: the Virtlet daemon's, for the flexvolume driver; "" when
// the runtime is not Virtlet) and waits for the node to be Ready.
func (k *Kube) StartKubeletOn(endpoint, adminSocket string) {
	t := k.t
	t.Helper()
	dir := k.Dir
	pki := func(n string) string { return filepath.Join(dir, "pki", n) }
	kubeletPort, healthz := FreePort(t), FreePort(t)
	k.KubeletPort = kubeletPort
	k.rootDir = filepath.Join(dir, "kubelet")
	sysctls := filepath.Join(dir, "sysctl")
	for _, p := range []string{k.rootDir, filepath.Join(dir, "pod-logs")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeSysctls(sysctls); err != nil {
		t.Fatal(err)
	}
	// kubelet's volume mounts must be visible to the daemon: its root dir
	// is a shared mount.
	if out, err := exec.Command("sh", "-c", fmt.Sprintf("mount --bind %[1]s %[1]s && mount --make-shared %[1]s", k.rootDir)).CombinedOutput(); err != nil {
		t.Fatalf("kubelet root dir: %v %s", err, out)
	}
	// kubelet's flexvolume plugins: Virtlet's driver, as `make install`
	// puts it, told where this daemon's admin socket is.
	plugins := filepath.Join(dir, "volume-plugins")
	if k.FlexvolumeDriver != "" && adminSocket != "" {
		if err := installFlexvolumeDriver(plugins, adminSocket, k.FlexvolumeDriver); err != nil {
			t.Fatal(err)
		}
	}
	// The kubelet's own cgroup root (KubeletCgroupRoot): removed once it
	// has stopped (stop).
	k.cgroupRoot = KubeletCgroupRoot(RunID(), strings.TrimPrefix(filepath.Base(dir), "virtlet-kube-"))
	if err := makeCgroupRoot(k.cgroupRoot); err != nil {
		t.Fatal(err)
	}
	config := k.KubeletConfig()
	gates := ""
	if k.FeatureGates != "" {
		gates = "featureGates: " + k.FeatureGates + "\n"
	}
	os.WriteFile(config, []byte(gates+kubeletSettings{
		Address: "127.0.0.1", Port: kubeletPort, HealthzPort: healthz, Endpoint: endpoint,
		PodLogs: filepath.Join(dir, "pod-logs"), VolumePlugins: plugins, Cert: pki("kubelet-serving.crt"), Key: pki("kubelet-serving.key"),
		CA: pki("ca.crt"), CgroupRoot: k.cgroupRoot,
	}.yaml()), 0o644)
	k.kubelet = []string{"unshare", "-m", "--propagation", "unchanged", "--", "sh", "-c",
		kubeletCommand(sysctls, filepath.Join(k.Bin, "kubelet"), config, k.KubeletKubeconfig(), k.rootDir, "--hostname-override="+k.Node)}
	k.kubeletDone = k.start("kubelet", k.kubelet[0], k.kubelet[1:]...)
	k.waitNodeReady()
}

// kubeletSettings are what differs between test kubelets'
// configurations.
type kubeletSettings struct {
	Address                   string
	Port, HealthzPort         int
	Endpoint                  string // the runtime's
	PodLogs, VolumePlugins    string
	Cert, Key, CA, CgroupRoot string
}

// yaml is the kubelet's KubeletConfiguration. No cgroupDriver: kubelet
// takes it from the runtime (RuntimeConfig).
func (s kubeletSettings) yaml() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
readOnlyPort: 0
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: %s
podLogsDir: %s
volumePluginDir: %s
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
resolvConf: ""
clusterDomain: cluster.local
protectKernelDefaults: true
evictionHard: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusReportFrequency: 10s
syncFrequency: 10s
cgroupRoot: /%s
`, s.Address, s.Port, s.HealthzPort, s.Endpoint, s.PodLogs, s.VolumePlugins, s.Cert, s.Key, s.CA, defaultEvictionHard, s.CgroupRoot)
}

// writeSysctls writes the files a kubelet's mount namespace binds over
// the host sysctls it would set (kubeletCommand), in dir.
func writeSysctls(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, v := range map[string]string{"overcommit_memory": "1", "panic": "10", "panic_on_oops": "1"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// installFlexvolumeDriver installs driver as kubelet's
// virtlet/flexvolume_driver in its volume plugin directory, as make
// install puts it, told where the daemon's admin socket is.
func installFlexvolumeDriver(pluginDir, adminSocket, driver string) error {
	drv := filepath.Join(pluginDir, "virtlet~flexvolume_driver")
	if err := os.MkdirAll(drv, 0o755); err != nil {
		return err
	}
	wrapper := fmt.Sprintf("#!/bin/sh\nVIRTLET_ADMIN_SOCKET=%s exec %s \"$@\"\n", adminSocket, driver)
	return os.WriteFile(filepath.Join(drv, "flexvolume_driver"), []byte(wrapper), 0o755)
}

// kubeletCommand is the shell command, for sh -c in a mount namespace
// of the kubelet's own, that binds the sysctl files over the host's
// and runs the kubelet.
func kubeletCommand(sysctls, kubelet, config, kubeconfig, rootDir string, flags ...string) string {
	return fmt.Sprintf("mount --bind %[1]s/overcommit_memory /proc/sys/vm/overcommit_memory && mount --bind %[1]s/panic /proc/sys/kernel/panic && "+
		"mount --bind %[1]s/panic_on_oops /proc/sys/kernel/panic_on_oops && exec %[2]s --config=%[3]s --kubeconfig=%[4]s --root-dir=%[5]s %[6]s --v=2",
		sysctls, kubelet, config, kubeconfig, rootDir, strings.Join(flags, " "))
}

// defaultEvictionHard are the test kubelets' hard eviction thresholds:
// the node's disk is shared by parallel tests, and memory pressure is
// the tests' own (RestartKubelet).
const defaultEvictionHard = `{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}`

func (k *Kube) waitNodeReady() {
	k.wait("node "+k.Node+" Ready", 3*time.Minute, func() bool {
		out, err := k.Kubectl("get", "node", k.Node, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == "True"
	})
}

// RestartKubelet stops the kubelet, sets top-level keys of its
// configuration (values in YAML: "evictionSoft": `{memory.available:
// "99%"}`) and starts it again, as an operator reconfiguring a node does:
// the pods keep running meanwhile.
func (k *Kube) RestartKubelet(settings map[string]string) {
	k.t.Helper()
	k.stopKubelet()
	config := k.KubeletConfig()
	b, err := os.ReadFile(config)
	if err != nil {
		k.t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if key, _, ok := strings.Cut(line, ": "); ok && settings[key] != "" {
			continue // set below
		}
		out = append(out, line)
	}
	for _, key := range slices.Sorted(maps.Keys(settings)) {
		out = append(out, key+": "+settings[key])
	}
	out = append(out, "")
	if err := os.WriteFile(config, []byte(strings.Join(out, "\n")), 0o644); err != nil {
		k.t.Fatal(err)
	}
	k.kubeletDone = k.start("kubelet", k.kubelet[0], k.kubelet[1:]...)
	k.waitNodeReady()
}

// stopKubelet ends the kubelet (SIGTERM, SIGKILL after 15 s).
func (k *Kube) stopKubelet() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, p := range k.procs {
		if slices.Equal(p.Args, k.kubelet) {
			p.Process.Signal(syscall.SIGTERM)
			select {
			case <-k.kubeletDone:
			case <-time.After(15 * time.Second):
				p.Process.Kill()
				<-k.kubeletDone
			}
			k.procs = slices.Delete(k.procs, i, i+1)
			break
		}
	}
}

// RestartKubeletProcess stops the kubelet and starts it again as it was
// started, reading its configuration file as it is now, without waiting
// for the node: what `systemctl restart kubelet` does on a node. It may
// be called from any goroutine.
func (k *Kube) RestartKubeletProcess() error {
	k.stopKubelet()
	logf, err := os.OpenFile(filepath.Join(k.Dir, "kubelet.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(k.kubelet[0], k.kubelet[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startForLife(cmd); err != nil {
		logf.Close()
		return fmt.Errorf("start kubelet: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	k.mu.Lock()
	k.procs = append(k.procs, cmd)
	k.kubeletDone = done
	k.mu.Unlock()
	return nil
}

// WaitNodeReady waits until the node is Ready.
func (k *Kube) WaitNodeReady() { k.t.Helper(); k.waitNodeReady() }

// KubeletConfig is the kubelet's KubeletConfiguration file.
func (k *Kube) KubeletConfig() string { return filepath.Join(k.Dir, "kubelet.yaml") }

// KubeletKubeconfig is the kubelet's kubeconfig (its node identity).
func (k *Kube) KubeletKubeconfig() string {
	k.t.Helper()
	p := filepath.Join(k.Dir, "kubelet.kubeconfig")
	if _, err := os.Stat(p); err != nil {
		return k.kubeconfig("kubelet")
	}
	return p
}

// MigrationCredentials issues node's certificate for its daemon's live
// migration endpoint (system:node:<node>, as kubelet's client
// certificate), and returns it, its key and the cluster CA.
func (k *Kube) MigrationCredentials(node string) (cert, key, ca string) {
	name := "migration-" + node
	k.issue(name, "system:node:"+node, []string{"system:nodes"}, false, nil)
	pki := filepath.Join(k.Dir, "pki")
	return filepath.Join(pki, name+".crt"), filepath.Join(pki, name+".key"), filepath.Join(pki, "ca.crt")
}

// ClientKubeconfig writes a kubeconfig for a new client certificate of
// user in groups (what a node daemon would be given).
func (k *Kube) ClientKubeconfig(user string, groups ...string) string {
	k.t.Helper()
	k.issue(user, user, groups, false, nil)
	return k.kubeconfig(user)
}

// NodeKubeconfig is a kubeconfig with the node's identity, as kubelet
// has: system:node:<name> in the group system:nodes, which the Node
// authorizer limits to what the pods bound to the node reference.
func (k *Kube) NodeKubeconfig(name string) string {
	k.t.Helper()
	k.issue(name, "system:node:"+k.Node, []string{"system:nodes"}, false, nil)
	return k.kubeconfig(name)
}

// Apply runs kubectl apply on manifests.
func (k *Kube) Apply(manifests string) error {
	cmd := exec.Command(filepath.Join(k.Bin, "kubectl"), "--kubeconfig", k.Kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifests)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply: %v: %s", err, out)
	}
	return nil
}

// Kubectl runs kubectl as the cluster's admin.
func (k *Kube) Kubectl(args ...string) (string, error) {
	out, err := exec.Command(filepath.Join(k.Bin, "kubectl"), append([]string{"--kubeconfig", k.Kubeconfig}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// KubeletGet reads a path of the kubelet's API as the API server does
// (its kubelet client certificate).
func (k *Kube) KubeletGet(path string) (string, error) {
	return k.kubeletCall(http.MethodGet, path, 30*time.Second)
}

// KubeletPost posts to a path of the kubelet's API as the API server does
// (the node proxy refuses a node whose address is loopback, as here),
// waiting up to timeout.
func (k *Kube) KubeletPost(path string, timeout time.Duration) (string, error) {
	return k.kubeletCall(http.MethodPost, path, timeout)
}

func (k *Kube) kubeletCall(method, path string, timeout time.Duration) (string, error) {
	pki := filepath.Join(k.Dir, "pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "apiserver-kubelet-client.crt"), filepath.Join(pki, "apiserver-kubelet-client.key"))
	if err != nil {
		return "", err
	}
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		return "", err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "localhost"}}}
	req, err := http.NewRequest(method, fmt.Sprintf("https://127.0.0.1:%d%s", k.KubeletPort, path), nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("kubelet %s %s: %s", method, path, resp.Status)
	}
	return string(body), err
}

// Log returns a component's log ("etcd", "kube-apiserver", "kubelet").
func (k *Kube) Log(name string) string {
	b, _ := os.ReadFile(filepath.Join(k.Dir, name+".log"))
	return string(b)
}

// start runs a component; the channel closes when it has exited.
func (k *Kube) start(name, bin string, args ...string) <-chan struct{} {
	k.t.Helper()
	// Appended: a restarted component's log follows its earlier one.
	logf, err := os.OpenFile(filepath.Join(k.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		k.t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startForLife(cmd); err != nil {
		k.t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	k.mu.Lock()
	k.procs = append(k.procs, cmd)
	k.mu.Unlock()
	return done
}

func (k *Kube) wait(what string, timeout time.Duration, ready func() bool) {
	k.t.Helper()
	deadline := time.Now().Add(timeout)
	for !ready() {
		if time.Now().After(deadline) {
			k.t.Fatalf("%s not up after %s\nkubelet log tail:\n%s\napiserver log tail:\n%s", what, timeout, tail(k.Log("kubelet"), 3000), tail(k.Log("kube-apiserver"), 2000))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// stop ends the processes, newest first, by PID, removes the kubelet's
// cgroups and unmounts what the kubelet mounted.
func (k *Kube) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := len(k.procs) - 1; i >= 0; i-- {
		p := k.procs[i].Process
		p.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			p.Kill()
		}
	}
	k.procs = nil
	if k.cgroupRoot != "" {
		for _, m := range cgroupMounts() {
			if err := RemoveCgroupTree(filepath.Join(m.dir, k.cgroupRoot)); err != nil {
				k.t.Errorf("the kubelet's cgroups: %v", err)
			}
		}
	}
	if k.rootDir == "" {
		return
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	var under []string
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == k.rootDir || strings.HasPrefix(f[4], k.rootDir+"/")) {
			under = append(under, f[4])
		}
	}
	for i := len(under) - 1; i >= 0; i-- {
		syscall.Unmount(under[i], syscall.MNT_DETACH)
	}
}

// FreePort returns a TCP port free on 127.0.0.1 now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// makePKI writes the cluster's CA, certificates and keys; it returns the
// path of a file in the PKI directory.
func (k *Kube) makePKI() func(string) string {
	k.t.Helper()
	dir := filepath.Join(k.Dir, "pki")
	os.MkdirAll(dir, 0o700)
	path := func(n string) string { return filepath.Join(dir, n) }
	caKey := k.key("ca")
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "virtlet-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		k.t.Fatal(err)
	}
	k.writePEM("ca.crt", "CERTIFICATE", caDER)
	k.ca, _ = x509.ParseCertificate(caDER)
	k.caKey, k.serial = caKey, 1
	k.issue("apiserver", "kube-apiserver", nil, true, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	k.issue("admin", "admin", []string{"system:masters"}, false, nil)
	k.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false, nil)
	k.issue("controller-manager", "system:kube-controller-manager", nil, false, nil)
	k.issue("scheduler", "system:kube-scheduler", nil, false, nil)
	k.issue("kubelet", "system:node:"+k.Node, []string{"system:nodes"}, false, nil)
	k.issue("kubelet-serving", k.Node, nil, true, []string{k.Node, "localhost"})
	sa := k.key("sa")
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		k.t.Fatal(err)
	}
	k.writePEM("sa.pub", "PUBLIC KEY", pub)
	return path
}

// issue writes name.crt and name.key: a certificate of the cluster's CA.
func (k *Kube) issue(name, cn string, orgs []string, server bool, dns []string, ips ...net.IP) {
	key := k.key(name)
	k.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(k.serial), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.DNSNames = dns
		tmpl.IPAddresses = append([]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("198.19.96.1")}, append(k.serverIPs, ips...)...) // the kubernetes Service
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, k.ca, &key.PublicKey, k.caKey)
	if err != nil {
		k.t.Fatal(err)
	}
	k.writePEM(name+".crt", "CERTIFICATE", der)
}

func (k *Kube) key(name string) *ecdsa.PrivateKey {
	k.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		k.t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		k.t.Fatal(err)
	}
	k.writePEM(name+".key", "EC PRIVATE KEY", der)
	return key
}

func (k *Kube) writePEM(name, typ string, der []byte) {
	k.t.Helper()
	if err := os.WriteFile(filepath.Join(k.Dir, "pki", name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		k.t.Fatal(err)
	}
}

// kubeconfig writes a kubeconfig for a client certificate.
func (k *Kube) kubeconfig(user string) string {
	k.t.Helper()
	p := filepath.Join(k.Dir, user+".kubeconfig")
	pki := filepath.Join(k.Dir, "pki")
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: test
  context: {cluster: test, user: %s, namespace: default}
current-context: test
`, k.APIServer, filepath.Join(pki, "ca.crt"), user, filepath.Join(pki, user+".crt"), filepath.Join(pki, user+".key"), user)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		k.t.Fatal(err)
	}
	return p
}
