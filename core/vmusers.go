package core

import (
	"fmt"
	"sync"

	"github.com/virtlet/virtlet/ports"
)

// VMUsers is the range of host users the VMs run as, one each, so that a
// VM's hypervisor process can reach its own disks and shares only: libvirt
// gives every VM qemu.conf's one user otherwise, and one VM's compromised
// QEMU could then open another's disks. Every VM's group is its own (the
// group ID equal to its user ID: OwnGroup) unless GID names one that all
// share; its files are its user's and group's alone.
type VMUsers struct {
	FirstUID int // the range's first user ID
	Count    int // how many users the range holds: at most that many VMs
	GID      int // OwnGroup, or the group every VM runs in
}

// OwnGroup as VMUsers.GID gives each VM a group of its own.
const OwnGroup = -1

// Validate checks that the range is usable: outside the system's users
// and not overflowing a 32-bit ID.
func (u VMUsers) Validate() error {
	switch {
	case u.FirstUID < 65536:
		return &ports.InvalidError{Field: "VM users' first UID", Value: fmt.Sprint(u.FirstUID), Allowed: "65536 or more (above the node's own users)"}
	case u.Count < 1 || int64(u.FirstUID)+int64(u.Count) > 1<<31:
		return &ports.InvalidError{Field: "VM users' count", Value: fmt.Sprint(u.Count), Allowed: "1 or more, the range ending below 2^31"}
	case u.GID < OwnGroup:
		return &ports.InvalidError{Field: "VM users' GID", Value: fmt.Sprint(u.GID), Allowed: "a group ID, or each VM its own"}
	}
	return nil
}

// vmUserPool hands out the range's users: the lowest one no VM record
// holds and no creation in progress has taken.
type vmUserPool struct {
	mu      sync.Mutex
	pending map[int]bool // taken by creations not yet recorded
}

// takeVMUser reserves a user for a VM being created; release undoes the
// reservation once the VM's record holds it (or the creation failed).
func (r *vmService) takeVMUser() (id *ports.ProcessIdentity, release func(), err error) {
	u := r.opts.VMUsers
	if u == nil {
		return nil, func() {}, nil
	}
	p := &r.users
	p.mu.Lock()
	defer p.mu.Unlock()
	used := map[int]bool{}
	for _, c := range r.containers.list(func(c *Container) bool { return c.Spec.RunAs != nil }) {
		used[c.Spec.RunAs.UID] = true
	}
	for uid := u.FirstUID; uid < u.FirstUID+u.Count; uid++ {
		if used[uid] || p.pending[uid] {
			continue
		}
		if p.pending == nil {
			p.pending = map[int]bool{}
		}
		p.pending[uid] = true
		gid := u.GID
		if gid == OwnGroup {
			gid = uid
		}
		return &ports.ProcessIdentity{UID: uid, GID: gid}, func() {
			p.mu.Lock()
			delete(p.pending, uid)
			p.mu.Unlock()
		}, nil
	}
	return nil, nil, fmt.Errorf("all %d VM users (from UID %d) are in use; raise the daemon's vmUsers count: %w",
		u.Count, u.FirstUID, ports.ErrFailedPrecondition)
}
