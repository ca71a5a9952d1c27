// Keeping the pool full: launching pool domains as the wanted counts say,
// checking they are ready, and sweeping what is stray or no longer wanted.

package libvirt

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/ports"
)

// refill keeps the pool at its size, one launch at a time and never
// within poolSettle of a claimed VM's resume (poolClaimWait of a claim),
// so that on a small node the pod's boot does not wait for a refill.
func (p *pool) refill() {
	defer close(p.done)
	tick := time.NewTicker(poolCheckEvery)
	defer tick.Stop()
	for {
		wait := p.step()
		if wait == 0 {
			continue // more to do
		}
		timer := time.NewTimer(wait)
		select {
		case <-p.quit:
			timer.Stop()
			return
		case <-p.kick:
		case <-tick.C:
			p.checkReady()
		case <-timer.C:
		}
		timer.Stop()
	}
}

// step does one thing the pool needs (a launch, or the destruction of
// a domain of a shape no longer wanted) and returns 0, or how long to wait
// before the next look.
func (p *pool) step() time.Duration {
	select {
	case <-p.quit:
		return time.Hour
	default:
	}
	conn, err := p.env.live()
	if err != nil {
		return time.Second
	}
	used := p.claimedUIDs()
	p.mu.Lock()
	now := time.Now()
	if wait := max(p.quietUntil.Sub(now), p.retryAt.Sub(now)); wait > 0 {
		p.mu.Unlock()
		return wait
	}
	want := p.wantedLocked()
	have := map[string]int{}
	for i, d := range p.ready {
		if have[d.shape]++; have[d.shape] > want[d.shape] {
			p.ready = slices.Delete(p.ready, i, i+1)
			p.mu.Unlock()
			p.destroy(conn, d.uuid, "its shape is no longer wanted", d.all()...)
			return 0
		}
	}
	var shape *poolShape
	for i := range p.shapes {
		if have[p.shapes[i].Key] < want[p.shapes[i].Key] {
			shape = &p.shapes[i]
			break
		}
	}
	if shape == nil {
		p.mu.Unlock()
		return time.Hour
	}
	d := &poolDomain{shape: shape.Key, uid: p.freeUIDLocked(used), uuid: uuid.NewString()}
	d.name = poolPrefix + p.owner + "-" + d.uuid[:8]
	d.poolFiles, d.mediumSize = p.files(d.name), shape.mediumSize()
	launching := *shape // the shapes may change while it launches
	p.launching = d
	p.mu.Unlock()
	start := time.Now()
	err = p.launch(conn, d, launching)
	took := time.Since(start)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.launching = nil
	if errors.Is(err, ports.ErrNotFound) { // its image is gone (removed)
		p.dropShapeLocked(d.shape)
		p.env.log.WithError(err).WithField("shape", d.shape).Info("pool: shape dropped: its image is gone")
		return 0
	}
	if err != nil {
		p.backoff = min(max(2*p.backoff, time.Second), time.Minute)
		p.retryAt = time.Now().Add(p.backoff)
		p.env.log.WithError(err).WithFields(logrus.Fields{"shape": d.shape, "retryIn": p.backoff}).Warn("pool: launch failed")
		return p.backoff
	}
	p.backoff, p.retryAt = 0, time.Time{}
	p.ready = append(p.ready, d)
	// Logged once a claim can take it.
	p.env.log.WithFields(logrus.Fields{"domain": d.name, "shape": d.shape, "vcpus": launching.Spec.VCPUs, "memory": launching.Spec.MemoryBytes,
		"millis": took.Milliseconds()}).Info("pool: domain launched paused")
	return 0
}

// freeUIDLocked is the lowest user of the pool's range that no pool
// domain and no VM claimed from one (used) runs as, or -1.
func (p *pool) freeUIDLocked(used map[int]bool) int {
	for _, d := range p.ready {
		used[d.uid] = true
	}
	for uid := p.firstUID; uid < p.firstUID+p.uids; uid++ {
		if !used[uid] {
			return uid
		}
	}
	return -1
}

// claimedUIDs are the users of the VMs claimed from the pool.
func (p *pool) claimedUIDs() map[int]bool {
	used := map[int]bool{}
	p.env.vms.each(func(r *record) {
		if r.Claim != "" && r.Spec.RunAs != nil {
			used[r.Spec.RunAs.UID] = true
		}
	})
	return used
}

// launch starts a pool domain of a shape, paused before its first
// instruction.
func (p *pool) launch(conn *libvirt.Connect, d *poolDomain, shape poolShape) error {
	tmpl := shape.Spec
	if d.uid < 0 {
		return fmt.Errorf("every user of the pool's range runs a pool domain or a VM claimed from one")
	}
	accel := p.env.vms.settings().accel
	d.base = tmpl.Disks[0].Overlay.BasePath
	done, err := p.env.grants.grantNow(d.uuid, d.uid, []string{d.base})
	if err != nil {
		return err
	}
	defer done() // the pool holds it as launching, then ready
	if _, err := createOverlay(context.Background(), d.root, *tmpl.Disks[0].Overlay, tmpl.Disks[0].Name); err != nil {
		return err
	}
	paths := map[string]string{tmpl.Disks[0].Name: d.root}
	if m := shape.Medium; m != nil {
		if err := makePlaceholder(d.medium, m.Size); err != nil {
			removeFiles(d.root)
			return err
		}
		paths[m.Disk] = d.medium
	}
	spec := tmpl
	spec.Name, spec.UUID, spec.RunAs = d.name, d.uuid, &ports.ProcessIdentity{UID: d.uid, GID: d.uid}
	domXML, err := domainXML(domainInput{Spec: spec, accelerator: accel, ConsoleLog: d.console,
		DiskPaths: paths, Pool: &poolMetadata{Owner: p.owner, Shape: d.shape}})
	if err != nil {
		removeFiles(d.all()...)
		return err
	}
	// Not checked against libvirt's RNG schema here: the shape's first VM
	// was, when it was defined cold (a pool domain is that VM's XML less
	// the pod's devices; the pool's golden files are checked too), and a
	// validation beside a cold VM's validated define can fail spuriously
	// (see Hypervisor.defineMu), while a launch holding defineMu would
	// hold up cold defines for its ≈ 0.5 s.
	dom, err := conn.DomainCreateXML(domXML, libvirt.DOMAIN_START_PAUSED)
	if err != nil {
		removeFiles(d.all()...)
		return libvirtError("launch pool domain "+d.name, err)
	}
	dom.Free()
	return nil
}

// makePlaceholder makes the file a pool domain holds as its VM's
// cloud-init medium until a claim writes the medium into it: zeros of the
// medium's size (the guest sees the size QEMU finds at the launch), 0600
// (libvirt gives it to the domain's user, as any disk).
func makePlaceholder(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("medium placeholder: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("medium placeholder %s: %w", path, err)
	}
	return nil
}

// writeMedium writes a claimed VM's cloud-init medium into its pool
// domain's placeholder, which QEMU holds open read-only; the guest has
// not run, so it reads only the medium. Both must be regular files of the
// placeholder's size. The write is not waited for on disk (writeback is
// started): the medium is the datasource's, made again for the VM's next
// container.
func writeMedium(from, to string, size int64) error {
	src, err := os.OpenFile(from, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	err = func() error {
		for _, f := range []*os.File{src, dst} {
			st, err := f.Stat()
			if err != nil {
				return err
			}
			if !st.Mode().IsRegular() || st.Size() != size {
				return fmt.Errorf("%s: %d bytes (%s), the placeholder holds %d", f.Name(), st.Size(), st.Mode().Type(), size)
			}
		}
		if _, err := io.CopyN(dst, src, size); err != nil {
			return err
		}
		_ = unix.SyncFileRange(int(dst.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		return nil
	}()
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	return err
}

// destroy ends a pool domain (transient: it vanishes) or a
// domain whose claim did not finish (persistent already: undefined too),
// and removes files (its console log and root overlay, unless a VM's
// record holds them).
func (p *pool) destroy(conn *libvirt.Connect, domUUID, why string, files ...string) {
	dom, err := conn.LookupDomainByUUIDString(domUUID)
	if err == nil {
		name, _ := dom.GetName()
		if active, _ := dom.IsActive(); active {
			if err := dom.Destroy(); err != nil {
				p.env.log.WithError(err).WithField("domain", name).Warn("pool: destroy domain")
			}
		}
		if persistent, _ := dom.IsPersistent(); persistent {
			if err := dom.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM); err != nil {
				p.env.log.WithError(err).WithField("domain", name).Warn("pool: undefine domain")
			}
		}
		dom.Free()
		p.env.log.WithFields(logrus.Fields{"domain": name, "why": why}).Info("pool: domain destroyed")
	}
	for _, f := range files {
		removeFiles(append(consoleSideFiles(f), f)...)
	}
	p.env.grants.syncSoon() // its user's entries go
}

// checkReady drops ready pool domains that are gone, no longer paused
// (their QEMU died, someone resumed them) or whose image is gone (they
// would keep its file allocated), and destroys strays: this plugin's pool
// domains it does not hold (a launch that ended after the plugin that
// asked for it gave up on it).
func (p *pool) checkReady() {
	conn, err := p.env.live()
	if err != nil {
		return
	}
	p.mu.Lock()
	ready := slices.Clone(p.ready)
	bases := map[string]string{}
	for _, s := range p.shapes {
		bases[s.Key] = s.Spec.Disks[0].Overlay.BasePath
	}
	p.mu.Unlock()
	for _, d := range ready {
		why := ""
		if !pristine(conn, d.uuid) {
			why = "no longer paused"
		} else if _, err := os.Stat(bases[d.shape]); bases[d.shape] != "" && err != nil {
			why = "its image is gone"
		}
		if why == "" {
			continue
		}
		p.mu.Lock()
		p.ready = slices.DeleteFunc(p.ready, func(x *poolDomain) bool { return x == d })
		if why == "its image is gone" {
			p.dropShapeLocked(d.shape)
		}
		p.mu.Unlock()
		p.destroy(conn, d.uuid, why, d.all()...)
		p.poke()
	}
	p.destroyStrays(conn)
}

// destroyStrays destroys this plugin's pool domains that it neither holds
// ready, nor launches, nor hands to a claim, nor does a VM's record claim.
// What the pool holds is read before the records: a claim saves its VM's
// record before it lets its domain go, so a domain listed here is in one
// or the other.
func (p *pool) destroyStrays(conn *libvirt.Connect) {
	doms, err := conn.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_TRANSIENT)
	if err != nil {
		return
	}
	held := map[string]bool{}
	p.mu.Lock()
	for u := range p.claiming {
		held[strings.ToLower(u)] = true
	}
	if p.launching != nil {
		held[strings.ToLower(p.launching.uuid)] = true
	}
	for _, d := range p.ready {
		held[strings.ToLower(d.uuid)] = true
	}
	p.mu.Unlock()
	p.env.vms.each(func(r *record) {
		held[strings.ToLower(r.Spec.UUID)] = true
	})
	prefix := poolPrefix + p.owner + "-"
	for i := range doms {
		name, _ := doms[i].GetName()
		u, _ := doms[i].GetUUIDString()
		doms[i].Free()
		if strings.HasPrefix(name, prefix) && u != "" && !held[strings.ToLower(u)] {
			p.destroy(conn, u, "a stray: no launch of this plugin holds it", p.files(name).all()...)
		}
	}
}

// pristine reports whether a pool domain is still paused, never run, and
// launched (its start is over: paused by the launch, not starting up).
func pristine(conn *libvirt.Connect, domUUID string) bool {
	dom, err := conn.LookupDomainByUUIDString(domUUID)
	if err != nil {
		return false
	}
	defer dom.Free()
	state, reason, err := dom.GetState()
	return err == nil && state == libvirt.DOMAIN_PAUSED && libvirt.DomainPausedReason(reason) == libvirt.DOMAIN_PAUSED_USER
}

// sweep reconciles the pool with libvirt after (re)connecting: this
// plugin's pool domains that are paused and of a wanted shape are taken
// up, any other is destroyed, and so is a domain whose claim a crash
// interrupted (its VM's record says claiming; the core then undoes the
// VM's creation).
func (p *pool) sweep() {
	claims := map[string]claimState{}
	p.env.vms.each(func(r *record) {
		claims[strings.ToLower(r.Spec.UUID)] = r.Claim
	})
	conn, err := p.env.live()
	if err != nil {
		return
	}
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		p.env.log.WithError(err).Warn("pool: list domains")
		return
	}
	prefix := poolPrefix + p.owner + "-"
	var adopt []*poolDomain
	for i := range doms {
		dom := &doms[i]
		name, _ := dom.GetName()
		u, _ := dom.GetUUIDString()
		if !strings.HasPrefix(name, prefix) || u == "" {
			dom.Free()
			continue
		}
		files := p.files(name)
		p.mu.Lock()
		inProgress := p.claiming[u] // a claim of this process (a reconnection's sweep)
		p.mu.Unlock()
		switch claim, known := claims[strings.ToLower(u)]; {
		case inProgress:
		case known && claim == claiming:
			p.destroy(conn, u, "its claim was interrupted") // its files are its VM's record's
		case known:
			// A VM's domain now.
		default:
			var m poolMetadata
			raw, err := dom.GetMetadata(libvirt.DOMAIN_METADATA_ELEMENT, MetadataNS, libvirt.DOMAIN_AFFECT_LIVE)
			persistent, _ := dom.IsPersistent()
			if err == nil && xml.Unmarshal([]byte(raw), &m) == nil && m.Owner == p.owner && !persistent && pristine(conn, u) {
				var label struct {
					Label string `xml:"seclabel>label"`
				}
				def, _ := dom.GetXMLDesc(0)
				xml.Unmarshal([]byte(def), &label)
				uid, err := strconv.Atoi(strings.TrimPrefix(strings.Split(label.Label, ":")[0], "+"))
				base, medium := p.shapeFiles(m.Shape)
				_, statErr := os.Stat(files.root)
				if medium > 0 && statErr == nil {
					_, statErr = os.Stat(files.medium)
				}
				if err == nil && statErr == nil {
					adopt = append(adopt, &poolDomain{name: name, uuid: u, shape: m.Shape, poolFiles: files, mediumSize: medium, uid: uid, base: base})
					break
				}
			}
			if !persistent { // a persistent one without record is an orphan VM: the core removes it
				p.destroy(conn, u, "left by an earlier plugin process, not reusable", files.all()...)
			}
		}
		dom.Free()
	}
	p.mu.Lock()
	want := p.wantedLocked()
	var extra []*poolDomain
	p.ready = nil
	for _, d := range adopt {
		if want[d.shape] > 0 {
			want[d.shape]--
			p.ready = append(p.ready, d)
		} else {
			extra = append(extra, d)
		}
	}
	n := len(p.ready)
	p.mu.Unlock()
	defer p.removeLeftovers()
	for _, d := range extra {
		p.destroy(conn, d.uuid, "its shape is no longer wanted", d.all()...)
	}
	if n > 0 {
		p.env.log.WithField("domains", n).Info("pool: took up the domains an earlier plugin process launched")
	}
	p.poke()
}
