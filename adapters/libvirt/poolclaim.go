// Claiming a ready pool domain for a VM while it is still paused: its
// metadata set, its cloud-init medium written into the placeholder, the
// VM's other disks and NICs hot-plugged (the machine then reset), and the
// domain defined persistently.

package libvirt

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// claim makes a pool domain the VM's, or reports false (plugging in
// failed: the domain is destroyed) and leaves r as it was: the VM then
// starts cold. On success r holds the pool domain's identity, root overlay
// and console log, and is saved and kept.
func (p *pool) claim(conn *libvirt.Connect, d *poolDomain, spec ports.VMSpec, r *record, accel accelerator, log logrus.FieldLogger) bool {
	begin := time.Now()
	log = log.WithField("domain", d.name)
	if !pristine(conn, d.uuid) {
		p.destroy(conn, d.uuid, "no longer paused", d.all()...)
		log.Warn("cold start: the pool domain of its shape is gone")
		return false
	}
	// Its user keeps what the pool domain was granted until the record
	// holds the VM.
	if done, err := p.env.grants.grantNow(spec.ID+"/claim", d.uid, []string{d.base}); err == nil {
		defer done()
	}
	asked := vmIdentity{Name: spec.Name, RunAs: spec.RunAs} // the spec asked for no UUID (poolable)
	spec.Name, spec.UUID, spec.RunAs = d.name, d.uuid, &ports.ProcessIdentity{UID: d.uid, GID: d.uid}
	before := *r
	r.Spec.Name, r.Spec.UUID, r.Spec.RunAs = spec.Name, spec.UUID, spec.RunAs
	r.Asked, r.ConsoleLog, r.Claim = &asked, d.console, claiming
	r.DiskPaths = map[string]string{spec.Disks[0].Name: d.root}
	medium := -1 // the disk written into the placeholder
	if d.mediumSize > 0 {
		medium = inPlaceMedium(spec) // of the placeholder's size: it is the shape's
	}
	if medium > 0 {
		r.DiskPaths[spec.Disks[medium].Name] = d.medium
	}
	steps := logrus.Fields{}
	var stepsMu sync.Mutex // the reset's step runs beside the define's
	step := func(name string, do func() error) error {
		t := time.Now()
		err := do()
		stepsMu.Lock()
		steps[name+"Millis"] = time.Since(t).Milliseconds()
		stepsMu.Unlock()
		return err
	}
	fail := func(what string, err error) bool {
		p.destroy(conn, d.uuid, "its claim failed", d.all()...)
		if len(r.Secrets) > 0 {
			undefineSecrets(conn, spec.ID)
		}
		*r = before
		log.WithError(err).Warn("cold start: the pool domain could not take the VM: " + what)
		return false
	}
	// Intent first: after a crash from here on, the domain is destroyed.
	err := step("record", func() (err error) {
		p.env.vms.locked(func() { err = p.env.store.save(r) })
		return err
	})
	if err != nil {
		return fail("save its record", err)
	}
	failpoint("claim-recorded")
	if r.Secrets, err = defineSecrets(conn, spec); err != nil {
		return fail("keep its disks' keys", err)
	}
	def, err := buildDomain(domainInput{Spec: spec, accelerator: accel, DiskPaths: r.DiskPaths, ConsoleLog: d.console, Secrets: r.Secrets, Owner: p.owner})
	if err != nil {
		return fail("render its devices", err)
	}
	dom, err := conn.LookupDomainByUUIDString(d.uuid)
	if err != nil {
		return fail("look it up", err)
	}
	defer dom.Free()
	// Its owner too: another plugin instance on this libvirtd would
	// otherwise take it for a domain of its own without a record (an
	// orphan) and remove it when it resyncs.
	if err := step("metadata", func() error { return setVMMetadata(dom, spec, p.owner, libvirt.DOMAIN_AFFECT_LIVE) }); err != nil {
		return fail("set its metadata", err)
	}
	// Disks in the spec's order (the domain's list follows it); the root
	// is the pool domain's own, and so is the medium's placeholder.
	plugged := false
	for i, disk := range def.Devices.Disks[1:] {
		if i+1 == medium {
			from := spec.Disks[medium].Source.Path
			if err := step("medium", func() error { return writeMedium(from, d.medium, d.mediumSize) }); err != nil {
				return fail("write its cloud-init medium", err)
			}
			continue
		}
		plugged = true
		x, err := disk.Marshal()
		if err == nil {
			if spec.Disks[i+1].Device == ports.DeviceCDROM {
				err = step("medium", func() error { return dom.UpdateDeviceFlags(x, libvirt.DOMAIN_DEVICE_MODIFY_LIVE) })
			} else {
				err = step("disk."+disk.Target.Dev, func() error { return dom.AttachDeviceFlags(x, libvirt.DOMAIN_DEVICE_MODIFY_LIVE) })
			}
		}
		if err != nil {
			return fail("plug in disk "+disk.Target.Dev, libvirtError("plug in disk "+disk.Target.Dev, err))
		}
	}
	for i, iface := range def.Devices.Interfaces {
		plugged = true
		x, err := iface.Marshal()
		if err == nil {
			err = step(fmt.Sprintf("nic%d", i), func() error { return dom.AttachDeviceFlags(x, libvirt.DOMAIN_DEVICE_MODIFY_LIVE) })
		}
		if err != nil {
			return fail(fmt.Sprintf("plug in NIC %d", i), libvirtError("plug in a NIC", err))
		}
	}
	// The pool domain was launched without the VM's CPU weight and limit.
	if l := spec.CPULimits; l.Shares > 0 || l.Quota > 0 {
		if err := step("cpuLimits", func() error { return dom.SetSchedulerParametersFlags(schedulerParams(l), libvirt.DOMAIN_AFFECT_LIVE) }); err != nil {
			return fail("set its CPU limits", libvirtError("set CPU limits", err))
		}
	}
	failpoint("claim-plugged")
	// The guest has not run: a reset makes the firmware and the guest
	// find the hot-plugged devices as a cold machine's (no pending ACPI
	// hotplug event, the boot order read again); with nothing plugged in,
	// the machine is as launched and needs none. The persistent
	// definition is the live one's devices, which the reset does not
	// change: the two run at once (libvirtd serves them on two workers).
	reset := make(chan error, 1)
	if plugged {
		go func() { reset <- step("reset", func() error { return dom.Reset(0) }) }()
	} else {
		reset <- nil
	}
	defineErr := step("define", func() error {
		live, err := dom.GetXMLDesc(libvirt.DOMAIN_XML_INACTIVE | libvirt.DOMAIN_XML_SECURE)
		if err != nil {
			return err
		}
		// libvirt's own definition of the domain: checking it against the
		// RNG schema (which libvirtd parses again for every validated
		// define, ≈ 5 ms under load) would find nothing; libvirt still
		// parses and checks it.
		persistent, err := conn.DomainDefineXMLFlags(live, 0)
		if err == nil {
			persistent.Free()
		}
		return err
	})
	resetErr := <-reset
	if resetErr != nil {
		return fail("reset it", libvirtError("reset", resetErr))
	}
	if defineErr != nil {
		return fail("define it persistently", libvirtError("define", defineErr))
	}
	failpoint("claim-defined")
	r.Claim, r.Prelaunched = claimed, true
	if err := p.env.keep(r); err != nil {
		return fail("save its record", err)
	}
	log.WithFields(steps).WithFields(logrus.Fields{"shape": d.shape, "user": d.uid, "millis": time.Since(begin).Milliseconds()}).
		Info("VM claimed a pool domain")
	return true
}

// endPrelaunch ends a claimed VM's paused process before its first
// instruction (WriteFiles needs its root disk, which QEMU holds): the
// domain stays defined, with its devices, and starts cold.
func endPrelaunch(conn *libvirt.Connect, vms vmSource, store recordStore, r *record) error {
	dom, err := conn.LookupDomainByUUIDString(r.Spec.UUID)
	if err != nil {
		return libvirtError("look up domain "+r.Spec.Name, err)
	}
	defer dom.Free()
	if err := dom.Destroy(); err != nil {
		var le libvirt.Error
		if !errors.As(err, &le) || le.Code != libvirt.ERR_OPERATION_INVALID { // not running any more
			return libvirtError("end the paused process of "+r.Spec.Name, err)
		}
	}
	var serr error
	vms.locked(func() {
		r.Prelaunched = false
		serr = store.save(r)
	})
	return serr
}
