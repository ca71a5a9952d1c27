// Live migration (ports.VMMigrator). The receiving node's plugin defines
// the VM first with the migrating domain's name and UUID (Define with
// spec.Incoming: an empty root overlay over the same image), then the
// sending node's libvirtd migrates the running domain into it, peer to
// peer: its control connection and QEMU's memory and disk streams all go
// through unix sockets that the two daemons join over their mutual-TLS
// link. libvirt copies the root overlay as the guest runs (NBD, only what
// the overlay holds over the image both nodes have), then the memory, and
// the guest pauses only for the last of it.

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
	if err := m.checkMigratable(r, dom); err != nil {
		return ports.VMIncoming{}, err
	}
	return ports.VMIncoming{Name: r.Spec.Name, UUID: strings.ToLower(r.Spec.UUID)}, nil
}

// checkMigratable refuses, by name, what a live migration cannot move:
// what a checkpoint cannot capture, and (for now) any disk but the root
// overlay and read-only media.
func (m migrations) checkMigratable(r *record, dom *libvirt.Domain) error {
	h := m.h
	h.mu.Lock()
	state := r.State
	h.mu.Unlock()
	if state != ports.VMRunning {
		return fmt.Errorf("VM %s is %s, not running: only a running VM is live-migrated: %w", r.Spec.Name, state, ports.ErrFailedPrecondition)
	}
	x, err := dom.GetXMLDesc(0)
	if err != nil {
		return libvirtError("domain XML of "+r.Spec.Name, err)
	}
	var live libvirtxml.Domain
	if err := live.Unmarshal(x); err != nil {
		return fmt.Errorf("domain XML of %s: %w", r.Spec.Name, err)
	}
	plan, err := planCheckpoint(r, &live)
	if err != nil {
		// The same refusals, in a migration's words.
		msg := strings.TrimSuffix(err.Error(), ": "+ports.ErrFailedPrecondition.Error())
		msg = strings.NewReplacer("cannot be checkpointed", "cannot be live-migrated", "part of a checkpoint", "migrated").Replace(msg)
		return fmt.Errorf("%s: %w", msg, ports.ErrFailedPrecondition)
	}
	for _, c := range plan.copies {
		if c.name != "root" || c.backing == "" {
			return fmt.Errorf("VM %s has the writable disk %s: live migration copies only the root disk's overlay yet, not volumes: %w", r.Spec.Name, c.name, ports.ErrFailedPrecondition)
		}
	}
	switch {
	case r.Spec.HugepageSizeBytes > 0:
		return fmt.Errorf("VM %s is backed by hugepages: the receiving node's are reserved per pod, so the VM is not live-migrated: %w", r.Spec.Name, ports.ErrFailedPrecondition)
	case len(r.Spec.CPUSet) > 0:
		return fmt.Errorf("VM %s runs on pinned CPUs of this node: it is not live-migrated: %w", r.Spec.Name, ports.ErrFailedPrecondition)
	}
	return nil
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
	if err := m.checkMigratable(r, dom); err != nil {
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
		DisksURISet: true, DisksURI: "unix://" + to.DisksSocket,
		DestXMLSet: true, DestXML: destXML,
		PersistXMLSet: true, PersistXML: destXML,
	}
	// Peer to peer: this node's libvirtd drives it, over the control
	// socket. The source domain stays defined (shut off) so that its
	// completed job's figures can be read; Undefine removes it.
	flags := libvirt.MIGRATE_LIVE | libvirt.MIGRATE_PEER2PEER | libvirt.MIGRATE_PERSIST_DEST | libvirt.MIGRATE_NON_SHARED_INC | libvirt.MIGRATE_ABORT_ON_ERROR
	log := h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "pod": r.Spec.PodNamespace + "/" + r.Spec.PodName})
	// QEMU switches over once what is left to copy fits in this pause
	// (its default is 300 ms).
	if err := dom.MigrateSetMaxDowntime(uint64(maxDowntime.Milliseconds()), 0); err != nil {
		log.WithError(err).Warn("live migration: set the largest pause")
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
	st.Total = time.Since(begin)
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

// maxDowntime is the longest pause a migration plans for its guest.
const maxDowntime = 50 * time.Millisecond

var migratedExit = exit{0, ports.ReasonMigrated, "the guest moved to another node (live migration)"}

// destinationXML is the sending domain's definition with what is the
// receiving node's own taken from its definition: disk files (by target
// device), the taps of the NICs (by MAC), the console, channels and
// display, the emulator, the security labels and resource partition. The
// virtual hardware stays the running guest's.
func destinationXML(own, theirs string) (string, error) {
	var src, dst libvirtxml.Domain
	if err := src.Unmarshal(own); err != nil {
		return "", err
	}
	if err := dst.Unmarshal(theirs); err != nil {
		return "", err
	}
	if src.UUID != dst.UUID || src.Name != dst.Name {
		return "", fmt.Errorf("it is domain %s (UUID %s), not %s (%s): %w", dst.Name, dst.UUID, src.Name, src.UUID, ports.ErrInvalidArgument)
	}
	if src.Devices == nil || dst.Devices == nil {
		return "", fmt.Errorf("a definition without devices: %w", ports.ErrInvalidArgument)
	}
	disks := map[string]libvirtxml.DomainDisk{}
	for _, d := range dst.Devices.Disks {
		if d.Target != nil {
			disks[d.Target.Dev] = d
		}
	}
	for i, d := range src.Devices.Disks {
		if d.Target == nil {
			continue
		}
		theirs, ok := disks[d.Target.Dev]
		if !ok {
			return "", fmt.Errorf("it has no disk %s: %w", d.Target.Dev, ports.ErrInvalidArgument)
		}
		src.Devices.Disks[i].Source = theirs.Source
		src.Devices.Disks[i].BackingStore = theirs.BackingStore
	}
	nics := map[string]libvirtxml.DomainInterface{}
	for _, n := range dst.Devices.Interfaces {
		if n.MAC != nil {
			nics[strings.ToLower(n.MAC.Address)] = n
		}
	}
	for i, n := range src.Devices.Interfaces {
		if n.MAC == nil {
			continue
		}
		theirs, ok := nics[strings.ToLower(n.MAC.Address)]
		if !ok {
			return "", fmt.Errorf("it has no NIC with the MAC %s: %w", n.MAC.Address, ports.ErrInvalidArgument)
		}
		src.Devices.Interfaces[i].Target = theirs.Target
		src.Devices.Interfaces[i].Source = theirs.Source
	}
	src.Devices.Emulator = dst.Devices.Emulator
	src.Devices.Serials, src.Devices.Consoles = dst.Devices.Serials, dst.Devices.Consoles
	src.Devices.Channels, src.Devices.Graphics = dst.Devices.Channels, dst.Devices.Graphics
	src.SecLabel, src.Resource, src.Metadata = dst.SecLabel, dst.Resource, dst.Metadata
	return src.Marshal()
}

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
