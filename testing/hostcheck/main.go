// Command hostcheck keeps the runs of make check apart on one machine
// (testing/check.sh, which holds the machine's check lock while it runs).
// Everything a run makes on the host carries its id (harness.RunEnv): its
// temporary directory harness.RunDir(id), below which are the VMs' disks,
// the daemons' state, the kubelets' directories and every mount of theirs;
// its links (bridges, veths: harness.RunBridgePrefix), the firewall rules
// naming them or its CNI networks, kubelet's /var/log/containers links
// into its pod log directory, its kubelets' cgroup roots
// (harness.KubeletCgroupRoot).
//
// kubelet and kube-proxy hard-code the names of their host objects
// (KUBE-* chains, the nftables tables "kube-proxy"), so no run's id can be
// in them, and begin removes none (they may be the host's own cluster's):
// the suites remove what they made, begin records what there is, and end
// fails on any that were not there at its begin, unless a cluster of the
// host's own runs (which makes such objects as it goes). Runs are kept
// apart there by the machine's check lock alone.
//
//	hostcheck begin ID FILE   remove what earlier runs left (found by their
//	                          tags, nothing else), record the host's modes
//	                          in FILE, install the CNI plugin's host-bridge
//	                          rules for the check's suites
//	                          (restored by end as begin found them)
//	hostcheck end ID FILE     fail naming whatever run ID left on the host
//	                          (its directory aside: check.sh removes it
//	                          last), or a mode that is not as FILE recorded
//	hostcheck left ID         print what run ID left on the host, its
//	                          directory included, and fail if anything
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"

	"github.com/virtlet/virtlet/adapters/cni"
	"github.com/virtlet/virtlet/adapters/posixacl"
	"github.com/virtlet/virtlet/testing/harness"
)

// runID is a run's id: six hex digits (testing/check.sh makes them).
// Everything is found by it; an empty one would name every link, process
// and rule of the host.
var runID = regexp.MustCompile(`^[0-9a-f]{6}$`)

func main() {
	if len(os.Args) >= 3 && !runID.MatchString(os.Args[2]) {
		fmt.Fprintf(os.Stderr, "hostcheck: the run id %q is not six hex digits (VIRTLET_RUN, as testing/check.sh makes it)\n", os.Args[2])
		os.Exit(2)
	}
	if len(os.Args) == 3 && os.Args[1] == "left" {
		// What run ID left on the host (make cluster-down's test).
		if left := leftBy(os.Args[2], true); len(left) > 0 {
			fmt.Println(strings.Join(left, "\n"))
			os.Exit(1)
		}
		return
	}
	if len(os.Args) != 4 || (os.Args[1] != "begin" && os.Args[1] != "end") {
		fmt.Fprintln(os.Stderr, "usage: hostcheck begin|end ID FILE, or hostcheck left ID")
		os.Exit(2)
	}
	id, file := os.Args[2], os.Args[3]
	var err error
	if os.Args[1] == "begin" {
		err = begin(id, file)
	} else {
		err = end(id, file)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostcheck:", err)
		os.Exit(1)
	}
}

// begin removes every earlier run's leftovers and records the modes.
func begin(id, file string) error {
	// Domains outlive libvirtd in its persistent configuration: they are
	// listed only with libvirtd up (as the suites run it).
	if err := harness.EnsureLibvirt(); err != nil {
		return fmt.Errorf("libvirtd, to list the domains runs left: %w", err)
	}
	runs, err := filepath.Glob(harness.RunDir("*"))
	if err != nil {
		return err
	}
	earlier := map[string]bool{}
	for _, dir := range runs {
		if other := strings.TrimPrefix(dir, harness.RunDir("")); other != id {
			earlier[other] = true
		}
	}
	for _, l := range links() {
		if other := runOfLink(l); other != "" && other != id {
			earlier[other] = true
		}
	}
	for other := range podLinks() {
		if other != id {
			earlier[other] = true
		}
	}
	// Kubelets' cgroup roots outlive a run whose directory went (a
	// container a killed test left kept one busy).
	for _, cg := range harness.RunCgroups("*") {
		if m := runCgroup.FindStringSubmatch(filepath.Base(cg)); m != nil && m[1] != id {
			earlier[m[1]] = true
		}
	}
	for other := range earlier {
		left := leftBy(other, true)
		if len(left) == 0 {
			continue
		}
		if pid := runningAs(other); pid != 0 {
			// A run beside this one (an engineer's go test, not a make
			// check, which holds the machine's lock), not one that was
			// killed: what it made is in use.
			fmt.Printf("hostcheck: run %s is still running (process %d has VIRTLET_RUN=%s); what it made stays\n", other, pid, other)
			continue
		}
		fmt.Printf("hostcheck: removing what run %s left: %s\n", other, strings.Join(left, "; "))
		remove(other)
		if still := leftBy(other, true); len(still) > 0 {
			return fmt.Errorf("run %s left what cannot be removed: %s", other, strings.Join(still, "; "))
		}
	}
	// ACL entries a killed run's VM users kept on libvirtd's directories
	// (the test daemons' users are a range of their own). An entry names
	// no run: while another run goes on, its VMs' grants are in use, and
	// all stay.
	live := liveRuns(id)
	if len(live) > 0 {
		fmt.Printf("hostcheck: runs %v are still running: the test VM users' grants stay\n", live)
	}
	for _, p := range modePaths {
		if len(live) > 0 {
			break
		}
		users, _ := posixacl.Users(p)
		for uid := range users {
			if harness.TestUsers.Contains(int(uid)) {
				fmt.Printf("hostcheck: removing the grant of %s to a test VM's user %d\n", p, uid)
				if err := posixacl.Revoke(p, uid); err != nil {
					return fmt.Errorf("remove a test VM user's grant on %s: %w", p, err)
				}
			}
		}
	}
	kube := kubeObjects()
	if len(kube) > 0 {
		fmt.Printf("hostcheck: the host has objects of kubelet's or kube-proxy's names, which carry no run's tag and stay: %s\n", strings.Join(kube, "; "))
	}
	modes, err := hostModes()
	if err != nil {
		return err
	}
	// The CNI plugin's host-bridge rules, for the whole check: each
	// suite's TestMain removes them if it found them absent, which pulls
	// them from under the VMs of a suite running beside it (check.sh runs
	// bench-smoke beside unit and integration). Found installed, every
	// TestMain leaves them; end restores what begin found.
	rules := cni.HostBridgeRuleState()
	if err := cni.EnsureHostBridgeRules(); err != nil {
		return fmt.Errorf("the host-bridge rules for the check: %w", err)
	}
	data, _ := json.MarshalIndent(hostState{Modes: modes, Kube: kube, BridgeRules: rules}, "", "  ")
	return os.WriteFile(file, data, 0o644)
}

// hostState is what begin records for end.
type hostState struct {
	Modes map[string]pathMode
	// Kube are the host's objects of kubelet's and kube-proxy's fixed
	// names (kubeObjects).
	Kube []string
	// BridgeRules are the host-bridge rules installed at begin, per tool
	// (cni.HostBridgeRuleState).
	BridgeRules map[string][]bool
}

// end checks that run id left nothing and the modes are as recorded.
func end(id, file string) error {
	if err := harness.EnsureLibvirt(); err != nil {
		return fmt.Errorf("libvirtd, to list the domains the run left: %w", err)
	}
	var problems []string
	if left := leftBy(id, false); len(left) > 0 {
		problems = append(problems, "the run left on the host: "+strings.Join(left, "; "))
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("the host's modes at the start: %w", err)
	}
	var state hostState
	if err := json.Unmarshal(data, &state); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	before := state.Modes
	if state.BridgeRules != nil {
		cni.RestoreHostBridgeRules(state.BridgeRules)
	}
	if host := hostCluster(); host != "" {
		fmt.Printf("hostcheck: %s runs on the host: its KUBE-* chains are not checked\n", host)
	} else {
		for _, o := range kubeObjects() {
			if !slices.Contains(state.Kube, o) {
				problems = append(problems, "kubelet's or kube-proxy's "+o+", made during the run")
			}
		}
	}
	now, err := hostModes()
	if err != nil {
		return err
	}
	live := liveRuns(id)
	for _, p := range modePaths {
		was, is := before[p], now[p]
		switch {
		case was == is:
		case was.Missing:
			// Made by the software under test where a node has it too
			// (/var/run/netns, kubelet's log directories).
			fmt.Printf("hostcheck: %s was made (%s)\n", p, is)
		case was.Mode == is.Mode && was.UID == is.UID && was.GID == is.GID && !was.Missing && !is.Missing && len(live) > 0:
			// Only ACL entries differ, while another run goes on: its
			// VMs' grants, or this run's, which no entry tells apart.
			fmt.Printf("hostcheck: %s has ACL entries %q, had %q: not judged while runs %v go on\n", p, is.ACL, was.ACL, live)
		case was.Mode == is.Mode && was.UID == is.UID && was.GID == is.GID && !was.Missing && !is.Missing:
			// Only ACL entries differ: a VM user's grant that nothing
			// revoked. Reported, and removed so the next run starts clean.
			problems = append(problems, fmt.Sprintf("%s has ACL entries %q, had %q", p, is.ACL, was.ACL))
			users, _ := posixacl.Users(p)
			for uid := range users {
				if !slices.Contains(strings.Fields(was.ACL), fmt.Sprintf("user:%d:%o", uid, users[uid])) {
					posixacl.Revoke(p, uid)
				}
			}
		default:
			problems = append(problems, fmt.Sprintf("%s was %s, is %s", p, was, is))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "\n  "))
	}
	fmt.Printf("hostcheck: run %s left nothing on the host; the host's modes are as they were (%d paths)\n", id, len(modePaths))
	return nil
}

// leftBy lists what of run id is on the host, its directory too when
// withDir.
func leftBy(id string, withDir bool) []string {
	dir := harness.RunDir(id)
	var left []string
	add := func(kind string, names []string) {
		if len(names) > 0 {
			left = append(left, fmt.Sprintf("%s %s", kind, strings.Join(names, " ")))
		}
	}
	add("domains", harness.DomainsMentioning(dir))
	add("processes", processesMentioning(dir))
	add("mounts", mountsBelow(dir))
	add("loop devices", loopsBelow(dir))
	netns, podLinks := podNetworkOf(dir)
	add("network namespaces", netns)
	add("pod links", podLinks)
	var own []string
	for _, l := range links() {
		if runOfLink(l) == id {
			own = append(own, l)
		}
	}
	add("links", own)
	add("pod links outside their namespace", podLinksOf(id))
	add("network namespaces", namespacesOf(id))
	add("firewall rules", rulesNaming(harness.RunBridgePrefix(id)))
	add("container log links", logLinksInto(dir))
	add("kubelet cgroups", harness.RunCgroups(id))
	if _, err := os.Stat(dir); err == nil && withDir {
		left = append(left, "directory "+dir)
	}
	return left
}

// remove removes what run id left, in the order that lets each go:
// domains (their QEMUs), processes, network namespaces and pod links,
// loop devices, mounts, kubelets' cgroups, links and the rules naming the
// run, kubelet's log links, the directory.
func remove(id string) {
	dir := harness.RunDir(id)
	for _, name := range harness.DomainsMentioning(dir) {
		harness.Virsh("destroy", name)
		harness.Virsh("undefine", "--nvram", name)
	}
	for _, pid := range processesMentioning(dir) {
		var n int
		fmt.Sscan(pid, &n)
		syscall.Kill(n, syscall.SIGKILL)
	}
	netns, podLinks := podNetworkOf(dir)
	for _, ns := range netns {
		exec.Command("ip", "netns", "delete", ns).Run()
	}
	for _, l := range podLinks {
		exec.Command("ip", "link", "del", l).Run()
	}
	for _, dev := range loopsBelow(dir) {
		exec.Command("losetup", "-d", dev).Run()
	}
	harness.UnmountBelow(dir)
	for _, cg := range harness.RunCgroups(id) {
		harness.RemoveCgroupTree(cg)
	}
	for _, l := range links() {
		if runOfLink(l) == id {
			exec.Command("ip", "link", "del", l).Run()
		}
	}
	for _, l := range podLinksOf(id) {
		exec.Command("ip", "link", "del", l).Run()
	}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		harness.RemoveRules(ipt, harness.RulesMentioning(ipt, harness.RunBridgePrefix(id)))
	}
	for _, ns := range namespacesOf(id) {
		exec.Command("ip", "netns", "delete", ns).Run()
	}
	for _, l := range logLinksInto(dir) {
		os.Remove(l)
	}
	os.RemoveAll(dir)
}

// processesMentioning lists the processes whose command line or working
// directory is below dir, but this one.
func processesMentioning(dir string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid := e.Name()
		if pid == fmt.Sprint(os.Getpid()) || strings.Trim(pid, "0123456789") != "" {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		cwd, _ := os.Readlink(filepath.Join("/proc", pid, "cwd"))
		if strings.Contains(string(cmdline), dir+"/") || cwd == dir || strings.HasPrefix(cwd, dir+"/") {
			out = append(out, pid)
		}
	}
	return out
}

func mountsBelow(dir string) []string {
	mounts, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	var out []string
	for _, m := range mounts {
		out = append(out, m.Mountpoint)
	}
	return out
}

// loopsBelow lists the loop devices backed by a file below dir.
func loopsBelow(dir string) []string {
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		return nil
	}
	var devs []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[1], dir+"/") {
			devs = append(devs, f[0])
		}
	}
	return devs
}

// podNetworkOf lists the network namespaces and the host links (each
// interface's bridge and veth) that the CNI plugins of the run's daemons
// recorded for their pods and that still exist.
func podNetworkOf(dir string) (netns, links []string) {
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		// The daemons' CNI records (plugins/cni/) and those of the CNI
		// adapter's own tests.
		if err != nil || e.IsDir() || !strings.HasSuffix(p, ".json") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		var rec struct {
			NetNS string `json:"netns"`
			Links []struct {
				HostBridge string `json:"hostBridge"`
				HostVeth   string `json:"hostVeth"`
			} `json:"links"`
		}
		if json.Unmarshal(data, &rec) != nil {
			return nil
		}
		if strings.HasPrefix(rec.NetNS, "/var/run/netns/") || strings.HasPrefix(rec.NetNS, "/run/netns/") {
			if _, err := os.Stat(rec.NetNS); err == nil {
				netns = append(netns, filepath.Base(rec.NetNS))
			}
		}
		for _, l := range rec.Links {
			for _, name := range []string{l.HostBridge, l.HostVeth} {
				if name != "" && exec.Command("ip", "link", "show", "dev", name).Run() == nil {
					links = append(links, name)
				}
			}
		}
		return nil
	})
	return netns, links
}

// links lists the host's network links (bridges, veths...).
func links() []string {
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		return nil
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			names = append(names, name)
		}
	}
	return names
}

// podLinks lists the host links of the suites' pods by run: the CNI
// plugin aliases a VM's host bridge and veth with the pod's network
// namespace, which a test network names with the run (podNetNSName).
func podLinks() map[string][]string {
	all, err := netlink.LinkList()
	if err != nil {
		return nil
	}
	out := map[string][]string{}
	for _, l := range all {
		if m := podNetNSName.FindStringSubmatch(l.Attrs().Alias); m != nil {
			out[m[1]] = append(out[m[1]], l.Attrs().Name)
		}
	}
	return out
}

// podLinksOf lists the host links of run id's pods.
func podLinksOf(id string) []string {
	links := podLinks()[id]
	sort.Strings(links)
	return links
}

// runOfLink is the run id in the name of a link the suites made
// (harness.RunBridgePrefix, then up to seven lower-case letters or
// digits: a link name's 15 bytes; harness.Node's namespaces and veths are
// k<net>n<node>[h]), or "".
var linkName = regexp.MustCompile(`^vt([0-9a-f]{6})[0-9a-z]{1,7}$`)

func runOfLink(name string) string {
	if m := linkName.FindStringSubmatch(name); m != nil {
		return m[1]
	}
	return ""
}

// podNetNSName is the name of a pod's network namespace that a test
// network's CNI plugin made (harness.TestNetwork.NetNSPrefix: the run's
// links' prefix, n<index>-, the sandbox ID's start).
var podNetNSName = regexp.MustCompile(`^vt([0-9a-f]{6})n[0-9]{1,3}-[0-9a-f]{1,16}$`)

// namespacesOf lists the named network namespaces of the run's own tests
// (named as its links are) and of its test networks' pods.
func namespacesOf(id string) []string {
	entries, _ := os.ReadDir("/var/run/netns")
	var out []string
	for _, e := range entries {
		m := podNetNSName.FindStringSubmatch(e.Name())
		if runOfLink(e.Name()) == id || (m != nil && m[1] == id) {
			out = append(out, e.Name())
		}
	}
	return out
}

// rulesNaming lists the firewall rules, in every table, that name one of
// the run's links or CNI networks.
func rulesNaming(prefix string) []string {
	var out []string
	for _, ipt := range []string{"iptables", "ip6tables"} {
		for _, r := range harness.RulesMentioning(ipt, prefix) {
			out = append(out, fmt.Sprintf("%s -t %s -A %s", ipt, r.Table, r.Spec))
		}
	}
	return out
}

// containerLogDir is where kubelet links each container's log (a path it
// hard-codes); the links of a run's kubelets point into its pod log
// directory, below the run's directory.
const containerLogDir = "/var/log/containers"

func logLinksInto(dir string) []string {
	entries, _ := os.ReadDir(containerLogDir)
	var out []string
	for _, e := range entries {
		p := filepath.Join(containerLogDir, e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, dir+"/") {
			out = append(out, p)
		}
	}
	return out
}

// kubeObjects lists the host objects of the names kubelet and kube-proxy
// hard-code: KUBE-* chains, the nftables tables "kube-proxy".
func kubeObjects() []string {
	var out []string
	for _, ipt := range []string{"iptables", "ip6tables"} {
		for table, chains := range harness.ChainsWithPrefix(ipt, "KUBE-") {
			for _, c := range chains {
				out = append(out, fmt.Sprintf("%s -t %s chain %s", ipt, table, c))
			}
		}
	}
	for _, t := range harness.KubeProxyTables() {
		out = append(out, "nftables table "+t)
	}
	slices.Sort(out)
	return out
}

// hostCluster names a process of a Kubernetes node running on the host
// (the run's own have stopped by its end), or "".
func hostCluster() string {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		switch c := strings.TrimSpace(string(comm)); c {
		case "kubelet", "kube-proxy", "k3s-server", "k3s-agent", "kubelite", "k0s":
			return c
		}
	}
	return ""
}

// modePaths are the host paths whose mode and owner the suites must leave
// as they found them: what libvirt, QEMU's users, kubelet and the CNI
// plugins are given.
var modePaths = []string{
	"/dev/kvm", "/dev/hugepages", "/tmp", "/run", "/var/run/netns",
	"/var/lib/libvirt", "/var/lib/libvirt/qemu", "/var/lib/libvirt/images", "/var/lib/libvirt/qemu/channel",
	"/var/lib/libvirt/qemu/channel/target", "/var/cache/libvirt", "/run/libvirt", "/var/log/libvirt",
	"/var/log/libvirt/qemu", "/var/log/containers", "/var/log/pods", "/run/virtlet", "/etc/cni", "/etc/cni/net.d",
}

// pathMode is a path's type, permissions, owner and named ACL entries
// (the daemon grants VM users libvirtd's directories and /dev/kvm, and
// must take every entry back), or that it is missing.
type pathMode struct {
	Missing  bool   `json:"missing,omitempty"`
	Mode     uint32 `json:"mode,omitempty"` // os.FileMode
	UID, GID uint32
	ACL      string `json:"acl,omitempty"` // "user:UID:PERM ..." sorted
}

func (m pathMode) String() string {
	if m.Missing {
		return "missing"
	}
	s := fmt.Sprintf("%s %d:%d", os.FileMode(m.Mode), m.UID, m.GID)
	if m.ACL != "" {
		s += " " + m.ACL
	}
	return s
}

// namedEntries lists a path's named user ACL entries.
func namedEntries(p string) string {
	users, err := posixacl.Users(p)
	if err != nil {
		return ""
	}
	var out []string
	for uid, perm := range users {
		out = append(out, fmt.Sprintf("user:%d:%o", uid, perm))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// hostModes reads each path's mode.
func hostModes() (map[string]pathMode, error) {
	out := map[string]pathMode{}
	for _, p := range modePaths {
		st, err := os.Stat(p)
		switch {
		case os.IsNotExist(err):
			out[p] = pathMode{Missing: true}
		case err != nil:
			return nil, err
		default:
			sys := st.Sys().(*syscall.Stat_t)
			out[p] = pathMode{Mode: uint32(st.Mode()), UID: sys.Uid, GID: sys.Gid, ACL: namedEntries(p)}
		}
	}
	return out, nil
}

// runCgroup is a kubelet cgroup root's name (harness.KubeletCgroupRoot),
// with its run's id.
var runCgroup = regexp.MustCompile(`^vt([0-9a-f]{6})-kubelet-`)

// liveRuns lists the runs other than id whose test binary still runs
// (runningAs).
func liveRuns(id string) []string {
	dirs, _ := filepath.Glob(harness.RunDir("*"))
	var out []string
	for _, dir := range dirs {
		if other := strings.TrimPrefix(dir, harness.RunDir("")); other != id && runningAs(other) != 0 {
			out = append(out, other)
		}
	}
	return out
}

// runningAs returns the test binary (a go test's *.test process, or
// make cluster-up's virtlet-cluster-up) that runs as run id
// (VIRTLET_RUN=id in its environment), or 0. Only those count: a daemon a
// killed run left behind has the variable too, and what it holds is to be
// removed.
func runningAs(id string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	want := []byte("VIRTLET_RUN=" + id + "\x00")
	for _, p := range procs {
		exe, err := os.Readlink(filepath.Join(filepath.Dir(p), "exe"))
		if err != nil || !strings.HasSuffix(exe, ".test") && filepath.Base(exe) != "virtlet-cluster-up" {
			continue
		}
		env, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(bytes.SplitAfter(env, []byte{0}), func(kv []byte) bool { return bytes.Equal(kv, want) }) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			if pid != os.Getpid() {
				return pid
			}
		}
	}
	return 0
}
