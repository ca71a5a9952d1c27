package nodeinspect

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"

	"github.com/virtlet/virtlet/ports"
)

// qemuLog is the start of a QEMU log of a VM with a Ceph disk, as libvirt
// writes it: the disk's key is an encrypted secret object, named by id.
const qemuLog = `2024-05-01 10:00:00.000+0000: starting up libvirt version: 9.0.0, qemu version: 7.2.0
LC_ALL=C \
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin \
/usr/bin/qemu-system-x86_64 \
-name guest=virtlet-0123456789ab-vm,debug-threads=on \
-object '{"qom-type":"secret","id":"masterKey0","format":"raw","file":"/var/lib/libvirt/qemu/domain-1-virtlet-0123456789ab-vm/master-key.aes"}' \
-object '{"qom-type":"secret","id":"libvirt-2-storage-auth-secret0","data":"c2VjcmV0IGNpcGhlcnRleHQ=","keyid":"masterKey0","iv":"aXY=","format":"base64"}' \
-blockdev '{"driver":"rbd","pool":"rbd","image":"vol","server":[{"host":"10.0.0.1","port":"6789"}],"user":"admin","auth-client-required":["cephx","none"],"key-secret":"libvirt-2-storage-auth-secret0","node-name":"libvirt-2-storage"}' \
-vnc unix:/var/lib/libvirt/qemu/domain-1-virtlet-0123456789ab-vm/vnc.sock
char device redirected to /dev/pts/3 (label charserial0)
`

// newTestInspector is an inspector of this host's /proc and netlink, with
// libvirt's logs and the named namespaces in temporary directories.
func newTestInspector(t *testing.T) *Inspector {
	t.Helper()
	in := New(logrus.New())
	in.LibvirtLogDir, in.NetNSDir = t.TempDir(), t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(in.LibvirtLogDir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("libvirtd.log", "2024-05-01 10:00:00.000+0000: 1: info : libvirt version: 9.0.0\n")
	write("qemu/virtlet-0123456789ab-vm.log", qemuLog)
	if err := os.Symlink("/etc/passwd", filepath.Join(in.LibvirtLogDir, "qemu", "virtlet-link.log")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"virtlet-aaaa", "cni-other"} {
		if err := os.WriteFile(filepath.Join(in.NetNSDir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return in
}

// The node's part holds what Virtlet's diag dump had: ip a, ip r, ps, the
// network namespaces, libvirtd's log; each VM's QEMU log comes redacted.
func TestInspectNode(t *testing.T) {
	in := newTestInspector(t)
	req := ports.NodeInspection{Node: true,
		NetNS: []ports.PodNetNS{{Pod: "default/vm", Path: filepath.Join(in.NetNSDir, "virtlet-aaaa")}, {Pod: "default/bad", Path: "relative/ns"}},
		VMs:   []string{"virtlet-0123456789ab-vm", "virtlet-gone", "../../etc/shadow", "virtlet-link"}}
	r := in.InspectNode(context.Background(), req)
	files := map[string]string{}
	for _, f := range r.Files {
		files[f.Name] = string(f.Data)
	}
	for _, tc := range []struct {
		file string
		want []string
	}{
		{"ip-a.txt", []string{"1: lo: <UP,LOOPBACK", "inet 127.0.0.1/8 scope host"}},
		{"ip-r.txt", nil},
		{"ps.txt", []string{"PID", "COMMAND", fmt.Sprintf("\n%7d ", os.Getpid()), "nodeinspect.test"}},
		{"netns.txt", []string{"cni-other\n", "virtlet-aaaa\tpod default/vm\n"}},
		{"libvirt/libvirtd.log", []string{"libvirt version: 9.0.0"}},
		{"libvirt/qemu/virtlet-0123456789ab-vm.log", []string{`"data":"<redacted>"`, `"key-secret":"libvirt-2-storage-auth-secret0"`, "char device redirected"}},
	} {
		got, ok := files[tc.file]
		if !ok {
			t.Errorf("no %s among %d files; problems: %q", tc.file, len(r.Files), r.Problems)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s lacks %q:\n%s", tc.file, w, got)
			}
		}
	}
	if strings.Contains(files["libvirt/qemu/virtlet-0123456789ab-vm.log"], "c2VjcmV0") {
		t.Error("the QEMU log keeps the secret's data")
	}
	problems := strings.Join(r.Problems, "\n")
	for _, w := range []string{"virtlet-gone.log: open", `"../../etc/shadow"`, "virtlet-link.log: open", `"relative/ns" is not a namespace's path`,
		"network namespace " + filepath.Join(in.NetNSDir, "virtlet-aaaa")} { // a plain file, not a namespace
		if !strings.Contains(problems, w) {
			t.Errorf("problems lack %q: %q", w, r.Problems)
		}
	}
	if len(r.Files) != 6 {
		t.Errorf("%d files, want 6: %v", len(r.Files), r.Files)
	}
}

// A pod's network namespace shows its own interfaces and routes.
func TestInspectPodNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("entering a network namespace needs CAP_SYS_ADMIN")
	}
	in := newTestInspector(t)
	r := in.InspectNode(context.Background(), ports.NodeInspection{NetNS: []ports.PodNetNS{{Pod: "default/vm", Path: "/proc/self/ns/net"}}})
	if len(r.Problems) != 0 || len(r.Files) != 2 {
		t.Fatalf("files %v, problems %q", r.Files, r.Problems)
	}
	for i, name := range []string{"netns/net/ip-a.txt", "netns/net/ip-r.txt"} {
		if f := r.Files[i]; f.Name != name || !strings.HasPrefix(string(f.Data), "# pod default/vm, network namespace /proc/self/ns/net\n") {
			t.Errorf("file %d: %s %q", i, f.Name, f.Data)
		}
	}
	if !strings.Contains(string(r.Files[0].Data), "1: lo:") {
		t.Errorf("ip a: %s", r.Files[0].Data)
	}
}

// Asked for no node part, the inspector reads nothing of the node.
func TestInspectOnlyWhatIsAsked(t *testing.T) {
	in := newTestInspector(t)
	r := in.InspectNode(context.Background(), ports.NodeInspection{VMs: []string{"virtlet-0123456789ab-vm"}})
	if len(r.Files) != 1 || r.Files[0].Name != "libvirt/qemu/virtlet-0123456789ab-vm.log" || len(r.Problems) != 0 {
		t.Errorf("files %v, problems %q", r.Files, r.Problems)
	}
}

// Each file is bounded and says where it was cut; the report is bounded.
func TestBounds(t *testing.T) {
	dir := t.TempDir()
	var log strings.Builder
	for i := 0; i < 100; i++ {
		fmt.Fprintf(&log, "line %03d --password=hunter2\n", i)
	}
	path := filepath.Join(dir, "x.log")
	os.WriteFile(path, []byte(log.String()), 0o600)
	r := &report{maxFile: 100, maxAll: 300}
	r.addLog("x.log", path, false)
	r.addText("big.txt", log.String())
	r.addText("small.txt", "fits")
	r.addText("over.txt", strings.Repeat("x\n", 50))
	if len(r.files) != 3 {
		t.Fatalf("files %v, problems %q", r.files, r.problems)
	}
	tail, head := r.files[0], r.files[1]
	if !tail.Truncated || tail.Size != int64(log.Len()) || !strings.HasPrefix(string(tail.Data), "[cut by virtlet: the first ") ||
		!strings.HasSuffix(string(tail.Data), "line 099 --password=<redacted>\n") || strings.Contains(string(tail.Data), "hunter2") {
		t.Errorf("tail: %+v %q", tail, tail.Data)
	}
	if lines := strings.Split(string(tail.Data), "\n"); !strings.HasPrefix(lines[1], "line ") {
		t.Errorf("the tail starts mid-line: %q", lines[1])
	}
	if !head.Truncated || !strings.HasPrefix(string(head.Data), "line 000") || !strings.HasSuffix(string(head.Data), "bytes are left out]\n") {
		t.Errorf("head: %+v %q", head, head.Data)
	}
	if r.files[2].Truncated || string(r.files[2].Data) != "fits" {
		t.Errorf("small: %+v", r.files[2])
	}
	if len(r.problems) != 1 || !strings.Contains(r.problems[0], "over.txt (") {
		t.Errorf("problems %q", r.problems)
	}
}

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`-object '{"qom-type":"secret","id":"s0","data":"Zm9v","keyid":"masterKey0","iv":"aXY=","format":"base64"}'`,
			`-object '{"qom-type":"secret","id":"s0","data":"<redacted>","keyid":"masterKey0","iv":"aXY=","format":"base64"}'`},
		{`{"id":"s0","data":"Zm9v","qom-type":"secret"}`, `{"id":"s0","data":"<redacted>","qom-type":"secret"}`},
		{`-object secret,id=s0,data=Zm9v,keyid=masterKey0,iv=aXY=,format=base64`,
			`-object secret,id=s0,data=<redacted>,keyid=masterKey0,iv=aXY=,format=base64`},
		{"agent --password hunter2 --user x", "agent --password <redacted> --user x"},
		{"agent --api-token=abc,def -v", "agent --api-token=<redacted>,def -v"},
		{"curl https://h/x?token=abc&y=1", "curl https://h/x?token=<redacted>&y=1"},
		{"-drive file=rbd:pool/img:id=admin:password=k3y", "-drive file=rbd:pool/img:id=admin:password=<redacted>"},
		// references and file paths stay: they are what a reader needs
		{`"key-secret":"libvirt-2-storage-auth-secret0"`, `"key-secret":"libvirt-2-storage-auth-secret0"`},
		{`-object '{"qom-type":"secret","id":"masterKey0","format":"raw","file":"/m.aes"}'`, `-object '{"qom-type":"secret","id":"masterKey0","format":"raw","file":"/m.aes"}'`},
		{"kube-token-refresher --interval 5", "kube-token-refresher --interval 5"},
		{`{"driver":"file","filename":"/data/data.qcow2"}`, `{"driver":"file","filename":"/data/data.qcow2"}`},
	} {
		if got := redact(tc.in); got != tc.want {
			t.Errorf("redact(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

// A process's command name may hold spaces and parentheses.
func TestParseStat(t *testing.T) {
	stat := "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 100 1000000 25 18446744073709551615"
	p, ok := parseStat(42, stat)
	if !ok || p.ppid != 1 || p.state != "S" || p.cpuSeconds != 3 || p.rssKiB != 25*int64(os.Getpagesize())/1024 || p.command != "[a (b) c]" {
		t.Errorf("%+v %v", p, ok)
	}
	if _, ok := parseStat(1, "1 (short) S 0"); ok {
		t.Error("a short stat line was read")
	}
}

// The pod's links print as `ip a` and `ip r` would show them.
func TestFormatNetwork(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	_, pod, _ := net.ParseCIDR("10.1.0.5/24")
	_, any4, _ := net.ParseCIDR("0.0.0.0/0")
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: 3, Name: "br0", MTU: 1500, Flags: net.FlagUp, OperState: netlink.OperUp, HardwareAddr: mac}}
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Index: 4, Name: "tap0", MTU: 1500, MasterIndex: 3, OperState: netlink.OperDown}}
	links := []netlink.Link{tap, br}
	names := linkNames(links)
	gotLinks := formatLinks(links, map[int][]netlink.Addr{3: {{IPNet: &net.IPNet{IP: net.ParseIP("10.1.0.5").To4(), Mask: pod.Mask}, Scope: int(netlink.SCOPE_UNIVERSE), Label: "br0"}}}, names)
	wantLinks := "3: br0: <UP> mtu 1500 state up type bridge\n    link/ether 02:00:00:00:00:01\n    inet 10.1.0.5/24 scope universe br0\n" +
		"4: tap0: <> mtu 1500 state down type tuntap master br0\n    link/none\n"
	if gotLinks != wantLinks {
		t.Errorf("links:\n%s\nwant:\n%s", gotLinks, wantLinks)
	}
	gotRoutes := formatRoutes([]netlink.Route{
		{Dst: any4, Gw: net.ParseIP("10.1.0.1"), LinkIndex: 3, Protocol: 4, Scope: netlink.SCOPE_UNIVERSE},
		{Dst: pod, LinkIndex: 3, Src: net.ParseIP("10.1.0.5"), Protocol: 2, Scope: netlink.SCOPE_LINK, Priority: 100},
		{LinkIndex: 9, Protocol: 3},
	}, names)
	wantRoutes := "default via 10.1.0.1 dev br0 proto static scope universe\n" +
		"10.1.0.0/24 dev br0 proto kernel scope link src 10.1.0.5 metric 100\n" +
		"default dev if9 proto boot scope universe\n"
	if gotRoutes != wantRoutes {
		t.Errorf("routes:\n%s\nwant:\n%s", gotRoutes, wantRoutes)
	}
}
