package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/harness"
)

// Subnets 198.18.40-49.0/24 belong to the real-VM network suites.

// sockets counts a process's open sockets (the CNI plugin holds one per
// DHCP server).
func sockets(pid int) int {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}

func pluginPID(t *testing.T, c *harness.Crictl, name string) int {
	t.Helper()
	var info struct {
		Plugins map[string]struct {
			PID int `json:"pid"`
		} `json:"plugins"`
	}
	c.JSON(t, &info, "info")
	return info.Plugins[name].PID
}

func ping(t *testing.T, ip string) error {
	t.Helper()
	out, err := exec.Command("ping", "-c", "1", "-W", "3", ip).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s: %v\n%s", ip, err, out)
	}
	return nil
}

// httpGet fetches url from the node, within 10 s.
func httpGet(url string) (string, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), err
}

// sshBanner reads the SSH server's identification line at ip:22.
func sshBanner(ip string) (string, error) {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "22"), 10*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// sshTo runs a command in the guest as the cloud image's default user.
func sshTo(key, ip, command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ssh", "-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
		"debian@"+ip, command).CombinedOutput()
	return string(out), err
}

// cloudTranslation serves the cloud test image as virtlet.cloud/debian-cloud.
func cloudTranslation(t *testing.T) string {
	t.Helper()
	// Put in place once, for the tests that run side by side: a second
	// write while the first test's daemon downloads it would change it
	// under the download.
	cloudServed.Do(func() { cloudServedErr = serveCloud() })
	if cloudServedErr != nil {
		t.Fatal(cloudServedErr)
	}
	tr, err := images.Translation(map[string]string{"debian-cloud": "cloud.qcow2"})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

var (
	cloudServed    sync.Once
	cloudServedErr error
)

// serveCloud copies the cloud test image where the image server serves it.
func serveCloud() error {
	cloud, err := harness.GuestImage("cloud")
	if err != nil {
		return err
	}
	data, err := os.ReadFile(cloud)
	if err != nil {
		return err
	}
	tmp := filepath.Join(imgDir, ".cloud.qcow2.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(imgDir, "cloud.qcow2"))
}

// bridgePorts lists the links enslaved to a test network's bridge: the
// host ends of its pods' veths. Once its pods are gone, none is left;
// unlike the host's whole link list, it is the test's own, whatever
// tests run beside it.
func bridgePorts(t *testing.T, bridge string) []string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show", "master", bridge).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "does not exist") {
			return nil // the bridge goes with its last pod's... or was never made
		}
		t.Fatalf("ip link show master %s: %v %s", bridge, err, out)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			names = append(names, strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0])
		}
	}
	return names
}

// VM pods are members of a dual-stack pod network made by Debian's CNI
// plugins: each VM carries the addresses inspectp reports (the cloud image,
// booted by UEFI with Secure Boot on, both, statically from cloud-init's
// network-config; the tiny one its IPv4
// address by DHCP with VirtletForceDHCPNetworkConfig); Service-style DNAT
// on the host works for them; the host reaches them (ping,
// ssh with the key cloud-init injected); they reach the gateway and each
// other; a daemon crash disturbs none of it; and stopping and removing the
// pods leaves no namespace, link, tap, DHCP listener or address behind.
func TestVMPodsOnThePodNetwork(t *testing.T) {
	parallel(t)
	tn := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 40, DualStack: true})
	cloudTr := cloudTranslation(t)
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(plugins(), tn.Plugin(bins)))
	d.Translate("test-images.yaml", translation)
	d.Translate("cloud.yaml", cloudTr)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	c.Must(t, "pull", tinyRef)
	c.Must(t, "pull", "virtlet.cloud/debian-cloud")
	cni := pluginPID(t, c, "cni")
	baseSockets := sockets(cni)

	keyDir := t.TempDir()
	key := filepath.Join(keyDir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e@virtlet", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}

	// The tiny guest: DHCP only.
	tinyPod, tinyCtr := vmPod(t, d, "net-tiny", map[string]string{"VirtletForceDHCPNetworkConfig": "true"}, 160<<20)
	// kubelet's resolver configuration for a ClusterFirst pod: name server
	// and search domains by DHCP, the options by cloud-init's resolv_conf.
	const clusterDNS = "198.18.43.53"
	tinyPod = withDNS(t, tinyPod, &runtimeapi.DNSConfig{Servers: []string{clusterDNS},
		Searches: []string{"default.svc.cluster.local", "svc.cluster.local"}, Options: []string{"ndots:5", "edns0"}})
	// The cloud guest: static network-config from the CNI result; it boots
	// by UEFI with Secure Boot on a q35 machine (Debian's signed shim, GRUB
	// and kernel).
	cloudPod, _ := vmPod(t, d, "net-cloud", map[string]string{"VirtletVCPUCount": "1", "VirtletSSHKeys": string(pub),
		"VirtletFirmware": "uefi", "VirtletSecureBoot": "true", "VirtletMachineType": "q35"}, 512<<20)
	cloudCtr := harness.WriteJSON(t, d.Dir, "net-cloud-ctr.json", map[string]interface{}{
		"metadata": map[string]string{"name": "net-cloud"}, "image": map[string]string{"image": "virtlet.cloud/debian-cloud"},
		"log_path": "net-cloud/0.log", "linux": map[string]interface{}{"resources": map[string]interface{}{"memory_limit_in_bytes": 512 << 20}},
	})

	tinySB := c.Must(t, "runp", tinyPod)
	cloudSB := c.Must(t, "runp", cloudPod)
	t.Cleanup(func() { c.Run("rmp", "-f", tinySB, cloudSB) })
	tinyIPs, cloudIPs := c.PodNetwork(t, tinySB).IPs, c.PodNetwork(t, cloudSB).IPs
	_, sub4, _ := net.ParseCIDR(tn.Subnet)
	_, sub6, _ := net.ParseCIDR(tn.Subnet6)
	in := func(ips []string, i int, sub *net.IPNet) bool {
		return len(ips) == 2 && sub.Contains(net.ParseIP(ips[i]))
	}
	if !in(tinyIPs, 0, sub4) || !in(tinyIPs, 1, sub6) || !in(cloudIPs, 0, sub4) || !in(cloudIPs, 1, sub6) {
		t.Fatalf("pod IPs: tiny %v, cloud %v; want an address in %s and one in %s each", tinyIPs, cloudIPs, tn.Subnet, tn.Subnet6)
	}
	tinyIP, cloudIP, cloudIP6 := tinyIPs[0], cloudIPs[0], cloudIPs[1]

	cloudID := c.Must(t, "create", cloudSB, cloudCtr, cloudPod)
	c.Must(t, "start", cloudID)
	cloudStart := time.Now()
	tinyID := c.Must(t, "create", tinySB, tinyCtr, tinyPod)
	c.Must(t, "start", tinyID)

	logs := waitLog(t, c, tinyID, "@@TINY-READY", 3*time.Minute)
	bound := fmt.Sprintf("@@DHCP-BOUND iface=eth0 ip=%s mask=24 router=%s", tinyIP, tn.Gateway)
	if !strings.Contains(logs, bound) || !strings.Contains(logs, "hostname=net-tiny") {
		t.Errorf("the tiny guest's DHCP lease is not the pod's address (want %q):\n%s", bound, logs)
	}
	if !strings.Contains(logs, "@@PING-GW-OK gw="+tn.Gateway) {
		t.Errorf("the tiny guest does not reach its gateway:\n%s", logs)
	}
	if want := "dns=" + clusterDNS + " search=default.svc.cluster.local svc.cluster.local "; !strings.Contains(logs, want) {
		t.Errorf("the tiny guest's DHCP lease lacks the pod's DNS (want %q):\n%s", want, logs)
	}
	resolv := c.Must(t, "exec", "-s", "--timeout", "30", tinyID, "cat", "/etc/resolv.conf")
	for _, want := range []string{"nameserver " + clusterDNS, "search default.svc.cluster.local svc.cluster.local", "options edns0 ndots:5"} {
		if !strings.Contains(resolv, want) {
			t.Errorf("the tiny guest's resolv.conf lacks %q:\n%s", want, resolv)
		}
	}
	// virtletctl status's answer (the daemon's own exec command): the
	// guest agent reports the pod's address on the VM's NIC.
	var st vmtools.VMStatus
	if err := json.Unmarshal([]byte(c.Must(t, "exec", tinyID, vmtools.Status)), &st); err != nil {
		t.Fatalf("%s: %v", vmtools.Status, err)
	}
	if st.State != "running" || st.Guest == nil || st.Guest.Hostname != "net-tiny" || st.Guest.Kernel == "" {
		t.Errorf("%s: %+v (guest %+v)", vmtools.Status, st, st.Guest)
	} else if !slices.ContainsFunc(st.Guest.Interfaces, func(i ports.GuestInterface) bool { return slices.Contains(i.Addresses, tinyIP+"/24") }) {
		t.Errorf("the guest agent does not report the pod's address %s: %+v", tinyIP, st.Guest.Interfaces)
	}
	if strings.Contains(logs, "----- /ci/network-config") {
		t.Errorf("VirtletForceDHCPNetworkConfig: the cloud-init media still has network-config")
	}
	if err := ping(t, tinyIP); err != nil {
		t.Errorf("host → tiny VM: %v", err)
	}

	// ssh into the cloud guest at the address inspectp reports.
	var out string
	deadline := time.Now().Add(8 * time.Minute)
	for {
		out, err = sshTo(key, cloudIP, "echo ssh-ok")
		if err == nil && strings.Contains(out, "ssh-ok") {
			break
		}
		console, _, _ := c.Run("logs", cloudID)
		if time.Now().After(deadline) || (strings.Contains(console, "finished at") && strings.Contains(out, "Permission denied")) {
			t.Fatalf("no ssh to the cloud VM at %s after %s: %v %s\nconsole:\n%s", cloudIP, time.Since(cloudStart), err, out, console)
		}
		time.Sleep(3 * time.Second)
	}
	t.Logf("ssh into the cloud VM %s after %s", cloudIP, time.Since(cloudStart).Round(time.Second))
	// A Service address as kube-proxy makes one: the host DNATs it to the
	// tiny VM. The cloud VM reaches it through its gateway (br_netfilter is
	// on here, as on nodes: the VM's hop through its host bridge must not
	// be NATed or filtered on the way).
	const serviceIP = "198.18.43.10"
	dnat := []string{"PREROUTING", "-t", "nat", "-d", serviceIP, "-p", "icmp", "-j", "DNAT", "--to-destination", tinyIP}
	if out, err := exec.Command("iptables", append([]string{"-I"}, dnat...)...).CombinedOutput(); err != nil {
		t.Fatalf("iptables: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("iptables", append([]string{"-D"}, dnat...)...).Run() })
	out, err = sshTo(key, cloudIP, fmt.Sprintf(
		"ip -o addr show dev eth0; ip -6 route show default; ping -c 1 -W 3 %s >/dev/null && echo gw-ok; "+
			"ping -c 1 -W 3 %s >/dev/null && echo peer-ok; ping -6 -c 1 -W 3 %s >/dev/null && echo gw6-ok; "+
			"ping -c 1 -W 3 %s >/dev/null && echo service-ok; hostname; "+
			"echo secureboot=$(tail -c 1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c | od -An -tu1 | tr -d ' ')",
		tn.Gateway, tinyIP, tn.Gateway6, serviceIP))
	if err != nil {
		t.Fatalf("in the cloud VM: %v\n%s", err, out)
	}
	for _, want := range []string{"inet " + cloudIP + "/24", "inet6 " + cloudIP6 + "/64", "via " + tn.Gateway6, "gw-ok", "peer-ok", "gw6-ok", "service-ok", "net-cloud",
		"secureboot=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the cloud VM lacks %q:\n%s", want, out)
		}
	}
	if err := ping(t, cloudIP6); err != nil {
		t.Errorf("host → cloud VM over IPv6: %v", err)
	}

	// A daemon crash (its plugins die with it): the VMs keep their network;
	// the CNI plugin, restarted, serves their leases again.
	if got := sockets(cni); got < baseSockets+2 {
		t.Errorf("the CNI plugin holds %d sockets with two pods up, %d before: no DHCP listeners?", got, baseSockets)
	}
	d.Kill()
	d.Start()
	cni = pluginPID(t, c, "cni")
	harness.Eventually(t, 20*time.Second, "DHCP servers back", func() bool { return sockets(cni) >= baseSockets+2 })
	for _, ip := range []string{tinyIP, cloudIP, cloudIP6} {
		if err := ping(t, ip); err != nil {
			t.Errorf("after a daemon restart: %v", err)
		}
	}
	if out, err := sshTo(key, cloudIP, "ping -c 1 -W 3 "+tinyIP+" >/dev/null && echo peer-ok"); err != nil || !strings.Contains(out, "peer-ok") {
		t.Errorf("after a daemon restart, VM → VM: %v %s", err, out)
	}

	for _, ctr := range []string{tinyID, cloudID} {
		c.Must(t, "stop", "--timeout", "60", ctr)
	}
	for _, sb := range []string{tinySB, cloudSB} {
		c.Must(t, "stopp", sb)
	}
	for _, sb := range []string{tinySB, cloudSB} {
		if _, err := os.Stat("/var/run/netns/" + tn.NetNS(sb)); !os.IsNotExist(err) {
			t.Errorf("netns of %s left: %v", sb[:12], err)
		}
	}
	if left := bridgePorts(t, tn.Bridge); len(left) != 0 {
		t.Errorf("pod links left on the test network's bridge after stopp: %v", left)
	}
	if held := tn.Allocated(); len(held) != 0 {
		t.Errorf("host-local still holds %v", held)
	}
	if got := sockets(cni); got != baseSockets {
		t.Errorf("the CNI plugin holds %d sockets after stopp, %d before the pods: a DHCP listener is left", got, baseSockets)
	}
	c.Must(t, "rmp", tinySB, cloudSB)
	if recs, _ := os.ReadDir(filepath.Join(d.StateDir, "plugins", "cni", "pods")); len(recs) != 0 {
		t.Errorf("CNI plugin records left: %v", recs)
	}
	assertNothingLeft(t, d, c)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A pod with two interfaces (a meta plugin over two bridge networks that
// returns Multus's result: the first network's alone, net1 only in the pod's
// namespace): the VM gets two NICs, each takes its pod interface's address
// by DHCP, inspectp lists both, and the host reaches the VM on both.
func TestVMWithTwoPodInterfaces(t *testing.T) {
	parallel(t)
	first := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 41})
	second := harness.NewTestNetwork(t, harness.NetworkOptions{Index: 42})
	metaBin := buildCNIPlugin(t, "virtlet-test-cni-multi", "github.com/virtlet/virtlet/testing/cnimulti")
	confDir := t.TempDir()
	delegate := func(tn *harness.TestNetwork) string {
		return fmt.Sprintf(`{"type": "bridge", "bridge": %q, "isGateway": true, "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}}`,
			tn.Bridge, tn.IPAMDir, tn.Subnet)
	}
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "virtlet-two", "type": "virtlet-test-cni-multi", "delegates": [%s, %s]}`,
		delegate(first), delegate(second))
	if err := os.WriteFile(filepath.Join(confDir, "10-two.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	d, c := daemonOnCNI(t, confDir, metaBin, first.NetNSPrefix)

	podJSON, ctrJSON := vmPod(t, d, "two-nics", nil, 160<<20)
	sb := c.Must(t, "runp", podJSON)
	t.Cleanup(func() { c.Run("rmp", "-f", sb) })
	ips := c.PodNetwork(t, sb).IPs
	if len(ips) != 2 {
		t.Fatalf("inspectp IPs %v: want two addresses", ips)
	}
	ip0, ip1 := ips[0], ips[1]
	_, sub0, _ := net.ParseCIDR(first.Subnet)
	_, sub1, _ := net.ParseCIDR(second.Subnet)
	if !sub0.Contains(net.ParseIP(ip0)) || !sub1.Contains(net.ParseIP(ip1)) {
		t.Fatalf("pod IPs %s, %s: want one in %s and one in %s", ip0, ip1, first.Subnet, second.Subnet)
	}
	ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
	c.Must(t, "start", ctr)
	logs := waitLog(t, c, ctr, "@@TINY-READY", 3*time.Minute)
	for _, want := range []string{
		fmt.Sprintf("@@DHCP-BOUND iface=eth0 ip=%s mask=24 router=%s ", ip0, first.Gateway),
		fmt.Sprintf("@@DHCP-BOUND iface=eth1 ip=%s mask=24 router= ", ip1),
		"@@PING-GW-OK gw=" + first.Gateway,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("console lacks %q:\n%s", want, logs)
		}
	}
	for _, ip := range []string{ip0, ip1} {
		if err := ping(t, ip); err != nil {
			t.Errorf("host → VM: %v", err)
		}
	}
	delegates := map[string]*harness.TestNetwork{"virtlet-two-0": first, "virtlet-two-1": second}
	for name, tn := range delegates {
		if held := tn.AllocatedAs(name); len(held) != 1 {
			t.Errorf("host-local holds %v in %s while the pod runs, want its address", held, name)
		}
	}
	c.Must(t, "rmp", "-f", sb)
	for name, tn := range delegates {
		if held := tn.AllocatedAs(name); len(held) != 0 {
			t.Errorf("host-local still holds %v in %s", held, name)
		}
	}
	assertNothingLeft(t, d, c)
}

// buildCNIPlugin builds a test CNI plugin (package pkg) as name into a
// directory of the test's, which it returns.
func buildCNIPlugin(t *testing.T, name, pkg string) string {
	t.Helper()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg)
	build.Dir = harness.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the CNI plugin %s: %v\n%s", name, err, out)
	}
	return dir
}

// daemonOnCNI starts a daemon with the shipped plugins and a CNI plugin
// reading confDir, the plugins in pluginDir before Debian's, its pod
// namespaces named with netnsPrefix; its crictl has pulled the tiny guest.
func daemonOnCNI(t *testing.T, confDir, pluginDir, netnsPrefix string) (*harness.Daemon, *harness.Crictl) {
	t.Helper()
	cni := harness.Plugin{Name: "cni", Kind: "network", Binary: filepath.Join(bins, "virtlet-plugin-cni"),
		Config: fmt.Sprintf("{confDir: %q, binDirs: [%q, %q], netnsPrefix: %q}", confDir, pluginDir, harness.CNIBinDir, netnsPrefix)}
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), append(plugins(), cni))
	d.Translate("test-images.yaml", translation)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	c.Must(t, "pull", tinyRef)
	return d, c
}
