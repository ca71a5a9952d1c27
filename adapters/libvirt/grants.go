package libvirt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/adapters/posixacl"
	"github.com/virtlet/virtlet/ports"
)

// A VM's QEMU runs as a user of its own (its DAC label), and needs a few
// files that are not its own: its base image in the image store (root's,
// mode 0600, shared by every VM of the image), libvirtd's QEMU state
// directories it must pass through to reach its own (0750 for libvirtd's
// QEMU group) and, for a KVM domain, /dev/kvm. Each VM user is granted
// exactly those, with an ACL entry, while it has a VM (or a pool domain)
// that needs them; nothing is opened to every user, and nothing is left
// once the VMs are gone.
//
// The entries follow the plugin's state rather than each step: sync
// computes what the records, the pool and the creations in progress need,
// and makes every file it knows of hold exactly that, removing the VM
// users' entries nothing needs. It runs at start (what a killed process
// left goes), after a VM or a pool domain goes, and at shutdown. A
// creation grants what it needs itself first (grantNow), under the same
// lock, so a concurrent sync never takes it away.

// grant is one ACL entry: a user may open a path with perm.
type grant struct {
	path string
	uid  uint32
	perm uint16
}

// grants keeps the VM users' entries. syncMu serialises sync and grantNow
// and guards imageDirs; mu guards inflight and is taken alone. syncMu is
// taken before h.mu and the pool's lock, never with either held.
type grants struct {
	log logrus.FieldLogger
	vms vmSource

	syncMu sync.Mutex
	// imageDirs are the directories of the images VMs used, whose images
	// sync keeps clean.
	imageDirs map[string]bool

	mu sync.Mutex
	// inflight holds what creations in progress were granted.
	inflight map[string][]grant

	pending atomic.Bool // a syncSoon is pending
}

// forVM are what a VM user needs for a VM whose disks have the given
// overlay bases.
func (g *grants) forVM(uid int, bases []string) []grant {
	set := g.vms.settings()
	stateDir, kvm := set.cfg.QEMUStateDir, set.accel.DomainType == kvmAccel.DomainType
	var out []grant
	for _, b := range bases {
		if b != "" {
			out = append(out, grant{b, uint32(uid), posixacl.Read})
		}
	}
	for _, d := range qemuStateDirs(stateDir) {
		out = append(out, grant{d, uint32(uid), posixacl.Execute})
	}
	if kvm {
		out = append(out, grant{kvmDevice, uint32(uid), posixacl.Read | posixacl.Write})
	}
	return out
}

// qemuStateDirs are libvirtd's directories above a domain's own: its
// private directory (master key) and its guest agent channel directory.
func qemuStateDirs(stateDir string) []string {
	if stateDir == "" {
		return nil
	}
	return []string{stateDir, filepath.Join(stateDir, "channel"), filepath.Join(stateDir, "channel", "target")}
}

// overlayBases lists the base images of a spec's overlay disks.
func overlayBases(spec ports.VMSpec) []string {
	var out []string
	for _, d := range spec.Disks {
		if d.Overlay != nil && d.Overlay.BasePath != "" {
			out = append(out, d.Overlay.BasePath)
		}
	}
	return out
}

// sharedPath tells the host's files that other plugin instances' VMs may
// use as well (libvirtd is the node's): an instance revokes there only
// the entries it made, which it lists in sharedUsersFile.
func (g *grants) sharedPath(p string) bool {
	stateDir := g.vms.settings().cfg.QEMUStateDir
	return p == kvmDevice || slices.Contains(qemuStateDirs(stateDir), p)
}

// sharedUsersFile, in the plugin's state directory, lists the users this
// instance granted the host's shared files (a JSON array of user IDs):
// written before a grant, so an instance killed in between still knows.
const sharedUsersFile = "shared-grants.json"

// sharedUsers reads the list (syncMu held).
func (g *grants) sharedUsers() map[uint32]bool {
	dir := g.vms.settings().stateDir
	out := map[uint32]bool{}
	data, err := os.ReadFile(filepath.Join(dir, sharedUsersFile))
	if err != nil {
		return out
	}
	var uids []uint32
	if json.Unmarshal(data, &uids) == nil {
		for _, u := range uids {
			out[u] = true
		}
	}
	return out
}

// saveSharedUsers writes the list (syncMu held).
func (g *grants) saveSharedUsers(users map[uint32]bool) error {
	dir := g.vms.settings().stateDir
	uids := make([]uint32, 0, len(users))
	for u := range users {
		uids = append(uids, u)
	}
	slices.Sort(uids)
	data, _ := json.Marshal(uids)
	return atomicfile.Write(filepath.Join(dir, sharedUsersFile), data, 0o600)
}

// grantNow grants a creation in progress (token: the VM's ID or a pool
// domain's UUID) what its user needs, and keeps it wanted until done is
// called; by then the VM's record or the pool holds it, or the creation
// failed and the next sync removes it.
func (g *grants) grantNow(token string, uid int, bases []string) (done func(), err error) {
	gs := g.forVM(uid, bases)
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	g.mu.Lock()
	if g.inflight == nil {
		g.inflight = map[string][]grant{}
	}
	g.inflight[token] = append(g.inflight[token], gs...)
	g.mu.Unlock()
	done = func() {
		g.mu.Lock()
		delete(g.inflight, token)
		g.mu.Unlock()
	}
	if shared := g.sharedUsers(); !shared[uint32(uid)] {
		shared[uint32(uid)] = true
		if err := g.saveSharedUsers(shared); err != nil {
			done()
			return nil, fmt.Errorf("record VM user %d's grants: %w", uid, err)
		}
	}
	for _, g := range gs {
		if err := applyGrant(g); err != nil {
			done()
			return nil, fmt.Errorf("let VM user %d open %s: %w", uid, g.path, err)
		}
	}
	return done, nil
}

// applyGrant adds one entry. /dev/kvm on a devtmpfs without ACLs is
// opened to every user instead, as systemd sets it upstream.
func applyGrant(g grant) error {
	err := posixacl.Grant(g.path, g.uid, g.perm)
	if g.path == kvmDevice && errors.Is(err, unix.EOPNOTSUPP) {
		return kvmUsableByAll(g.path)
	}
	return err
}

func kvmUsableByAll(dev string) error {
	st, err := os.Stat(dev)
	if err != nil {
		return err
	}
	if st.Mode().Perm()&0o006 == 0o006 {
		return nil
	}
	return os.Chmod(dev, st.Mode().Perm()|0o006)
}

// wanted is what the records, the pool's domains and the creations in
// progress need. The creations are read first: a creation's grant leaves
// inflight only once the record or the pool holds its VM or domain (or
// the creation failed), so each grant needed is seen in one or the other.
func (g *grants) wanted() map[string]map[uint32]uint16 {
	g.mu.Lock()
	var inflight []grant
	for _, gs := range g.inflight {
		inflight = append(inflight, gs...)
	}
	g.mu.Unlock()
	type need struct {
		uid   int
		bases []string
	}
	var needs []need
	g.vms.each(func(r *record) {
		if r.Spec.RunAs != nil {
			needs = append(needs, need{r.Spec.RunAs.UID, overlayBases(r.Spec)})
		}
	})
	if p := g.vms.settings().pool; p != nil {
		p.mu.Lock()
		for _, d := range append(p.ready, p.launching) {
			if d != nil {
				needs = append(needs, need{d.uid, []string{d.base}})
			}
		}
		p.mu.Unlock()
	}
	want := map[string]map[uint32]uint16{}
	add := func(gr grant) {
		if want[gr.path] == nil {
			want[gr.path] = map[uint32]uint16{}
		}
		want[gr.path][gr.uid] |= gr.perm
	}
	for _, n := range needs {
		for _, gr := range g.forVM(n.uid, n.bases) {
			add(gr)
		}
	}
	for _, gr := range inflight {
		add(gr)
	}
	return want
}

// vmUserEntry tells the entries sync owns: those of users above the
// node's own (VM users, pool users) but the disk tools' users, whose
// entries other plugins hold for a run.
func vmUserEntry(uid uint32) bool {
	return uid >= 65536 && (uid > diskimage.DefaultToolUID || uid < diskimage.DefaultToolUID-15)
}

// sync makes the entries of every file it knows of (the wanted ones, the
// QEMU state directories, /dev/kvm, and every image in the directories of
// the images VMs used) exactly what is wanted.
func (g *grants) sync() { g.syncOf(false) }

// syncOf syncs; at start (no WriteFiles runs yet) it also revokes what
// this plugin's disk tools' user was granted by a run a kill cut short.
func (g *grants) syncOf(atStart bool) {
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	want := g.wanted()
	stateDir := g.vms.settings().cfg.QEMUStateDir
	sorted := g.pathsLocked(want, stateDir)
	shared := g.sharedUsers()
	failed := false
	for _, p := range sorted {
		owned := vmUserEntry
		if atStart {
			owned = func(uid uint32) bool { return vmUserEntry(uid) || uid == diskimage.LibvirtToolUID }
		}
		if g.sharedPath(p) {
			owned = func(uid uint32) bool { return shared[uid] }
		}
		if err := syncPath(p, want[p], owned); err != nil && !errors.Is(err, os.ErrNotExist) {
			failed = true
			g.log.WithError(err).WithField("path", p).Warn("VM users' access")
		}
	}
	if !failed {
		g.forgetSharedUsers(sorted, want, shared)
	}
}

// pathsLocked lists, sorted, the files sync looks at: /dev/kvm, the QEMU
// state directories, the wanted files, and every image in the directories
// of the images VMs used (which it adds the wanted images' to); syncMu
// held.
func (g *grants) pathsLocked(want map[string]map[uint32]uint16, stateDir string) []string {
	if g.imageDirs == nil {
		g.imageDirs = map[string]bool{}
	}
	for p := range want {
		if filepath.Dir(p) != stateDir && filepath.Dir(filepath.Dir(p)) != stateDir && p != stateDir && p != kvmDevice {
			g.imageDirs[filepath.Dir(p)] = true
		}
	}
	paths := map[string]bool{kvmDevice: true}
	for _, d := range qemuStateDirs(stateDir) {
		paths[d] = true
	}
	for p := range want {
		paths[p] = true
	}
	for d := range g.imageDirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.Type().IsRegular() {
				paths[filepath.Join(d, e.Name())] = true
			}
		}
	}
	sorted := make([]string, 0, len(paths))
	for p := range paths {
		sorted = append(sorted, p)
	}
	sort.Strings(sorted)
	return sorted
}

// forgetSharedUsers drops from the list the users no shared file names
// any more: they are no longer this instance's to revoke (syncMu held).
func (g *grants) forgetSharedUsers(sorted []string, want map[string]map[uint32]uint16, shared map[uint32]bool) {
	wanted := map[uint32]bool{}
	for _, p := range sorted {
		if g.sharedPath(p) {
			for uid := range want[p] {
				wanted[uid] = true
			}
		}
	}
	changed := false
	for uid := range shared {
		if !wanted[uid] {
			delete(shared, uid)
			changed = true
		}
	}
	if changed {
		if err := g.saveSharedUsers(shared); err != nil {
			g.log.WithError(err).Warn("record VM users' grants")
		}
	}
}

// syncPath gives path exactly the wanted VM users' entries, revoking only
// the entries of users owned says are its to revoke.
func syncPath(path string, want map[uint32]uint16, owned func(uint32) bool) error {
	have, err := posixacl.Users(path)
	if err != nil {
		return err
	}
	for uid := range have {
		if owned(uid) && want[uid] == 0 {
			if err := posixacl.Revoke(path, uid); err != nil {
				return err
			}
		}
	}
	for uid, perm := range want {
		if have[uid] != perm {
			if err := applyGrant(grant{path, uid, perm}); err != nil {
				return err
			}
		}
	}
	return nil
}

// syncSoon syncs in the background, shortly: a pool domain or a failed
// creation is gone. A burst of them (a sweep destroying several) makes
// one sync, after the burst.
func (g *grants) syncSoon() {
	if !g.pending.CompareAndSwap(false, true) {
		return
	}
	go func() {
		time.Sleep(syncDelay)
		g.pending.Store(false)
		g.sync()
	}()
}

// syncDelay is how long syncSoon waits for more to go.
const syncDelay = 500 * time.Millisecond

// openToQEMUUser lets qemu.conf's one user read base images, when VMs run
// without users of their own (vmUsers off): the images are then readable
// by every local user, as the log says.
func openToQEMUUser(log logrus.FieldLogger, bases []string) error {
	for _, b := range bases {
		st, err := os.Stat(b)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o004 == 0 {
			if err := os.Chmod(b, st.Mode().Perm()|0o044); err != nil {
				return err
			}
			log.WithField("image", b).Warn("VMs run as qemu.conf's one user (the daemon's vmUsers is off): the image is readable by every local user")
		}
	}
	return nil
}
