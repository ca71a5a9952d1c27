package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NodeNet is the network the nodes of a test cluster share: a bridge of
// the run's on the host (198.18.<Index>.0/24, the host .1), through which
// the host routes each node's pod subnet to that node. Nothing is routed
// between it and any other interface.
type NodeNet struct {
	Index  int
	Bridge string
	HostIP string
	nodes  int
}

// NewNodeNet makes the bridge and its rules; everything goes after the
// test.
func NewNodeNet(t testing.TB, index int) *NodeNet {
	t.Helper()
	n := &NodeNet{Index: index, Bridge: fmt.Sprintf("%sc%d", RunBridgePrefix(RunID()), index), HostIP: fmt.Sprintf("198.18.%d.1", index)}
	exec.Command("ip", "link", "del", n.Bridge).Run() // a crashed run's
	mustRun(t, "ip", "link", "add", n.Bridge, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", n.Bridge).Run() })
	mustRun(t, "ip", "addr", "add", n.HostIP+"/24", "dev", n.Bridge)
	mustRun(t, "ip", "link", "set", n.Bridge, "up")
	// Node to node (routed by the host: in and out of the bridge) flows;
	// nothing between the bridge and the rest of the machine.
	rules := [][]string{
		{"FORWARD", "-i", n.Bridge, "!", "-o", n.Bridge, "-j", "DROP"},
		{"FORWARD", "-o", n.Bridge, "!", "-i", n.Bridge, "-j", "DROP"},
		{"FORWARD", "-i", n.Bridge, "-o", n.Bridge, "-j", "ACCEPT"},
	}
	for _, r := range rules {
		mustRun(t, "iptables", append([]string{"-I"}, r...)...)
		t.Cleanup(func() { exec.Command("iptables", append([]string{"-D"}, r...)...).Run() })
	}
	return n
}

// Node is a node of a test cluster on this one machine, isolated as a
// real node is: a network namespace with its own address on the NodeNet
// and its own pod subnet, a mount namespace in which libvirt's
// directories are its own, and its own libvirtd and virtlogd (with a
// host UUID of its own). What runs "on" it (Run, the daemon through
// Wrap) is in both namespaces; its files are the test's, below Dir.
type Node struct {
	Name    string
	IP      string // on the NodeNet
	PodNet  string // its pods' subnet, 198.18.<n>.0/24, routed to it by the host
	PodGW   string
	Dir     string
	ConfDir string // its pods' CNI config (a bridge inside the node)
	netns   string
	// netnsPrefix begins its pods' network namespaces' names, tagged as
	// a TestNetwork's are (the run's, n<pod subnet index>-).
	netnsPrefix string
	pid         int // the process holding its mount namespace
}

// NewNode starts a node on n; podIndex picks its pod subnet. It is
// removed after the test with every domain its libvirtd has.
func (n *NodeNet) NewNode(t testing.TB, podIndex int) *Node {
	t.Helper()
	n.nodes++
	i := n.nodes
	node := &Node{
		Name: fmt.Sprintf("node-%d", i), IP: fmt.Sprintf("198.18.%d.%d", n.Index, 10+i),
		PodNet: fmt.Sprintf("198.18.%d.0/24", podIndex), PodGW: fmt.Sprintf("198.18.%d.1", podIndex),
		Dir: VMDir(t),
		// The run's tag, the network's index and the node's: with its host
		// side's "h", at most 15 bytes, a link name's limit.
		netns:       fmt.Sprintf("%sk%dn%d", RunBridgePrefix(RunID()), n.Index, i),
		netnsPrefix: fmt.Sprintf("%sn%d-", RunBridgePrefix(RunID()), podIndex),
	}
	// The network: a veth from the bridge into the node's namespace.
	exec.Command("ip", "netns", "del", node.netns).Run()
	mustRun(t, "ip", "netns", "add", node.netns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", node.netns).Run() })
	host := node.netns + "h"
	mustRun(t, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	mustRun(t, "ip", "link", "set", host, "master", n.Bridge, "up")
	in := func(args ...string) { mustRun(t, "ip", append([]string{"netns", "exec", node.netns}, args...)...) }
	in("ip", "link", "set", "lo", "up")
	in("ip", "addr", "add", node.IP+"/24", "dev", "eth0")
	in("ip", "link", "set", "eth0", "up")
	in("ip", "route", "add", "default", "via", n.HostIP)
	mustRun(t, "ip", "route", "add", node.PodNet, "via", node.IP)
	t.Cleanup(func() { exec.Command("ip", "route", "del", node.PodNet).Run() })

	// libvirt's directories, its own, with a host UUID of its own.
	lv := filepath.Join(node.Dir, "libvirt")
	for _, d := range []string{"etc", "lib", "cache", "log", "run"} {
		if err := os.MkdirAll(filepath.Join(lv, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The machine's configuration files only: its qemu/ holds the
	// definitions of the machine's persistent domains (other tests'),
	// which a libvirtd loads as its own, and its default network.
	confs, _ := filepath.Glob("/etc/libvirt/*.conf")
	mustRun(t, "cp", append(append([]string{"-p"}, confs...), filepath.Join(lv, "etc"))...)
	uuid, err := os.ReadFile("/proc/sys/kernel/random/uuid")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(lv, "etc", "libvirtd.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "\n# this node's own (migration refuses hosts of one UUID)\nhost_uuid = %q\n", strings.TrimSpace(string(uuid)))
	f.Close()

	// The mount namespace, held by a sleeping shell: libvirt's
	// directories bound over, and a /sys of the node's network namespace
	// (as ip netns exec mounts one) with the machine's cgroups on it, which
	// kubelet and libvirtd manage.
	pidFile, cg := filepath.Join(node.Dir, "holder.pid"), filepath.Join(node.Dir, "cgroup")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	// Its own /var/log too: kubelet's links in /var/log/containers.
	for _, d := range []string{"varlog/libvirt", "varlog/containers", "varlog/pods", "netns"} {
		if err := os.MkdirAll(filepath.Join(node.Dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// And its own /run/netns: its pods' network namespaces are files
	// there, which a node torn down with pods left would leave on the
	// machine's /run.
	script := fmt.Sprintf("mount --bind %[4]s /var/log && mount --bind %[5]s /run/netns && "+
		"mount --bind %[1]s/etc /etc/libvirt && mount --bind %[1]s/lib /var/lib/libvirt && "+
		"mount --bind %[1]s/cache /var/cache/libvirt && mount --bind %[1]s/log /var/log/libvirt && "+
		"mount --bind %[1]s/run /run/libvirt && "+
		"mount --rbind /sys/fs/cgroup %[3]s && mount -t sysfs sysfs /sys && mount --rbind %[3]s /sys/fs/cgroup && umount -l %[3]s && "+
		"echo $$ > %[2]s && exec sleep infinity", lv, pidFile, cg, filepath.Join(node.Dir, "varlog"), filepath.Join(node.Dir, "netns"))
	holder := exec.Command("nsenter", "--net=/run/netns/"+node.netns, "--", "unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script)
	holder.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startForLife(holder); err != nil {
		t.Fatal(err)
	}
	go holder.Wait()
	Eventually(t, 10*time.Second, "the node's namespaces", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		node.pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	mntNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", node.pid))
	t.Cleanup(func() {
		node.destroyDomains(t)
		// Whatever still runs in the node's mount namespace after this
		// (a QEMU its libvirtd lost, a libvirtd whose pid file lied) is
		// the node's, and goes with it.
		defer killNamespace(t, node.Name, mntNS)
		for _, p := range []string{"libvirtd", "virtlogd"} {
			if b, err := os.ReadFile(filepath.Join(lv, "run", p+".pid")); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					// A pid file outlives its process (a killed libvirtd), and
					// pids come round fast here: only the node's own is signalled.
					node.signal(pid, p, syscall.SIGTERM)
					for i := 0; i < 100 && node.owns(pid, p); i++ {
						time.Sleep(50 * time.Millisecond)
					}
					node.signal(pid, p, syscall.SIGKILL)
				}
			}
		}
		node.signal(node.pid, "sleep", syscall.SIGKILL)
		holder.Process.Kill()
	})
	node.Must(t, "virtlogd", "-d", "-p", "/run/libvirt/virtlogd.pid")
	node.StartLibvirtd(t)

	// Its pods' network: a CNI bridge inside the node, its pod subnet.
	node.ConfDir = filepath.Join(node.Dir, "cni")
	if err := os.MkdirAll(node.ConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "pods", "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
`, filepath.Join(node.Dir, "ipam"), node.PodNet, node.PodGW)
	if err := os.WriteFile(filepath.Join(node.ConfDir, "10-pods.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return node
}

// StartLibvirtd starts the node's libvirtd and waits until it answers.
func (node *Node) StartLibvirtd(t testing.TB) {
	t.Helper()
	node.Must(t, "libvirtd", "-d", "-p", "/run/libvirt/libvirtd.pid")
	Eventually(t, 30*time.Second, node.Name+"'s libvirtd", func() bool {
		_, err := node.Run("virsh", "-c", "qemu:///system", "uri")
		return err == nil
	})
}

// KillLibvirtd ends the node's libvirtd with SIGKILL and waits for it to
// go; its VMs' QEMUs run on.
func (node *Node) KillLibvirtd(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(node.Dir, "libvirt", "run", "libvirtd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s's libvirtd.pid: %v", node.Name, err)
	}
	if !node.signal(pid, "libvirtd", syscall.SIGKILL) {
		t.Fatalf("%s's libvirtd.pid names %d, which is not the node's libvirtd", node.Name, pid)
	}
	Eventually(t, 30*time.Second, node.Name+"'s libvirtd gone", func() bool { return !node.owns(pid, "libvirtd") })
}

// owns tells whether pid is a live process named comm in the node's mount
// namespace: a pid read from a file may have gone, and come round to
// another process (pid_max is 32768 here, and make check makes tens of
// thousands).
func (node *Node) owns(pid int, comm string) bool {
	name, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(name)) != comm || !Alive(pid) {
		return false
	}
	ns, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	mine, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", node.pid))
	return err1 == nil && err2 == nil && ns == mine
}

// signal sends sig to pid if it is the node's process named comm.
func (node *Node) signal(pid int, comm string, sig syscall.Signal) bool {
	if !node.owns(pid, comm) {
		return false
	}
	return syscall.Kill(pid, sig) == nil
}

// Wrap is the command prefix that runs a program on the node.
func (node *Node) Wrap() []string {
	return []string{"nsenter", "-t", strconv.Itoa(node.pid), "-m", "-n", "--"}
}

// Run runs a command on the node.
func (node *Node) Run(args ...string) (string, error) {
	out, err := exec.Command("nsenter", append(node.Wrap()[1:], args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// Must is Run, failing the test on an error.
func (node *Node) Must(t testing.TB, args ...string) string {
	t.Helper()
	out, err := node.Run(args...)
	if err != nil {
		t.Fatalf("on %s: %s: %v\n%s", node.Name, strings.Join(args, " "), err, out)
	}
	return out
}

// Domains lists the domains of the node's libvirtd.
func (node *Node) Domains() ([]string, error) {
	out, err := node.Run("virsh", "-c", "qemu:///system", "list", "--all", "--name")
	if err != nil {
		return nil, fmt.Errorf("%s: virsh list: %v: %s", node.Name, err, out)
	}
	return strings.Fields(out), nil
}

// HostUUID is the node's libvirtd's host UUID.
func (node *Node) HostUUID() (string, error) {
	out, err := node.Run("sh", "-c", "virsh -c qemu:///system capabilities | sed -n 's:.*<uuid>\\(.*\\)</uuid>.*:\\1:p' | head -1")
	return out, err
}

// CNIPlugin is the network plugin of a daemon on the node: its pods on
// the node's bridge.
func (node *Node) CNIPlugin(bins string) Plugin {
	return Plugin{Name: "cni", Kind: "network", Binary: filepath.Join(bins, "virtlet-plugin-cni"),
		Config: fmt.Sprintf("{confDir: %q, binDirs: [%q], netnsPrefix: %q}", node.ConfDir, CNIBinDir, node.netnsPrefix)}
}

// killNamespace kills every process in the mount namespace mntNS (as
// /proc/PID/ns/mnt names it), naming each.
func killNamespace(t testing.TB, node, mntNS string) {
	if mntNS == "" {
		return
	}
	self, _ := os.Readlink("/proc/self/ns/mnt")
	if mntNS == self {
		return
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && ns == mntNS {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			t.Logf("%s: killing the leftover process %d (%s)", node, pid, strings.TrimSpace(string(comm)))
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (node *Node) destroyDomains(t testing.TB) {
	names, err := node.Domains()
	if err != nil {
		return
	}
	for _, name := range names {
		t.Logf("%s: removing leftover domain %s", node.Name, name)
		node.Run("virsh", "-c", "qemu:///system", "destroy", name)
		node.Run("virsh", "-c", "qemu:///system", "undefine", "--nvram", name)
	}
}

func mustRun(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}
