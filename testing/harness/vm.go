package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/adapters/posixacl"
)

// LibvirtURI is the libvirtd the real-VM suites use.
const LibvirtURI = "qemu:///system"

// EnsureLibvirt starts libvirtd and virtlogd when they are not running (the
// machines this runs on have no systemd).
func EnsureLibvirt() error {
	if exec.Command("virsh", "-c", LibvirtURI, "version").Run() == nil && running("virtlogd") {
		return nil
	}
	for _, d := range []string{"virtlogd", "libvirtd"} {
		if !running(d) {
			// The machine's daemons outlive the run that starts them: none
			// of its directory, its TMPDIR (a run's, removed at its end).
			cmd := exec.Command(d, "-d")
			cmd.Dir = "/"
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "TMPDIR=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("start %s: %v: %s", d, err, out)
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if exec.Command("virsh", "-c", LibvirtURI, "version").Run() == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("libvirtd does not answer at %s", LibvirtURI)
}

// running tells whether a live process named name runs in this process's
// mount namespace: the host's daemon, not a test node's (which runs in a
// namespace of its own), nor a killed one not yet reaped (a zombie has no
// namespace to compare, and pgrep would still list it).
func running(name string) bool { return len(Running(name)) > 0 }

// Running lists the live processes named name in this process's mount
// namespace.
func Running(name string) []int {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != name || !Alive(pid) {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && ns == self {
			out = append(out, pid)
		}
	}
	return out
}

// GuestImage builds (or finds in the cache) a test guest image: "tiny" or
// "cloud".
func GuestImage(kind string) (string, error) {
	cmd := exec.Command(filepath.Join(RepoRoot(), "testing", "images", "build.sh"), kind)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build the %s test image: %w", kind, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// QEMUPID is the pid of a domain's QEMU, from libvirt's pid file (none
// while the domain is shut off or still starting).
func QEMUPID(domain string) (string, error) {
	pid, err := os.ReadFile("/run/libvirt/qemu/" + domain + ".pid")
	return strings.TrimSpace(string(pid)), err
}

// ProcessRSS is a process's resident memory (VmRSS), 0 when it cannot be
// read.
func ProcessRSS(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// ProcessCPU is a process's CPU time so far (user and system, in clock
// ticks of 10 ms), 0 when it cannot be read.
func ProcessCPU(pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: utime is the
	// 12th, stime the 13th.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// QEMURSS is the resident memory of a domain's QEMU, 0 when unknown.
func QEMURSS(domain string) int64 {
	pid, err := QEMUPID(domain)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(pid)
	return ProcessRSS(n)
}

// Virsh runs virsh against the test libvirtd.
func Virsh(args ...string) (string, error) {
	out, err := exec.Command("virsh", append([]string{"-c", LibvirtURI}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// DomainsUsing lists the VMs' domains whose definition mentions path (the
// test's own directory): the only ones a test may inspect or clean up on a
// libvirtd shared with others. The libvirt plugin's pool domains no VM has
// claimed are left out (PoolDomainsUsing lists them).
func DomainsUsing(path string) []string {
	pool := PoolDomainsUsing(path)
	var out []string
	for _, name := range domainsUsing(path, "virtlet-", "--all") {
		if !slices.Contains(pool, name) {
			out = append(out, name)
		}
	}
	return out
}

// DomainsMentioning lists every domain of Virtlet's (a VM's or a pool's,
// defined or transient) whose definition mentions path.
func DomainsMentioning(path string) []string {
	return domainsUsing(path, "virtlet-", "--all")
}

// PoolDomainsUsing lists the pool domains (launched paused, transient,
// named virtlet-pool-…) no VM has claimed, whose definition mentions path.
func PoolDomainsUsing(path string) []string {
	return domainsUsing(path, "virtlet-pool-", "--all", "--transient")
}

// domainsUsing lists the domains virsh list lists with these flags whose
// name has prefix and whose definition mentions path.
func domainsUsing(path, prefix string, flags ...string) []string {
	names, err := Virsh(append([]string{"list", "--name"}, flags...)...)
	if err != nil {
		return nil
	}
	var out []string
	for _, name := range strings.Fields(names) {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		if xml, err := Virsh("dumpxml", name); err == nil && strings.Contains(xml, path) {
			out = append(out, name)
		}
	}
	return out
}

// SearchableTempDir is a temporary directory that every user may search
// (0711, its parent too), as the image store's and a node's device
// directories are: the image tools run as a user of no account
// (diskimage.Tool), QEMU as the VM's own.
func SearchableTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// VMDir returns a fresh directory QEMU can reach (its whole path is
// traversable), removed after the test together with any domain using it.
func VMDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "virtlet-vm-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Mounts that plugins and the flexvolume driver made below it
		// (the 9p shares' private mount, tmpfs of volumes a failed test
		// did not unmount, what a killed daemon left) go first.
		UnmountBelow(dir)
		os.RemoveAll(dir)
	})
	t.Cleanup(func() { CleanupDomains(t, dir) })
	return dir
}

// RevokeUsers removes the ACL entries of users in the ranges from
// libvirtd's QEMU state directories and /dev/kvm (adapters/libvirt grants
// them to VM users).
func RevokeUsers(ranges ...UserRange) {
	for _, p := range []string{"/var/lib/libvirt/qemu", "/var/lib/libvirt/qemu/channel", "/var/lib/libvirt/qemu/channel/target", "/dev/kvm"} {
		users, err := posixacl.Users(p)
		if err != nil {
			continue
		}
		for uid := range users {
			for _, r := range ranges {
				if r.Contains(int(uid)) {
					posixacl.Revoke(p, uid)
				}
			}
		}
	}
}

// CleanupDomains removes the domains a test left behind.
func CleanupDomains(t testing.TB, path string) {
	for _, name := range domainsUsing(path, "virtlet-", "--all") { // pool domains too
		t.Logf("removing leftover domain %s", name)
		Virsh("destroy", name)
		Virsh("undefine", "--nvram", name)
	}
}
