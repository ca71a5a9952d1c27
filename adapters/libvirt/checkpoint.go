// Checkpoints of running VMs: the guest paused, its memory written as a
// libvirt save image (a memory-only external snapshot, which leaves the
// domain defined and paused), its writable disks copied while it cannot
// write to them, then resumed.

package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// Where CheckpointVM writes, relative to its dir.
const (
	checkpointStateFile  = "checkpoint/memory.save"
	checkpointDomainFile = "checkpoint/domain.xml"
	checkpointDisksDir   = "disks"
)

// checkpointPlan is what a checkpoint of one VM copies and leaves out.
type checkpointPlan struct {
	copies  []diskCopy
	skipped []ports.CheckpointDisk
	targets []string // every disk's target device, none snapshotted
}

type diskCopy struct {
	name, source, format, backing string
}

// planCheckpoint decides, from the VM's spec and the live domain, what a
// checkpoint copies; what it cannot capture whole is refused by name.
func planCheckpoint(r *record, live *libvirtxml.Domain) (checkpointPlan, error) {
	var p checkpointPlan
	if len(r.Spec.Filesystems) > 0 {
		return p, fmt.Errorf("VM %s shares the host directory %s with its guest (9p, tag %q): QEMU cannot save a mounted 9p file system's state, so the VM cannot be checkpointed: %w",
			r.Spec.Name, r.Spec.Filesystems[0].Source, r.Spec.Filesystems[0].Tag, ports.ErrFailedPrecondition)
	}
	if r.Spec.Firmware == ports.FirmwareUEFI {
		return p, fmt.Errorf("VM %s boots by UEFI: its UEFI variable store is not part of a checkpoint yet, and a guest restored over another would lose or corrupt its variables: %w",
			r.Spec.Name, ports.ErrFailedPrecondition)
	}
	if live.Devices != nil && len(live.Devices.Hostdevs) > 0 {
		return p, fmt.Errorf("VM %s has a host device passed through (e.g. an SR-IOV function): its state lives in the device, so the VM cannot be checkpointed: %w",
			r.Spec.Name, ports.ErrFailedPrecondition)
	}
	for _, d := range r.Spec.Disks {
		src := d.Source.Path
		if p, ok := r.DiskPaths[d.Name]; ok {
			src = p
		}
		switch {
		case d.ReadOnly || d.Device == ports.DeviceCDROM:
			p.skipped = append(p.skipped, ports.CheckpointDisk{Name: d.Name, Format: d.Source.Format,
				Why: "read-only: the guest cannot change it, and a restoring pod brings its own (cloud-init media, read-only volumes)"})
		case d.Source.Type == ports.SourceNetwork:
			return p, fmt.Errorf("VM %s's disk %s is the network disk %s %s: a checkpoint does not copy it, and the memory restored over a disk that changed since would corrupt the guest's file systems: %w",
				r.Spec.Name, d.Name, d.Source.Protocol, d.Source.Name, ports.ErrFailedPrecondition)
		case d.Source.Type == ports.SourceBlock:
			return p, fmt.Errorf("VM %s's disk %s is the host block device %s: its data stays on this node, so the VM cannot be checkpointed: %w",
				r.Spec.Name, d.Name, src, ports.ErrFailedPrecondition)
		case d.Source.Offset != 0:
			return p, fmt.Errorf("VM %s's disk %s is a slice of %s (a persistent root file system): its data stays on the volume, so the VM cannot be checkpointed: %w",
				r.Spec.Name, d.Name, src, ports.ErrFailedPrecondition)
		default:
			c := diskCopy{name: d.Name, source: src, format: d.Source.Format}
			if d.Overlay != nil {
				c.format, c.backing = "qcow2", d.Overlay.BasePath
			}
			if c.format == "" {
				c.format = "raw"
			}
			p.copies = append(p.copies, c)
		}
	}
	if live.Devices != nil {
		for _, d := range live.Devices.Disks {
			if d.Target != nil {
				p.targets = append(p.targets, d.Target.Dev)
			}
		}
	}
	return p, nil
}

// memorySnapshotXML asks for the memory only, written to file: no disk is
// snapshotted (the checkpoint copies them itself), and libvirt keeps no
// snapshot metadata.
func memorySnapshotXML(file string, targets []string) (string, error) {
	s := libvirtxml.DomainSnapshot{
		Name:   "virtlet-checkpoint",
		Memory: &libvirtxml.DomainSnapshotMemory{Snapshot: "external", File: file},
		Disks:  &libvirtxml.DomainSnapshotDisks{},
	}
	for _, t := range targets {
		s.Disks.Disks = append(s.Disks.Disks, libvirtxml.DomainSnapshotDisk{Name: t, Snapshot: "no"})
	}
	return s.Marshal()
}

// CheckpointVM pauses the VM, writes its memory and device state to dir
// as a libvirt save image, copies its writable disks beside it, and
// resumes it, whatever happened in between.
func (h *Hypervisor) CheckpointVM(ctx context.Context, id, dir string) (cp ports.VMCheckpoint, retErr error) {
	if !filepath.IsAbs(dir) {
		return cp, fmt.Errorf("checkpoint of VM %s: the directory %q is not absolute: %w", id, dir, ports.ErrInvalidArgument)
	}
	r, dom, err := h.lookup(id)
	if err != nil {
		return cp, err
	}
	defer dom.Free()
	state, _, err := dom.GetState()
	if err != nil {
		return cp, libvirtError("state of domain "+r.Spec.Name, err)
	}
	if state != libvirt.DOMAIN_RUNNING {
		return cp, fmt.Errorf("checkpoint of VM %s: the VM is not running (libvirt state %d): %w", r.Spec.Name, state, ports.ErrFailedPrecondition)
	}
	xmlDesc, err := dom.GetXMLDesc(libvirt.DOMAIN_XML_MIGRATABLE)
	if err != nil {
		return cp, libvirtError("domain XML of "+r.Spec.Name, err)
	}
	var live libvirtxml.Domain
	if err := live.Unmarshal(xmlDesc); err != nil {
		return cp, fmt.Errorf("checkpoint of VM %s: read its domain XML: %w", r.Spec.Name, err)
	}
	plan, err := planCheckpoint(r, &live)
	if err != nil {
		return cp, err
	}
	snapXML, err := memorySnapshotXML(filepath.Join(dir, filepath.FromSlash(checkpointStateFile)), plan.targets)
	if err != nil {
		return cp, err
	}
	for _, sub := range []string{path.Dir(checkpointStateFile), checkpointDisksDir} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.FromSlash(sub)), 0o700); err != nil {
			return cp, fmt.Errorf("checkpoint of VM %s: %w", r.Spec.Name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(checkpointDomainFile)), []byte(xmlDesc), 0o600); err != nil {
		return cp, fmt.Errorf("checkpoint of VM %s: %w", r.Spec.Name, err)
	}
	cp.StateFile, cp.DefinitionFile, cp.Skipped = checkpointStateFile, checkpointDomainFile, plan.skipped
	if live.OS != nil && live.OS.Type != nil {
		cp.Machine = live.OS.Type.Machine
	}
	if caps, err := h.Capabilities(ctx); err == nil {
		cp.Hypervisor, cp.Accelerator = caps.Version, caps.Accelerator
	}

	log := h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "pod": r.Spec.PodNamespace + "/" + r.Spec.PodName})
	// Paused, QEMU has flushed its disk caches and the guest writes
	// nothing: the memory written and the disks copied are of one instant.
	// The pause is recorded first: a plugin killed before the resume
	// resumes the guest when it starts again (resumeCheckpointed).
	if err := markCheckpointPaused(h, r, true); err != nil {
		return cp, err
	}
	begin := time.Now()
	if err := dom.Suspend(); err != nil {
		markCheckpointPaused(h, r, false)
		return cp, libvirtError("pause domain "+r.Spec.Name, err)
	}
	defer func() {
		err := dom.Resume()
		if err != nil {
			// The connection may have gone meanwhile: once more, on the
			// current one.
			if _, again, lerr := h.lookup(id); lerr == nil {
				err = again.Resume()
				again.Free()
			}
		}
		if err != nil {
			log.WithError(err).Error("checkpoint: resume the VM after its checkpoint")
			retErr = errors.Join(retErr, libvirtError("resume domain "+r.Spec.Name+" after its checkpoint", err))
			return
		}
		markCheckpointPaused(h, r, false)
		cp.Paused = time.Since(begin)
		log.WithField("pausedMillis", cp.Paused.Milliseconds()).Info("checkpoint: VM resumed")
	}()
	snap, err := dom.CreateSnapshotXML(snapXML, libvirt.DOMAIN_SNAPSHOT_CREATE_NO_METADATA)
	if err != nil {
		return cp, libvirtError("write the memory of "+r.Spec.Name, err)
	}
	snap.Free()
	failpoint("checkpoint-written") // paused, its memory written
	for _, c := range plan.copies {
		rel := path.Join(checkpointDisksDir, c.name+"."+c.format)
		n, err := copyDisk(ctx, c.source, filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return cp, fmt.Errorf("checkpoint of VM %s: copy disk %s: %w", r.Spec.Name, c.name, err)
		}
		cp.Disks = append(cp.Disks, ports.CheckpointDisk{Name: c.name, File: rel, Format: c.format, BackingFile: c.backing, Bytes: n})
	}
	return cp, nil
}

// markCheckpointPaused records that a checkpoint holds the VM paused.
func markCheckpointPaused(h *Hypervisor, r *record, paused bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.CheckpointPaused = paused
	return h.store.save(r)
}

// resumeCheckpointed resumes the guests that a checkpoint paused and did
// not resume (the plugin was killed, or libvirtd went, meanwhile).
func resumeCheckpointed(h *Hypervisor, conn *libvirt.Connect) {
	var paused []*record
	h.each(func(r *record) {
		if r.CheckpointPaused {
			paused = append(paused, r)
		}
	})
	for _, r := range paused {
		dom, err := conn.LookupDomainByUUIDString(r.Spec.UUID)
		if err != nil {
			continue
		}
		if state, _, err := dom.GetState(); err == nil && state == libvirt.DOMAIN_PAUSED {
			if err := dom.Resume(); err != nil {
				h.log.WithError(err).WithField("vm", r.Spec.Name).Error("resume a guest an interrupted checkpoint left paused")
				dom.Free()
				continue
			}
			h.log.WithField("vm", r.Spec.Name).Warn("resumed a guest an interrupted checkpoint left paused")
		}
		dom.Free()
		markCheckpointPaused(h, r, false)
	}
}

// copyDisk copies a disk file, stopping when ctx ends.
func copyDisk(ctx context.Context, from, to string) (int64, error) {
	in, err := os.Open(from)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, ctxReader{ctx, in})
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, errors.Join(err, os.Remove(to))
	}
	return n, nil
}

// ctxReader ends a copy when its context does.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

var _ ports.VMCheckpointer = (*Hypervisor)(nil)
