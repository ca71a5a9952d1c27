package e2e

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containers/image/v5/types"

	"github.com/virtlet/virtlet/adapters/posixacl"
	"github.com/virtlet/virtlet/adapters/vmtools"
	"github.com/virtlet/virtlet/testing/containerdisk"
	"github.com/virtlet/virtlet/testing/harness"
)

// Secrets that must show up nowhere on the node but where they belong:
// user-data and SSH keys from Secrets (they belong in the VM's cloud-init
// medium, 0600) and a registry password given with a pull (it belongs to
// the request alone).
const (
	udSecret       = "ud-S3CRET-4b1e9d"
	sshKeySecret   = "AAAAC3NzaC1lZDI1NTE5AAAAIKeySecret7c2a"
	pullPassword   = "pull-S3CRET-90fd3"
	secretsObjects = `apiVersion: v1
kind: Secret
metadata: {name: app-ud, namespace: default}
stringData:
  runcmd: "- echo ` + udSecret + `\n"
---
apiVersion: v1
kind: Secret
metadata: {name: app-keys, namespace: default}
stringData:
  authorized_keys: "ssh-ed25519 ` + sshKeySecret + ` from-secret\n"
`
)

// A VM pod with user-data and SSH keys from Secrets, on an image pulled
// from a registry with a password, runs; then:
//   - the daemon's sockets, state directory, database, plugin directories
//     and records, and the cloud-init medium have their modes;
//   - no secret is in the daemon's log, in any process's command line, in
//     the domain's XML, or in any file below the daemon's directory that
//     others may read;
//   - QEMU runs as an unprivileged user of the VM's own under libvirt's
//     seccomp sandbox, confined by the static DAC label that the domain
//     asks for itself, and owns the VM's disks only while it runs (dynamic
//     ownership); a second VM runs as another user, which cannot open the
//     first one's disks.
func TestSecretsAndConfinement(t *testing.T) {
	parallel(t)
	reg, err := containerdisk.StartRegistry(containerdisk.RegistryOptions{TLS: true, User: "puller", Password: pullPassword})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	ca, err := os.ReadFile(reg.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	os.WriteFile(filepath.Join(certDir, "ca.crt"), ca, 0o644)
	files, err := containerdisk.DiskFiles(tiny, "tiny.qcow2")
	if err != nil {
		t.Fatal(err)
	}
	err = containerdisk.PushAs(context.Background(), "docker://"+reg.Addr+"/private/tiny:v1", files,
		&types.SystemContext{DockerCertPath: certDir, DockerAuthConfig: &types.DockerAuthConfig{Username: "puller", Password: pullPassword}})
	if err != nil {
		t.Fatal(err)
	}
	// The pool on, as the shipped manifest has it: the first VM starts
	// cold (its shape is new), its neighbour claims a pool domain.
	d := harness.NewDaemon(t, filepath.Join(bins, "virtlet"), harness.WithConfig(plugins(), "libvirt", harness.PoolConfig("1")))
	d.Translate("private.yaml", fmt.Sprintf(`translations:
- regexp: 'private/(.*)'
  url: docker://%s/private/$1
  transport: private
transports:
  private: {tls: {certificates: [{cert: %q}]}}
`, reg.Addr, string(ca)))
	d.KubeObjects("secrets.yaml", secretsObjects)
	d.Start()
	c := d.Crictl(crictl)
	c.Timeout = 3 * time.Minute
	const image = "virtlet.cloud/private/tiny:v1"
	if _, errOut, err := c.Run("pull", image); err == nil || !strings.Contains(errOut, "pull secret") {
		t.Fatalf("a pull without credentials: %v %s", err, errOut)
	}
	c.Must(t, "pull", "--creds", "puller:"+pullPassword, image)

	podJSON, ctrJSON := vmPod(t, d, "secrets", map[string]string{
		"VirtletCloudInitUserDataSource": "secret/app-ud",
		"VirtletSSHKeySource":            "secret/app-keys",
	}, 160<<20)
	ctrJSON = withImage(t, ctrJSON, image)
	sb, ctr, _ := bootTiny(t, c, podJSON, ctrJSON)
	domain := inspectCtr(t, c, ctr).VM.Name

	t.Run("modes", func(t *testing.T) {
		modes := map[string]os.FileMode{
			d.Socket:                                0o660, // kubelet's group may talk CRI
			d.AdminSocket():                         0o600,
			d.StateDir:                              0o711, // QEMU traverses it to the images and disks
			filepath.Join(d.StateDir, "virtlet.db"): 0o600,
			filepath.Join(d.StateDir, "plugins"):    0o711,
		}
		// Plugin directories: private, or traversable (not listable) for
		// the plugins that hand QEMU files below them.
		for _, p := range []string{"images", "raw"} {
			modes[filepath.Join(d.StateDir, "plugins", p)] = 0o700
		}
		// The ceph plugin's disk tools' user reaches its work directory
		// (persistent roots' raw copies) through it.
		for _, p := range []string{"libvirt", "nocloud", "configdrive", "qcow2", "ninep", "ceph"} {
			modes[filepath.Join(d.StateDir, "plugins", p)] = 0o711
		}
		for _, p := range []string{"libvirt", "nocloud", "configdrive", "images", "qcow2", "raw", "ninep", "ceph"} {
			modes[filepath.Join(d.StateDir, "plugins", p, "tmp")] = 0o700
		}
		records, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "libvirt", "records", "*"))
		media, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "nocloud", "media", "*"))
		if len(records) != 1 || len(media) != 1 {
			t.Fatalf("records %v, media %v: want one of each", records, media)
		}
		modes[filepath.Dir(records[0])] = 0o700
		modes[records[0]] = 0o600
		modes[media[0]] = 0o600 // it holds the user-data and the keys
		// The ceph plugin's keys directory (its default: the harness
		// configures none).
		modes["/run/virtlet/ceph-keys"] = 0o700
		for p, want := range modes {
			st, err := os.Stat(p)
			if err != nil {
				t.Errorf("%s: %v", p, err)
				continue
			}
			if st.Mode().Perm() != want {
				t.Errorf("%s has mode %04o, want %04o", p, st.Mode().Perm(), want)
			}
		}
	})

	// The private image is root's alone, granted (an ACL entry) to the
	// user of the VM that runs it and to nobody else: not to a local user
	// of no account, nor to a VM user whose VM does not run it.
	imageEntries := func() (string, map[uint32]uint16) {
		images, _ := filepath.Glob(filepath.Join(d.StateDir, "images", "sha256", "*"))
		if len(images) != 1 {
			t.Fatalf("the image store holds %v, want the one image", images)
		}
		users, err := posixacl.Users(images[0])
		if err != nil {
			t.Fatal(err)
		}
		return images[0], users
	}
	t.Run("image store", func(t *testing.T) {
		for _, dir := range []string{"images", "images/sha256", "images/tmp"} {
			if st, err := os.Stat(filepath.Join(d.StateDir, dir)); err != nil || st.Mode().Perm() != 0o711 {
				t.Errorf("%s: %v %v, want 0711 (others pass through, list nothing)", dir, st.Mode(), err)
			}
		}
		image, users := imageEntries()
		uid := procStatus(t, qemuPID(t, domain), "Uid")[0]
		// With the pool on, the pool domains of the image's shape hold it too.
		n, _ := strconv.Atoi(uid)
		for u, perm := range users {
			if !(int(u) == n && perm == posixacl.Read) && !d.PoolUsers.Contains(int(u)) {
				t.Errorf("the image's ACL grants user %d (%o): not the VM's user %s, nor a pool domain's", u, perm, uid)
			}
		}
		if users[uint32(n)] != posixacl.Read {
			t.Errorf("the image's ACL entries %v lack the VM's user %s, read-only", users, uid)
		}
		if st, _ := os.Stat(image); st.Mode().Perm()&0o007 != 0 {
			t.Errorf("the image's mode %04o lets others in", st.Mode().Perm())
		}
		if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "head", "-c1", image).CombinedOutput(); err == nil {
			t.Errorf("a local user of no account read the private image: %q", out)
		}
		if out, err := exec.Command("setpriv", "--reuid="+uid, "--regid="+uid, "--clear-groups", "head", "-c4", image).CombinedOutput(); err != nil || string(out) != "QFI\xfb" {
			t.Errorf("the VM's user cannot read its image: %q %v", out, err)
		}
	})

	secrets := []string{udSecret, sshKeySecret, pullPassword}
	t.Run("secrets", func(t *testing.T) {
		check := func(where, text string) {
			for _, s := range secrets {
				if strings.Contains(text, s) {
					t.Errorf("secret %q is in %s", s, where)
				}
			}
		}
		// The user-data reached the medium: what the test looks for is
		// where it should be.
		media, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "nocloud", "media", "*.iso"))
		if len(media) != 1 || !strings.Contains(string(mustRead(t, media[0])), udSecret) ||
			!strings.Contains(string(mustRead(t, media[0])), sshKeySecret) {
			t.Fatalf("the Secrets' values are not in the cloud-init medium %v", media)
		}
		check("the daemon's log", d.Log())
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil {
				check("the command line of process "+e.Name()+" ("+strings.SplitN(string(cmdline), "\x00", 2)[0]+")", string(cmdline))
				if environ, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ")); err == nil {
					check("the environment of process "+e.Name(), string(environ))
				}
			}
		}
		for _, flag := range []string{"", "--inactive", "--security-info"} {
			args := []string{"dumpxml", domain}
			if flag != "" {
				args = append(args, flag)
			}
			xml, err := harness.Virsh(args...)
			if err != nil {
				t.Fatalf("virsh %v: %v %s", args, err, xml)
			}
			check("virsh dumpxml "+flag, xml)
		}
		// Every file below the daemon's directory that others may read.
		var readable int
		filepath.WalkDir(d.Dir, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return nil
			}
			if st, err := os.Stat(p); err == nil && st.Mode().Perm()&0o004 != 0 {
				readable++
				check(p+" (world-readable)", string(mustRead(t, p)))
			}
			return nil
		})
		t.Logf("%d world-readable files below %s hold no secret", readable, d.Dir)
	})

	t.Run("listeners", func(t *testing.T) {
		// Every listening socket of the daemon, its plugins and the VM's
		// QEMU: TCP only for the streaming server, on loopback (the
		// metrics endpoint is off); the VNC display a unix socket in a
		// directory only the VM's QEMU user (and root) may enter.
		pids := map[string]string{fmt.Sprint(d.PID()): "the daemon", qemuPID(t, domain): "QEMU"}
		for pid, cmdline := range d.Children() {
			pids[fmt.Sprint(pid)] = "plugin " + strings.Fields(cmdline)[0]
		}
		out, err := exec.Command("ss", "-H", "-lnpt").Output()
		if err != nil {
			t.Fatalf("ss: %v", err)
		}
		var tcp []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			for pid, who := range pids {
				if strings.Contains(line, "pid="+pid+",") {
					tcp = append(tcp, who+": "+strings.Join(strings.Fields(line)[3:4], ""))
				}
			}
		}
		if len(tcp) != 1 || !strings.HasPrefix(tcp[0], "the daemon: 127.0.0.1:") {
			t.Errorf("TCP listeners %q, want the daemon's streaming server on 127.0.0.1 alone", tcp)
		}
		out, _ = exec.Command("ss", "-H", "-lnpx").Output()
		var vnc string
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.Contains(line, "pid="+qemuPID(t, domain)+",") && strings.HasSuffix(f[4], "vnc.sock") {
				vnc = f[4]
			}
		}
		if vnc == "" {
			t.Fatalf("QEMU listens on no vnc.sock:\n%s", out)
		}
		st, err := os.Stat(filepath.Dir(vnc))
		if err != nil || st.Mode().Perm()&0o007 != 0 {
			t.Errorf("the VNC socket's directory %s: %v %v, want no access for others", filepath.Dir(vnc), st.Mode(), err)
		}
		// virtletctl vnc's path: an exec of the display through the
		// streaming server reaches the VM's VNC server.
		cmd := exec.Command(crictl, "--config", "/dev/null", "--runtime-endpoint", "unix://"+d.Socket, "exec", "-i", ctr, vmtools.VNC)
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() }()
		banner := make([]byte, 12)
		if _, err := io.ReadFull(stdout, banner); err != nil || !strings.HasPrefix(string(banner), "RFB 003.") {
			t.Errorf("the VM's display through the daemon: %q %v", banner, err)
		}
	})

	t.Run("QEMU", func(t *testing.T) {
		// A second VM, whose user must not reach the first's disk and
		// guest agent.
		// It claims the pool domain launched for the first one's shape.
		waitPool(t, d, 1)
		pod2, ctr2JSON := vmPod(t, d, "neighbour", nil, 160<<20)
		sb2 := c.Must(t, "runp", pod2)
		ctr2 := c.Must(t, "create", sb2, withImage(t, ctr2JSON, image), pod2)
		c.Must(t, "start", ctr2)
		defer c.Run("rmp", "-f", sb2)
		neighbour := inspectCtr(t, c, ctr2).VM.Name
		if !strings.HasPrefix(neighbour, "virtlet-pool-") {
			t.Errorf("the neighbour VM %s did not claim the pool domain", neighbour)
		}
		checkConfinement(t, d, domain, ctr, neighbour)
	})

	c.Must(t, "stop", "--timeout", "0", ctr)
	c.Must(t, "rmp", "-f", sb)
	assertNothingLeft(t, d, c)
	// Its VMs gone, no VM user keeps the image, nor libvirtd's
	// directories: only the users of the ready pool domains (launched
	// again for the shape) do.
	ready := func() map[uint32]bool {
		out := map[uint32]bool{}
		for _, name := range harness.PoolDomainsUsing(d.Dir) {
			if uid, err := domainQEMUUID(name); err == nil { // a domain still starting has no QEMU yet
				out[uint32(uid)] = true
			}
		}
		return out
	}
	var kept []string
	harness.EventuallyOK(30*time.Second, func() bool {
		kept = nil
		pooled := ready()
		_, users := imageEntries()
		for u := range users {
			if !pooled[u] {
				kept = append(kept, fmt.Sprintf("the image grants user %d", u))
			}
		}
		for _, dir := range []string{"/var/lib/libvirt/qemu", "/var/lib/libvirt/qemu/channel", "/var/lib/libvirt/qemu/channel/target"} {
			users, _ := posixacl.Users(dir)
			for u := range users {
				if (d.VMUsers.Contains(int(u)) || d.PoolUsers.Contains(int(u))) && !pooled[u] {
					kept = append(kept, fmt.Sprintf("%s grants the daemon's VM user %d", dir, u))
				}
			}
		}
		return len(kept) == 0
	})
	if len(kept) > 0 {
		t.Errorf("grants left once the VMs are gone: %v", kept)
	}
}

// seclabels returns the <seclabel> elements of a domain's XML, for errors.
func seclabels(xml string) string {
	return strings.Join(regexp.MustCompile(`(?s)<seclabel.*?(?:/>|</seclabel>)`).FindAllString(xml, -1), "\n")
}

// checkConfinement checks a running VM's QEMU (domain, of container ctr):
// it runs as an unprivileged user of the VM's own (from the pool's range
// for a VM claimed from the libvirt plugin's pool) under libvirt's seccomp
// sandbox, confined by the static DAC label its domain asks for, owns the
// VM's root disk only while it runs; the QEMU of another running VM of the
// daemon (neighbour) runs as another user and group, which can open
// neither the first VM's root disk nor its guest agent socket.
func checkConfinement(t *testing.T, d *harness.Daemon, domain, ctr, neighbour string) {
	t.Helper()
	pid := qemuPID(t, domain)
	field := func(name string) []string { return procStatus(t, pid, name) }
	uid, gid := field("Uid"), field("Gid")
	for _, id := range append(uid, gid...) {
		if id == "0" {
			t.Errorf("QEMU runs with uid %v gid %v: root", uid, gid)
		}
	}
	if s := field("Seccomp")[0]; s != "2" {
		t.Errorf("QEMU's Seccomp mode is %s, want 2 (filtered)", s)
	}
	cmdline := strings.Split(string(mustRead(t, "/proc/"+pid+"/cmdline")), "\x00")
	sandbox := ""
	for i, a := range cmdline {
		if a == "-sandbox" && i+1 < len(cmdline) {
			sandbox = cmdline[i+1]
		}
	}
	for _, want := range []string{"on", "obsolete=deny", "elevateprivileges=deny", "spawn=deny", "resourcecontrol=deny"} {
		if !strings.Contains(","+sandbox+",", ","+want+",") {
			t.Errorf("QEMU's -sandbox %q lacks %s", sandbox, want)
		}
	}
	// The domain asks for its own user, from the daemon's default
	// range, in a static DAC label (a host whose qemu.conf turns
	// default confinement off does not run it unconfined), and QEMU
	// runs as that user.
	inactive, _ := harness.Virsh("dumpxml", "--inactive", domain)
	want := fmt.Sprintf("<label>+%s:+%s</label>", uid[0], gid[0])
	if !regexp.MustCompile(`<seclabel type='static' model='dac' relabel='yes'>`).MatchString(inactive) || !strings.Contains(inactive, want) {
		t.Errorf("the defined domain asks for no static DAC label of QEMU's %s:\n%s", want, seclabels(inactive))
	}
	// A VM claimed from the libvirt plugin's pool (TestPoolSurvivesCrashes)
	// runs as the pool domain's user, of the pool's own range, and
	// its root disk is the pool domain's overlay.
	first, last := d.VMUsers.First, d.VMUsers.Last
	overlay := filepath.Join(d.StateDir, "plugins", "libvirt", "vms", ctr+"-root.qcow2")
	if strings.HasPrefix(domain, "virtlet-pool-") {
		first, last = d.PoolUsers.First, d.PoolUsers.Last
		overlay = filepath.Join(d.StateDir, "plugins", "libvirt", "pool", domain+"-root.qcow2")
	}
	if n, _ := strconv.Atoi(uid[0]); n < first || n > last {
		t.Errorf("QEMU runs as uid %d, not one of the VM users (%d-%d)", n, first, last)
	}
	// Dynamic ownership: QEMU's user owns the root disk while the VM
	// runs (libvirt gave it), root again once the VM is gone.
	var st syscall.Stat_t
	if err := syscall.Stat(overlay, &st); err != nil || fmt.Sprint(st.Uid) != uid[0] {
		t.Errorf("the running VM's root disk %s is owned by uid %d (%v), want QEMU's %s", overlay, st.Uid, err, uid[0])
	}
	if mode := os.FileMode(st.Mode).Perm(); mode&0o077 != 0 {
		t.Errorf("the root disk %s is open to others than its VM's user (%04o)", overlay, mode)
	}

	// Its neighbour runs as another user.
	uid2 := qemuUID(t, neighbour)
	if uid2 == uid[0] {
		t.Fatalf("both VMs' QEMUs run as uid %s", uid2)
	}
	gid2 := qemuGID(t, neighbour)
	if gid2 == gid[0] {
		t.Errorf("both VMs' QEMUs run in group %s, want a group each", gid2)
	}
	n2, _ := strconv.Atoi(uid2)
	g2, _ := strconv.Atoi(gid2)
	as2 := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(n2), Gid: uint32(g2), Groups: []uint32{}}}
	peek := exec.Command("head", "-c", "1", overlay)
	peek.SysProcAttr = as2
	if out, err := peek.CombinedOutput(); err == nil {
		t.Errorf("the second VM's user (uid %d) read the first VM's root disk: %q", n2, out)
	}
	// Nor can it talk to the first VM's guest agent (which runs
	// commands as root in that guest), while the first VM's own user
	// can: the check can tell.
	xml, err := harness.Virsh("dumpxml", domain)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`path=['"]([^'"]*org\.qemu\.guest_agent\.0)['"]`).FindStringSubmatch(xml)
	if m == nil {
		t.Fatalf("no guest agent socket in %s's XML", domain)
	}
	dial := func(uid, gid int) error {
		cmd := exec.Command("socat", "-u", "OPEN:/dev/null", "UNIX-CONNECT:"+m[1])
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	n1, _ := strconv.Atoi(uid[0])
	g1, _ := strconv.Atoi(gid[0])
	if err := dial(n1, g1); err != nil {
		t.Errorf("the first VM's own user cannot reach its guest agent socket %s: %v", m[1], err)
	}
	if err := dial(n2, g2); err == nil {
		t.Errorf("the second VM's user (uid %d gid %d) reached the first VM's guest agent socket %s", n2, g2, m[1])
	}
}
