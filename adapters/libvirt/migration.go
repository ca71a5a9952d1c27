// Live migration (ports.VMMigrator). The receiving node's plugin defines
// the VM first with the migrating domain's name and UUID (Define with
// spec.Incoming: an empty root overlay over the same image), then the
// sending node's libvirtd migrates the running domain into it, peer to
// peer: its control connection and QEMU's memory and disk streams all go
// through unix sockets that the two daemons join over their mutual-TLS
// link. libvirt copies the root overlay as the guest runs (NBD, only what
// the overlay holds over the image both nodes have), then the memory, and
// the guest pauses only for the last of it; a TCG guest is paused for the
// whole copy (migrationFlags).

package libvirt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// migrateRunDir holds a migration's sockets, on both nodes under the same
// name: libvirt's own run directory is the node's.
const migrateRunDir = ports.MigrationRunDir

// migrations is the adapter's live migration concern (ports.VMMigrator).
type migrations struct{ h *Hypervisor }

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// MigrationIdentity returns running VM id's domain name and UUID, once
// its VM is one a migration moves whole.
func (m migrations) MigrationIdentity(ctx context.Context, id string) (ports.VMIncoming, error) {
	h := m.h
	r, dom, err := h.lookup(id)
	if err != nil {
		return ports.VMIncoming{}, err
	}
	defer dom.Free()
	if _, err := m.checkMigratable(r, dom); err != nil {
		return ports.VMIncoming{}, err
	}
	return ports.VMIncoming{Name: r.Spec.Name, UUID: strings.ToLower(r.Spec.UUID)}, nil
}

// checkMigratable refuses, by name, what a live migration cannot move,
// and returns the target devices of the disks it copies: the root
// overlay's. Read-only media come with the receiving pod; network disks
// (Ceph RBD, a Ceph root among them) are shared storage, which the
// receiving VM attaches itself and nothing copies; a disk of this node's
// alone (a host block device, a persistent root on one, a volume's file)
// is refused.
func (m migrations) checkMigratable(r *record, dom *libvirt.Domain) ([]string, error) {
	h := m.h
	h.mu.Lock()
	state := r.State
	h.mu.Unlock()
	if state != ports.VMRunning {
		return nil, fmt.Errorf("VM %s is %s, not running: only a running VM is live-migrated: %w", r.Spec.Name, state, ports.ErrFailedPrecondition)
	}
	refuse := func(format string, args ...any) ([]string, error) {
		return nil, fmt.Errorf("VM %s "+format+": %w", append(append([]any{r.Spec.Name}, args...), ports.ErrFailedPrecondition)...)
	}
	x, err := dom.GetXMLDesc(0)
	if err != nil {
		return nil, libvirtError("domain XML of "+r.Spec.Name, err)
	}
	var live libvirtxml.Domain
	if err := live.Unmarshal(x); err != nil {
		return nil, fmt.Errorf("domain XML of %s: %w", r.Spec.Name, err)
	}
	switch {
	case len(r.Spec.Filesystems) > 0:
		return refuse("shares the host directory %s with its guest (9p, tag %q): QEMU cannot move a mounted 9p file system, so the VM cannot be live-migrated",
			r.Spec.Filesystems[0].Source, r.Spec.Filesystems[0].Tag)
	case r.Spec.Firmware == ports.FirmwareUEFI:
		return refuse("boots by UEFI: its UEFI variable store is not moved yet, so the VM cannot be live-migrated")
	case live.Devices != nil && len(live.Devices.Hostdevs) > 0:
		return refuse("has a host device passed through: its state lives in the device, so the VM cannot be live-migrated")
	case r.Spec.HugepageSizeBytes > 0:
		return refuse("is backed by hugepages: the receiving node's are reserved per pod, so the VM is not live-migrated")
	case len(r.Spec.CPUSet) > 0:
		return refuse("runs on pinned CPUs of this node: it is not live-migrated")
	}
	for _, d := range r.Spec.Disks {
		switch {
		case d.ReadOnly || d.Device == ports.DeviceCDROM:
		case d.Source.Type == ports.SourceNetwork:
			// Shared: the receiving VM attaches the same image.
		case d.Source.Type == ports.SourceBlock:
			return refuse("has the host block device %s as its disk %s: its data stays on this node, so the VM cannot be live-migrated", d.Source.Path, d.Name)
		case d.Name != "root" || d.Overlay == nil:
			return refuse("has the disk %s on this node's file system: live migration copies only the root disk's overlay yet, not volumes", d.Name)
		}
	}
	// What is copied: the root overlay, found in the live domain by its file.
	var copies []string
	if live.Devices != nil {
		for _, d := range live.Devices.Disks {
			if d.Source != nil && d.Source.File != nil && d.Source.File.File == r.DiskPaths["root"] && d.Target != nil && d.ReadOnly == nil {
				copies = append(copies, d.Target.Dev)
			}
		}
	}
	return copies, nil
}

// prepareIncoming checks an incoming VM's identity against the node and
// gives the spec the migrating domain's name and UUID.
func prepareIncoming(conn *libvirt.Connect, spec *ports.VMSpec) error {
	in := spec.Incoming
	name, id := in.Name, strings.ToLower(in.UUID)
	switch {
	case !restoredName.MatchString(name):
		return &ports.InvalidError{Field: "the migrating VM's domain name", Value: name, Reason: "it is not a Virtlet domain name", Allowed: NamePrefix + "<lowercase letters, digits, dots, dashes>"}
	case !uuidRE.MatchString(id):
		return &ports.InvalidError{Field: "the migrating VM's UUID", Value: in.UUID, Allowed: "a UUID"}
	}
	for _, look := range []func() (*libvirt.Domain, error){
		func() (*libvirt.Domain, error) { return conn.LookupDomainByName(name) },
		func() (*libvirt.Domain, error) { return conn.LookupDomainByUUIDString(id) },
	} {
		if dom, err := look(); err == nil {
			dom.Free()
			return fmt.Errorf("VM %s: the migrating VM's domain %s (UUID %s) exists on this node already: %w", spec.Name, name, id, ports.ErrAlreadyExists)
		}
	}
	spec.Name, spec.UUID = name, id
	return nil
}

// IncomingEndpoint makes the directory incoming VM id's QEMU listens in
// for the memory and disk streams, and returns it with the domain's
// definition on this node and libvirtd's socket.
func (m migrations) IncomingEndpoint(ctx context.Context, id string) (ports.MigrationEndpoint, error) {
	h := m.h
	var ep ports.MigrationEndpoint
	r, dom, err := h.lookup(id)
	if err != nil {
		return ep, err
	}
	defer dom.Free()
	h.mu.Lock()
	incoming, uri := r.Incoming, h.cfg.URI
	h.mu.Unlock()
	if !incoming {
		return ep, fmt.Errorf("VM %s is not waiting for a live migration: %w", r.Spec.Name, ports.ErrFailedPrecondition)
	}
	if ep.ControlSocket, err = libvirtSocket(uri); err != nil {
		return ep, err
	}
	if ep.DomainXML, err = dom.GetXMLDesc(libvirt.DOMAIN_XML_MIGRATABLE); err != nil {
		return ep, libvirtError("domain XML of "+r.Spec.Name, err)
	}
	uid, gid, err := qemuUser(r.Spec.RunAs)
	if err != nil {
		return ep, fmt.Errorf("VM %s: %w", r.Spec.Name, err)
	}
	dir, err := newMigrationDir()
	if err != nil {
		return ep, err
	}
	// QEMU makes its listening sockets here, as the VM's user.
	if err := os.Chown(dir, uid, gid); err != nil {
		os.RemoveAll(dir)
		return ep, err
	}
	ep.MemorySocket, ep.DisksSocket = filepath.Join(dir, "memory.sock"), filepath.Join(dir, "disks.sock")
	h.mu.Lock()
	r.IncomingDir = dir
	err = h.store.save(r)
	h.mu.Unlock()
	if err != nil {
		os.RemoveAll(dir)
		return ep, err
	}
	return ep, nil
}

// newMigrationDir makes a directory of its own, under a name no one
// guesses, in migrateRunDir (which no one but root lists).
func newMigrationDir() (string, error) {
	if err := os.MkdirAll(migrateRunDir, 0o711); err != nil {
		return "", err
	}
	if err := os.Chmod(migrateRunDir, 0o711); err != nil {
		return "", err
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	dir := filepath.Join(migrateRunDir, hex.EncodeToString(b))
	return dir, os.Mkdir(dir, 0o700)
}

// libvirtSocket is the unix socket of the libvirtd at uri.
func libvirtSocket(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", fmt.Errorf("libvirt URI %q: %w", uri, err)
	}
	if s := u.Query().Get("socket"); s != "" {
		return s, nil
	}
	if (u.Scheme == "qemu" || u.Scheme == "qemu+unix") && u.Host == "" && u.Path == "/system" {
		return "/run/libvirt/libvirt-sock", nil
	}
	return "", fmt.Errorf("live migration needs libvirtd's unix socket: the plugin's uri %q names none (want qemu:///system or ?socket=): %w", uri, ports.ErrFailedPrecondition)
}

// qemuUser is the user a VM's QEMU runs as: its own, or qemu.conf's
// (Debian's libvirt-qemu).
func qemuUser(runAs *ports.ProcessIdentity) (int, int, error) {
	if runAs != nil {
		return runAs.UID, runAs.GID, nil
	}
	u, err := user.Lookup("libvirt-qemu")
	if err != nil {
		return 0, 0, fmt.Errorf("the QEMU user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// MigrateVM live-migrates running VM id into the domain at to, whose
// sockets on this node the caller forwards to the receiving node.
func (m migrations) MigrateVM(ctx context.Context, id string, to ports.MigrationEndpoint) (ports.MigrationStats, error) {
	h := m.h
	var st ports.MigrationStats
	r, dom, err := h.lookup(id)
	if err != nil {
		return st, err
	}
	defer dom.Free()
	copies, err := m.checkMigratable(r, dom)
	if err != nil {
		return st, err
	}
	own, err := dom.GetXMLDesc(libvirt.DOMAIN_XML_MIGRATABLE)
	if err != nil {
		return st, libvirtError("domain XML of "+r.Spec.Name, err)
	}
	destXML, err := destinationXML(own, to.DomainXML)
	if err != nil {
		return st, fmt.Errorf("VM %s: the receiving node's definition: %w", r.Spec.Name, err)
	}
	for _, p := range []string{to.ControlSocket, to.MemorySocket, to.DisksSocket} {
		if !filepath.IsAbs(p) {
			return st, &ports.InvalidError{Field: "migration socket", Value: p, Allowed: "an absolute path"}
		}
	}
	params := &libvirt.DomainMigrateParameters{
		URISet: true, URI: "unix://" + to.MemorySocket,
		DestXMLSet: true, DestXML: destXML,
	}
	domType, err := domainType(own)
	if err != nil {
		return st, fmt.Errorf("VM %s: its domain XML: %w", r.Spec.Name, err)
	}
	flags, live := migrationFlags(domType)
	if len(copies) > 0 {
		// Only the root overlay is copied (what it holds over the image
		// both nodes have): shared (network) disks are the receiving VM's
		// too, and read-only media its own.
		flags |= libvirt.MIGRATE_NON_SHARED_INC
		params.MigrateDisksSet, params.MigrateDisks = true, copies
		params.DisksURISet, params.DisksURI = true, "unix://"+to.DisksSocket
	}
	log := h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "pod": r.Spec.PodNamespace + "/" + r.Spec.PodName, "live": live})
	if live {
		// QEMU switches over once what is left to copy fits in this pause
		// (its default is 300 ms).
		if err := dom.MigrateSetMaxDowntime(uint64(maxDowntime.Milliseconds()), 0); err != nil {
			log.WithError(err).Warn("live migration: set the largest pause")
		}
	}
	log.Info("live migration started")
	begin := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- dom.MigrateToURI3("qemu+unix:///system?socket="+url.QueryEscape(to.ControlSocket), params, flags)
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		// The caller gave up: abort, and wait for libvirt to end the job
		// (the guest runs on here).
		if aerr := dom.AbortJob(); aerr != nil {
			log.WithError(aerr).Warn("live migration: abort")
		}
		err = <-done
		if err == nil {
			err = ctx.Err()
		}
	}
	st.Total, st.PausedThroughout = time.Since(begin), !live
	if err != nil {
		log.WithError(err).Warn("live migration failed: the VM runs on here")
		// The migration failed, not this node's libvirtd: a peer that went
		// away closes libvirt's connection to it ("client socket is
		// closed"), which is no reason to call this plugin unavailable.
		msg := err.Error()
		var le libvirt.Error
		if errors.As(err, &le) {
			msg = le.Message
		}
		return st, fmt.Errorf("live-migrate domain %s: %s (the guest runs on at this node): %w", r.Spec.Name, msg, ports.ErrFailedPrecondition)
	}
	if info, err := dom.GetJobStats(libvirt.DOMAIN_JOB_STATS_COMPLETED); err == nil {
		if info.DowntimeSet {
			st.Downtime = time.Duration(info.Downtime) * time.Millisecond
		}
		st.MemoryBytes, st.DiskBytes = info.MemProcessed, info.DiskProcessed
	} else {
		log.WithError(err).Warn("live migration: the completed job's figures")
	}
	h.mu.Lock()
	if r.State == ports.VMRunning {
		h.reconciler.exitLocked(r, migratedExit)
		if err := h.store.save(r); err != nil {
			log.WithError(err).Warn("save VM record")
		}
		h.watchers.notify(r.status())
	}
	h.mu.Unlock()
	log.WithFields(logrus.Fields{"millis": st.Total.Milliseconds(), "downtimeMillis": st.Downtime.Milliseconds(),
		"memoryBytes": st.MemoryBytes, "diskBytes": st.DiskBytes}).Info("live migration done: the guest runs on the receiving node")
	return st, nil
}

// migrationFlags are a migration's flags for a domain of libvirt type
// domType, and whether the guest runs while it is copied. Peer to peer:
// this node's libvirtd drives it, over the control socket. The receiving
// domain keeps the definition its node gave it (no PERSIST_DEST: the
// receiving daemon refuses one from here). The source domain stays
// defined (shut off) so that its completed job's figures can be read;
// Undefine removes it.
//
// Only a KVM guest is copied live. QEMU's TCG (7.2, Debian 12's) loses
// writes during a live copy: once a page is dirty for every dirty-memory
// client, the vCPU's TLB entry for it writes straight to memory, and the
// migration's bitmap sync clears the page's migration bit without
// resetting that entry (cpu_physical_memory_sync_dirty_bitmap's
// word-aligned path, which guest RAM always takes), so writes through
// it until the guest next flushes its TLB (a CR3 load) are never copied
// again. An idle guest's kernel stacks then arrive stale, and its
// kernel oopses on the receiving node (the tiny guest under plain QEMU on
// a busy host: 9 of 40 live migrations, none of 28 paused ones). So a
// TCG guest is paused for the whole copy (no LIVE: libvirt pauses it, and
// resumes it on the receiving node, or here if the migration fails).
func migrationFlags(domType string) (flags libvirt.DomainMigrateFlags, live bool) {
	flags = libvirt.MIGRATE_PEER2PEER | libvirt.MIGRATE_ABORT_ON_ERROR
	if domType == kvmAccel.DomainType {
		return flags | libvirt.MIGRATE_LIVE, true
	}
	return flags, false
}

// maxDowntime is the longest pause a live migration plans for its guest.
const maxDowntime = 50 * time.Millisecond

var migratedExit = exit{0, ports.ReasonMigrated, "the guest moved to another node (live migration)"}

// arrivedLocked takes an incoming VM's guest as the VM's once the migration
// has brought it: callers hold h.mu.
func (m migrations) arrivedLocked(r *record) error {
	h := m.h
	r.Incoming = false
	r.State = ports.VMRunning
	r.seq++
	r.StartedAt, r.FinishedAt = time.Now().UTC(), time.Time{}
	if r.IncomingDir != "" {
		os.RemoveAll(r.IncomingDir)
		r.IncomingDir = ""
	}
	if h.tailers[r.Spec.ID] == nil {
		h.reconciler.startTailerLocked(r)
	}
	if err := h.store.save(r); err != nil {
		return err
	}
	h.watchers.notify(r.status())
	return nil
}

// CheckArrival vets the definition the sending node's libvirtd asks this
// node's to run incoming VM id's guest in (checkArrivingXML).
func (m migrations) CheckArrival(ctx context.Context, id, domainXML string) (string, error) {
	h := m.h
	r, dom, err := h.lookup(id)
	if err != nil {
		return "", err
	}
	defer dom.Free()
	h.mu.Lock()
	incoming := r.Incoming
	h.mu.Unlock()
	if !incoming {
		return "", fmt.Errorf("VM %s is not waiting for a live migration: %w", r.Spec.Name, ports.ErrFailedPrecondition)
	}
	ours, err := dom.GetXMLDesc(libvirt.DOMAIN_XML_MIGRATABLE)
	if err != nil {
		return "", libvirtError("domain XML of "+r.Spec.Name, err)
	}
	checked, err := checkArrivingXML(ours, domainXML)
	if err != nil {
		h.log.WithError(err).WithField("vm", r.Spec.Name).Warn("live migration: the sending node's definition refused")
		return "", fmt.Errorf("VM %s: the sending node's definition: %w", r.Spec.Name, err)
	}
	return checked, nil
}
