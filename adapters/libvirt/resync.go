// Taking up what a previous plugin process left, and keeping the records
// true to libvirt: resync, the owner named in each domain's metadata, and
// orphaned domains.

package libvirt

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// reconciler keeps the records true to libvirt: it applies the events
// the dispatcher hands it, resynchronises, records how VMs ended, and
// streams running VMs' consoles to their CRI logs. It works on the
// records, console tailers and Stop waiters of h, under h.mu, whose
// methods that end in Locked need it held.
type reconciler struct {
	h *Hypervisor
}

// resync compares what libvirt says of the records' domains with what the
// records last reported, and applies (and reports) the difference: the
// transitions of events lost or never received. It is cheap enough to run
// often: one call lists the running domains; a VM found stopped costs one
// more (for its shutoff reason). libvirt is asked without h.mu held (a
// slow domain must not hold up calls about others); what it says applies
// only to a record that did not change meanwhile.
func (rc *reconciler) resync() {
	conn, err := rc.h.conn.current()
	if err != nil {
		return // the reconnection resumes
	}
	resumeCheckpointed(rc.h, conn)
	type check struct {
		r     *record
		seq   uint64
		state ports.VMState
	}
	rc.h.mu.Lock()
	checks := make([]check, 0, len(rc.h.records))
	for _, r := range rc.h.records {
		if r.Prelaunched || r.Claim == claiming {
			continue // its domain is paused before its first instruction: defined, not running
		}
		checks = append(checks, check{r, r.seq, r.State})
	}
	rc.h.mu.Unlock()
	if len(checks) == 0 {
		return
	}
	doms, err := conn.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_ACTIVE)
	if err != nil {
		rc.h.log.WithError(err).Warn("resync: list running domains")
		return
	}
	active := map[string]bool{}
	for i := range doms {
		if u, err := doms[i].GetUUIDString(); err == nil {
			active[strings.ToLower(u)] = true
		}
		doms[i].Free()
	}
	for _, c := range checks {
		state, reason := libvirt.DOMAIN_RUNNING, 0
		if !active[strings.ToLower(c.r.Spec.UUID)] {
			if c.state != ports.VMRunning {
				continue
			}
			dom, err := conn.LookupDomainByUUIDString(c.r.Spec.UUID)
			if err != nil {
				continue // gone: List no longer reports it, and the core records it as lost
			}
			var s libvirt.DomainState
			s, reason, err = rc.h.domainState(dom)
			dom.Free()
			if err != nil || s != libvirt.DOMAIN_SHUTOFF {
				continue // started again since the list
			}
			state = libvirt.DOMAIN_SHUTOFF
		}
		rc.h.mu.Lock()
		if r := c.r; rc.h.records[r.Spec.ID] == r && r.seq == c.seq {
			rc.resumeLocked(r, state, reason)
			if r.State != c.state {
				rc.h.watchers.notify(r.status())
			}
		}
		rc.h.mu.Unlock()
	}
}

// resumeLocked applies a domain's state found by resync; callers hold
// h.mu.
func (rc *reconciler) resumeLocked(r *record, state libvirt.DomainState, reason int) {
	if r.Incoming {
		return // a migration's guest is the VM's once Start takes it
	}
	switch {
	case state == libvirt.DOMAIN_RUNNING || state == libvirt.DOMAIN_PAUSED || state == libvirt.DOMAIN_BLOCKED:
		if r.State != ports.VMRunning {
			r.State = ports.VMRunning
			r.seq++
			if r.StartedAt.IsZero() || r.FinishedAt.After(r.StartedAt) {
				r.StartedAt, r.FinishedAt = time.Now().UTC(), time.Time{} // started where no event told
			}
			rc.h.store.save(r)
			rc.h.log.WithFields(logrus.Fields{"vm": r.Spec.Name}).Info("VM found running")
		}
		if rc.h.tailers[r.Spec.ID] == nil {
			rc.startTailerLocked(r)
		}
	case state == libvirt.DOMAIN_SHUTOFF && r.State == ports.VMRunning:
		rc.exitLocked(r, exitFromShutoff(libvirt.DomainShutoffReason(reason), r))
		rc.h.store.save(r)
		rc.h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "reason": r.Reason}).Info("VM found stopped")
	}
}

func (rc *reconciler) startTailerLocked(r *record) {
	id := r.Spec.ID
	t, err := startTailer(r.ConsoleLog, r.Spec.ConsoleLogPath, r.ConsoleOffset, r.ConsoleInode, func(off int64, ino uint64) {
		rc.h.mu.Lock()
		defer rc.h.mu.Unlock()
		if rec := rc.h.records[id]; rec != nil {
			rec.ConsoleOffset, rec.ConsoleInode = off, ino
			rc.h.store.save(rec)
		}
	}, rc.h.log.WithField("vm", r.Spec.Name))
	if err != nil {
		rc.h.log.WithError(err).WithField("vm", r.Spec.Name).Error("cannot stream the console to the CRI log")
		return
	}
	rc.h.tailers[id] = t
}

// stampOwners names this plugin instance the owner of its VMs' domains
// that name none: VMs that claimed a pool domain before a claim recorded
// its owner (or made before owners were). Another plugin instance on the
// same libvirtd would take them for orphans of its own and remove them.
func (rc *reconciler) stampOwners() {
	conn, err := rc.h.conn.current()
	if err != nil {
		return
	}
	rc.h.mu.Lock()
	rs := make([]*record, 0, len(rc.h.records))
	for _, r := range rc.h.records {
		if r.Claim != claiming {
			rs = append(rs, r)
		}
	}
	rc.h.mu.Unlock()
	for _, r := range rs {
		dom, err := conn.LookupDomainByUUIDString(r.Spec.UUID)
		if err != nil {
			continue
		}
		if m, ok := ours(dom, rc.h.owner); ok && m.Owner == "" && m.ID == r.Spec.ID {
			flags := libvirt.DOMAIN_AFFECT_CONFIG
			if active, _ := dom.IsActive(); active {
				flags |= libvirt.DOMAIN_AFFECT_LIVE
			}
			if err := setVMMetadata(dom, r.Spec, rc.h.owner, flags); err != nil {
				rc.h.log.WithError(err).WithField("vm", r.Spec.Name).Warn("name this plugin instance the owner of the VM's domain")
			} else {
				rc.h.log.WithField("vm", r.Spec.Name).Info("the VM's domain now names its owner")
			}
		}
		dom.Free()
	}
}

// instanceOwner names a plugin instance by its state directory: two
// daemons sharing one libvirtd (a test beside a node's daemon, two nodes'
// worth of state on one host) each see only their own domains, and
// neither takes the other's VMs for orphans.
func instanceOwner(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return hex.EncodeToString(sum[:])[:8]
}

// ours returns the Virtlet metadata of a domain, if this plugin instance
// made it (or a Virtlet from before owners were recorded did).
func ours(dom *libvirt.Domain, owner string) (vmMetadata, bool) {
	name, err := dom.GetName()
	if err != nil || !strings.HasPrefix(name, NamePrefix) {
		return vmMetadata{}, false
	}
	raw, err := dom.GetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, MetadataNS, libvirt.DOMAIN_AFFECT_CONFIG)
	if err != nil {
		return vmMetadata{}, false
	}
	var m vmMetadata
	if err := xml.Unmarshal([]byte(raw), &m); err != nil || m.ID == "" || m.CreatedBy != "virtlet" || (m.Owner != "" && m.Owner != owner) {
		return vmMetadata{}, false
	}
	return m, true
}

// setVMMetadata writes VM s's metadata, owner included, into a domain
// (flags: its live state, its definition or both).
func setVMMetadata(dom *libvirt.Domain, s ports.VMSpec, owner string, flags libvirt.DomainModificationImpact) error {
	meta, err := xml.Marshal(newVMMetadata(s, owner))
	if err != nil {
		return err
	}
	return dom.SetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, string(meta), metadataKey, MetadataNS, flags)
}

// findOrphan finds a domain of the plugin instance owner that has no
// record.
func findOrphan(conn *libvirt.Connect, owner, id string) (*libvirt.Domain, error) {
	doms, err := conn.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_PERSISTENT)
	if err != nil {
		return nil, err
	}
	var found *libvirt.Domain
	for i := range doms {
		if m, ok := ours(&doms[i], owner); ok && m.ID == id && found == nil {
			found = &doms[i]
			continue
		}
		doms[i].Free()
	}
	if found == nil {
		return nil, libvirt.Error{Code: libvirt.ERR_NO_DOMAIN, Message: "no domain of VM " + id}
	}
	return found, nil
}
