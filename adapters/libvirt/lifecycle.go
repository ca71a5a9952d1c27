// A VM's life: Define, Start, Stop and Undefine.

package libvirt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// Define creates the VM's root disk overlay and defines its domain.
func (h *Hypervisor) Define(ctx context.Context, spec ports.VMSpec) error {
	if err := validID(spec.ID); err != nil {
		return err
	}
	if spec.VCPUs < 1 || spec.MemoryBytes <= 0 {
		return fmt.Errorf("VM %s: needs vCPUs and memory: %w", spec.Name, ports.ErrInvalidArgument)
	}
	conn, err := h.conn.current()
	if err != nil {
		return err
	}
	h.mu.Lock()
	if r, ok := h.records[spec.ID]; ok {
		same := r.definedFrom(spec)
		h.mu.Unlock()
		if same {
			return nil
		}
		return fmt.Errorf("VM %s is defined with another spec: %w", spec.ID, ports.ErrAlreadyExists)
	}
	vmDir, accel, pool := h.vmDir, h.accel, h.pool
	h.mu.Unlock()
	if pool != nil && spec.RunAs != nil && spec.RunAs.UID >= pool.firstUID && spec.RunAs.UID < pool.firstUID+pool.uids {
		return fmt.Errorf("VM %s: %w", spec.Name, &ports.InvalidError{Field: "VM user", Value: strconv.Itoa(spec.RunAs.UID),
			Reason:  "it is one of the users the libvirt plugin's pool domains run as (its config pool.users)",
			Allowed: "daemon vmUsers and the libvirt plugin's pool.users that do not overlap"})
	}
	if spec.RunAs != nil {
		// A few xattr reads when already granted. Until the record holds
		// the VM, the grants are the creation's; if it fails, a sync
		// takes them back.
		done, err := h.grants.grantNow(spec.ID, spec.RunAs.UID, overlayBases(spec))
		if err != nil {
			return fmt.Errorf("VM %s runs as user %d: %w", spec.Name, spec.RunAs.UID, err)
		}
		defer func() {
			done()
			// A failed creation's grants go; so do those of the user the
			// VM asked for when it took a pool domain's.
			h.grants.syncSoon()
		}()
	} else if err := openToQEMUUser(h.log, overlayBases(spec)); err != nil {
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}

	hostCPUs, err := checkHost(conn, &h.machines, spec, accel)
	if err != nil {
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}
	asked := vmIdentity{Name: spec.Name, UUID: spec.UUID, RunAs: spec.RunAs}
	if spec.Restore != nil {
		// The checkpointed domain's name and UUID: libvirt restores a
		// state into no other.
		if _, err := prepareRestore(conn, &spec); err != nil {
			return err
		}
		release, err := reserveRestore(h, spec)
		if err != nil {
			return err
		}
		defer release() // the record, once saved, holds them
	}
	if spec.Incoming != nil {
		// The migrating domain's name and UUID: the guest keeps them.
		if spec.Restore != nil {
			return fmt.Errorf("VM %s: both restored from a checkpoint and receiving a live migration: %w", spec.Name, ports.ErrInvalidArgument)
		}
		if err := prepareIncoming(conn, &spec); err != nil {
			return err
		}
		release, err := reserveRestore(h, spec)
		if err != nil {
			return err
		}
		defer release()
	}
	log := h.log.WithFields(logrus.Fields{"vm": spec.Name, "pod": spec.PodNamespace + "/" + spec.PodName})
	var medium int64
	if pool != nil {
		medium = mediumSize(spec)
	}
	shape, coldWhy := poolable(spec, accel, medium)
	r := &record{Spec: spec.WithoutSecrets(), DiskPaths: map[string]string{}, ConsoleLog: filepath.Join(vmDir, spec.ID+".console"), State: ports.VMDefined}
	if spec.Restore != nil || spec.Incoming != nil {
		r.Asked = &asked
		r.Incoming = spec.Incoming != nil
	} else if spec.UUID == "" {
		// The pod asks for no UUID: one derived from the VM's ID, stable
		// for its life (a VM claimed from the pool gets the pool's).
		r.Asked = &vmIdentity{Name: spec.Name, RunAs: spec.RunAs}
		spec.UUID = uuid.NewSHA1(vmUUIDSpace, []byte(spec.ID)).String()
		r.Spec.UUID = spec.UUID
	}
	switch {
	case pool == nil:
	case spec.Restore != nil:
		log.Info("cold start: a VM restored from a checkpoint resumes in a domain of its own")
	case spec.Incoming != nil:
		log.Info("cold start: a VM receiving a live migration waits in a domain of its own")
	case coldWhy != "":
		log.WithField("why", coldWhy).Info("cold start: the VM cannot come from the pool")
	default:
		if d := pool.take(shape); d == nil {
			log.WithField("shape", shape.Key).Info("cold start: no pool domain of the VM's shape is ready")
		} else {
			claimed := pool.claim(conn, d, spec, r, accel, log)
			pool.claimEnded(d)
			if claimed {
				return nil
			}
		}
	}
	var made []string
	undo := func() {
		removeFiles(made...)
		if len(r.Secrets) > 0 {
			undefineSecrets(conn, spec.ID)
		}
	}
	if made, err = createOverlays(ctx, vmDir, spec, r, log); err != nil {
		undo()
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}
	if spec.Restore != nil {
		state := restoreStatePath(vmDir, spec.ID)
		if err := moveFile(spec.Restore.StateFile, state); err != nil {
			undo()
			return fmt.Errorf("VM %s: the checkpoint's state: %w", spec.Name, err)
		}
		made, r.RestoreState = append(made, state), state
	}
	removeFiles(append(consoleSideFiles(r.ConsoleLog), r.ConsoleLog)...) // a stale log of a reused ID
	if r.Secrets, err = defineSecrets(conn, spec); err != nil {
		undo()
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}
	domXML, err := domainXML(domainInput{Spec: spec, accelerator: accel, DiskPaths: r.DiskPaths, ConsoleLog: r.ConsoleLog, Secrets: r.Secrets,
		HostCPUs: hostCPUs, Owner: h.owner})
	if err != nil {
		undo()
		return err
	}
	h.defineMu.Lock()
	dom, err := conn.DomainDefineXMLFlags(domXML, libvirt.DOMAIN_DEFINE_VALIDATE)
	h.defineMu.Unlock()
	if err != nil {
		undo()
		return libvirtError("define domain "+spec.Name, err)
	}
	dom.Free()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.store.save(r); err != nil {
		return err
	}
	h.records[spec.ID] = r
	log.WithField("accelerator", accel.Name).Info("domain defined")
	return nil
}

// createOverlays creates the overlays of the VM's disks in vmDir and
// names them in r; it returns the files it made, those made before an
// error included.
func createOverlays(ctx context.Context, vmDir string, spec ports.VMSpec, r *record, log logrus.FieldLogger) ([]string, error) {
	var made []string
	for _, d := range spec.Disks {
		if d.Overlay == nil {
			continue
		}
		p := filepath.Join(vmDir, spec.ID+"-"+d.Name+".qcow2")
		if spec.Restore != nil && spec.Restore.Disks[d.Name] != "" {
			// A restored VM's disk: the checkpoint's copy, over the same base.
			begin := time.Now()
			if err := adoptDisk(ctx, spec.Restore.Disks[d.Name], p, *d.Overlay, d.Name); err != nil {
				return made, err
			}
			made = append(made, p)
			r.DiskPaths[d.Name] = p
			log.WithFields(logrus.Fields{"disk": d.Name, "base": d.Overlay.BasePath, "millis": time.Since(begin).Milliseconds()}).Info("root disk taken from the checkpoint")
			continue
		}
		took, err := createOverlay(ctx, p, *d.Overlay, d.Name)
		if err != nil {
			return made, err
		}
		made = append(made, p)
		r.DiskPaths[d.Name] = p
		log.WithFields(logrus.Fields{"disk": d.Name, "base": d.Overlay.BasePath, "millis": took.Milliseconds()}).Info("root disk overlay created")
	}
	return made, nil
}

// lookup returns VM id's record and its domain on the live connection
// (the caller frees it).
func (h *Hypervisor) lookup(id string) (*record, *libvirt.Domain, error) {
	conn, err := h.conn.current()
	if err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	r := h.records[id]
	h.mu.Unlock()
	if r == nil {
		return nil, nil, fmt.Errorf("VM %s: %w", id, ports.ErrNotFound)
	}
	dom, err := conn.LookupDomainByUUIDString(r.Spec.UUID)
	if err != nil {
		return r, nil, libvirtError("look up domain "+r.Spec.Name, err)
	}
	return r, dom, nil
}

// Start boots the VM, streaming its console from the first byte.
func (h *Hypervisor) Start(ctx context.Context, id string) error {
	r, dom, err := h.lookup(id)
	if err != nil {
		return err
	}
	defer dom.Free()
	state, _, err := dom.GetState()
	h.mu.Lock()
	incoming := r.Incoming
	h.mu.Unlock()
	if incoming {
		// The guest comes from the migration, not from a boot.
		if err != nil || state != libvirt.DOMAIN_RUNNING {
			return fmt.Errorf("VM %s waits for a live migration, and its guest has not arrived (domain state %d): %w", r.Spec.Name, state, ports.ErrFailedPrecondition)
		}
		h.mu.Lock()
		err := h.migrations.arrivedLocked(r)
		h.mu.Unlock()
		if err != nil {
			return err
		}
		if len(r.Spec.NICs) > 0 {
			go flapLinks(h, id) // the guest asks for this pod's address
		}
		h.log.WithField("vm", r.Spec.Name).Info("VM started: its guest arrived by live migration")
		return nil
	}
	if err == nil && state == libvirt.DOMAIN_RUNNING {
		h.mu.Lock()
		stale := r.RestoreState
		if stale != "" {
			// Restored before a crash that came before the record said so:
			// the state must never be resumed again over the newer disk.
			r.RestoreState = ""
			if err := h.store.save(r); err != nil {
				h.mu.Unlock()
				return err
			}
		}
		h.mu.Unlock()
		removeFiles(stale)
		return nil
	}
	begin := time.Now()
	h.mu.Lock()
	resume := r.Prelaunched && state == libvirt.DOMAIN_PAUSED
	r.seq++
	r.StartedAt, r.FinishedAt = time.Now().UTC(), time.Time{}
	r.ExitCode, r.Reason, r.Message = 0, "", ""
	r.StopRequested, r.ForcedAfter, r.Crashed, r.Watchdog = false, 0, false, ""
	if info, err := os.Stat(r.ConsoleLog); err == nil {
		r.ConsoleOffset, r.ConsoleInode = info.Size(), inodeOf(info) // only new output
	}
	if h.tailers[id] == nil {
		h.reconciler.startTailerLocked(r)
	}
	restoring := r.RestoreState != ""
	h.mu.Unlock()
	start := dom.Create
	switch {
	case resume:
		start = dom.Resume // a VM claimed from the pool: paused before its first instruction
	case restoring:
		start = func() error { return restoreDomain(h, dom, r) }
	}
	if err := start(); err != nil {
		h.mu.Lock()
		if t := h.tailers[id]; t != nil {
			delete(h.tailers, id)
			go t.close()
		}
		h.mu.Unlock()
		return libvirtError("start domain "+r.Spec.Name, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r.State = ports.VMRunning
	r.Prelaunched = false
	r.seq++
	var stateFile string
	if restoring {
		stateFile, r.RestoreState = r.RestoreState, ""
	}
	if err := h.store.save(r); err != nil {
		return err
	}
	h.watchers.notify(r.status())
	if resume {
		h.pool.resumed()
	}
	if restoring {
		removeFiles(stateFile)
		if len(r.Spec.NICs) > 0 {
			go flapLinks(h, id)
		}
	}
	h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "resumed": resume, "restored": restoring, "millis": time.Since(begin).Milliseconds()}).Info("VM started")
	return nil
}

// Stop presses the ACPI power button (again every few seconds: a guest may
// not listen yet), waits up to timeout, then forces the VM off.
func (h *Hypervisor) Stop(ctx context.Context, id string, timeout time.Duration) (ports.VMStatus, error) {
	r, dom, err := h.lookup(id)
	if err != nil {
		return ports.VMStatus{}, err
	}
	defer func() { dom.Free() }()
	h.mu.Lock()
	incoming := r.Incoming
	h.mu.Unlock()
	if incoming {
		// A receiving VM whose guest was not taken yet: its incoming QEMU
		// ends, and with it the migration (the guest runs on at its
		// source).
		if state, _, err := h.domainState(dom); err == nil && state != libvirt.DOMAIN_SHUTOFF {
			if err := dom.Destroy(); err != nil {
				return ports.VMStatus{}, libvirtError("end the incoming migration of "+r.Spec.Name, err)
			}
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		return r.status(), nil
	}
	// A VM is stopped only when libvirt says so: while libvirt cannot be
	// asked (libvirtd died), the VM may well run on. Once the adapter has
	// reconnected, the domain is looked up on the new connection.
	running := func() (bool, error) {
		state, _, err := h.domainState(dom)
		if err != nil {
			if _, fresh, lerr := h.lookup(id); lerr == nil {
				dom.Free()
				dom = fresh
				state, _, err = h.domainState(dom)
			}
		}
		if err != nil {
			return false, libvirtError("state of domain "+r.Spec.Name, err)
		}
		return state != libvirt.DOMAIN_SHUTOFF, nil
	}
	stoppedForSure := func() bool {
		run, err := running()
		return err == nil && !run
	}
	// libvirt is never asked with h.mu held: a slow domain must not hold
	// up calls about others.
	state, reason, err := h.domainState(dom)
	if err != nil {
		return ports.VMStatus{}, libvirtError("stop "+r.Spec.Name+": read its state", err)
	}
	if state == libvirt.DOMAIN_SHUTOFF {
		return h.reconciler.foundShutOff(r, reason), nil // the stop event may still be on its way
	}
	done := make(chan struct{})
	h.mu.Lock()
	r.StopRequested = true
	h.store.save(r)
	h.stopped[id] = append(h.stopped[id], done)
	h.mu.Unlock()

	wait := func(d time.Duration, press bool) bool {
		deadline := time.After(d)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		lastPress := time.Now()
		for {
			select {
			case <-done:
				return true
			case <-ctx.Done():
				return false
			case <-deadline:
				return false
			case <-tick.C:
				if stoppedForSure() {
					return true
				}
				if press && time.Since(lastPress) >= 3*time.Second {
					dom.ShutdownFlags(libvirt.DOMAIN_SHUTDOWN_ACPI_POWER_BTN)
					lastPress = time.Now()
				}
			}
		}
	}
	stopped := false
	if timeout > 0 {
		if err := dom.ShutdownFlags(libvirt.DOMAIN_SHUTDOWN_ACPI_POWER_BTN); err != nil && !stoppedForSure() {
			h.log.WithError(err).WithField("vm", r.Spec.Name).Warn("ACPI shutdown")
		}
		stopped = wait(timeout, true)
	}
	if !stopped {
		if ctx.Err() != nil {
			return ports.VMStatus{}, ctx.Err()
		}
		h.mu.Lock()
		r.ForcedAfter = timeout
		h.mu.Unlock()
		if err := dom.Destroy(); err != nil && !stoppedForSure() {
			return ports.VMStatus{}, libvirtError("force off domain "+r.Spec.Name, err)
		}
		if !wait(10*time.Second, false) {
			return ports.VMStatus{}, fmt.Errorf("VM %s did not stop after being forced off", r.Spec.Name)
		}
	}
	// The event may not have been applied yet: apply the shutoff reason.
	h.mu.Lock()
	applied := r.State != ports.VMRunning
	h.mu.Unlock()
	if !applied {
		if _, reason, err := h.domainState(dom); err == nil {
			return h.reconciler.foundShutOff(r, reason), nil
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return r.status(), nil
}

// foundShutOff records the end of a VM found shut off whose stop event has
// not been applied (yet), and reports the VM.
func (rc *reconciler) foundShutOff(r *record, reason int) ports.VMStatus {
	rc.h.mu.Lock()
	defer rc.h.mu.Unlock()
	if r.State == ports.VMRunning {
		rc.exitLocked(r, exitFromShutoff(libvirt.DomainShutoffReason(reason), r))
		rc.h.store.save(r)
		rc.h.watchers.notify(r.status())
	}
	return r.status()
}

// Undefine removes the domain (forcing it off first), its overlay disks,
// its console logs and its record.
func (h *Hypervisor) Undefine(ctx context.Context, id string) error {
	conn, err := h.conn.current()
	if err != nil {
		return err
	}
	h.mu.Lock()
	r := h.records[id]
	h.mu.Unlock()
	var dom *libvirt.Domain
	if r != nil {
		dom, err = conn.LookupDomainByUUIDString(r.Spec.UUID)
	} else {
		dom, err = findOrphan(conn, h.owner, id)
	}
	if err != nil {
		var le libvirt.Error
		if !errors.As(err, &le) || le.Code != libvirt.ERR_NO_DOMAIN {
			return libvirtError("look up domain of VM "+id, err)
		}
		dom = nil
	}
	if r == nil {
		// A plugin killed during Define leaves the files it had made
		// before the record that would name them.
		if err := removeLeftovers(h.settings().vmDir, h.store, id); err != nil {
			return err
		}
	}
	if r == nil && dom == nil {
		return fmt.Errorf("VM %s: %w", id, ports.ErrNotFound)
	}
	if dom != nil {
		defer dom.Free()
		// Its watchdog's memory dumps, named by the domain (a pooled VM's
		// by its pool name).
		if name, err := dom.GetName(); err == nil {
			h.dumps.prune(id, name, 0)
		}
		persistent, err := dom.IsPersistent()
		if err != nil {
			return libvirtError("look up domain of VM "+id, err)
		}
		if state, _, err := dom.GetState(); err == nil && state != libvirt.DOMAIN_SHUTOFF {
			if err := dom.Destroy(); err != nil {
				return libvirtError("force off domain of VM "+id, err)
			}
		}
		flags := libvirt.DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | libvirt.DOMAIN_UNDEFINE_NVRAM
		if !persistent {
			// A pool domain whose claim was interrupted: gone once destroyed.
		} else if err := dom.UndefineFlags(flags); err != nil {
			return libvirtError("undefine domain of VM "+id, err)
		}
	}
	if err := undefineSecrets(conn, id); err != nil {
		return fmt.Errorf("VM %s: %w", id, err)
	}
	if r == nil {
		h.grants.sync()
		h.log.WithField("vm", id).Info("orphan domain undefined")
		return nil
	}
	h.mu.Lock()
	t := h.tailers[id]
	delete(h.tailers, id)
	delete(h.records, id)
	h.mu.Unlock()
	if t != nil {
		t.close()
	}
	h.consoles.close(id, allRuns)
	files := []string{r.ConsoleLog, r.RestoreState}
	if vmDir := h.settings().vmDir; vmDir != "" {
		files = append(files, restoreStatePath(vmDir, id)) // a crash may have left it unnamed
	}
	files = append(files, consoleSideFiles(r.ConsoleLog)...)
	if r.IncomingDir != "" {
		os.RemoveAll(r.IncomingDir) // a migration that never arrived
	}
	for _, p := range r.DiskPaths {
		files = append(files, p)
	}
	if err := removeFiles(files...); err != nil {
		return fmt.Errorf("remove files of VM %s: %w", r.Spec.Name, err)
	}
	if err := h.store.remove(id); err != nil {
		return err
	}
	h.grants.sync() // its user's entries go
	h.log.WithField("vm", r.Spec.Name).Info("domain undefined, disks removed")
	return nil
}

// vmUUIDSpace derives the UUIDs of VMs whose pods ask for none from their
// IDs (the core did, before the hypervisor chose).
var vmUUIDSpace = uuid.MustParse("a3f0c1de-5b2c-4e1f-9d53-6c1b7e3d9a10")
