package libvirt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/adapters/atomicfile"
	"github.com/virtlet/virtlet/ports"
)

// The pool of pre-launched paused domains (issue 15): libvirt's start of a
// domain costs ≈ 250–500 ms before the guest runs its first instruction,
// most of it before QEMU's process is up. The pool pays it off the pod's
// path: it keeps a few transient domains launched paused, per VM shape
// (what the guest sees that cannot be plugged in later: vCPUs, memory,
// machine, CPU model, the root disk, the disk bus and the number of disks
// and NICs). A pool domain has its root disk from its launch (an overlay
// of the shape's image), so that it boots first as in a cold start. A VM
// of that shape claims one in Define: its metadata is set, its other disks
// and NICs hot-plugged at the PCI slots a cold start gives them, its
// cloud-init medium put into the empty CD-ROM tray, the machine reset (the
// guest has not run yet: it finds the devices as it finds a cold
// machine's), and the domain defined persistently from its live
// definition, so that it survives a stop and keeps its devices across
// reboots. Start then only resumes it. See ARCHITECTURE.md, "Boot overhead
// (P1)".

// PoolConfig is the `pool` section of the plugin's config.
type PoolConfig struct {
	// Size is the most pool domains held at once (0, the default: no
	// pool). They go to the shapes VMs used most recently, at least one
	// each while there is room.
	Size int `json:"size,omitempty"`
	// Users is the range of host users pool domains run as, one each
	// ("FIRST-LAST", default 2000065536-2000131071: above the daemon's
	// default vmUsers). A pool domain runs before its VM exists, so its
	// QEMU cannot run as the user the daemon gives the VM: the claimed VM
	// keeps the pool domain's, unique on the node as the daemon's are. It
	// must not overlap the daemon's vmUsers (a VM spec in it is refused).
	Users string `json:"users,omitempty"`
}

const defaultPoolUsers = "2000065536-2000131071"

const (
	// poolSettle is how long a refill waits after a claimed VM resumed,
	// so that the guest's boot has the CPUs first; poolClaimWait how long
	// after a claim when no start follows.
	poolSettle, poolClaimWait = time.Second, 10 * time.Second
	// poolCheckEvery is how often the pool is checked without a reason.
	poolCheckEvery = 30 * time.Second
	poolPrefix     = NamePrefix + "pool-"
)

// Failpoint, set by a test build of the plugin, is called at the steps of
// a claim where a crash leaves the most to recover (claim-recorded,
// claim-plugged, claim-defined).
var Failpoint func(name string)

func failpoint(name string) {
	if Failpoint != nil {
		Failpoint(name)
	}
}

// shapeBase is the base image of a shape's root disk ("" when the pool
// has no such shape).
func (p *pool) shapeBase(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.shapes {
		if s.Key == key && len(s.Spec.Disks) > 0 && s.Spec.Disks[0].Overlay != nil {
			return s.Spec.Disks[0].Overlay.BasePath
		}
	}
	return ""
}

// poolMetadata is the <virtlet:pool> element of a pool domain.
type poolMetadata struct {
	XMLName xml.Name `xml:"pool"`
	Owner   string   `xml:"owner,attr"` // the plugin instance: a hash of its state directory
	Shape   string   `xml:"shape,attr"`
}

// poolDomain is a pool domain launched paused and not claimed.
type poolDomain struct {
	name, uuid, shape string
	console, root     string // its console log and root disk overlay, in the pool's directory
	uid               int
	base              string // its root disk's base image, which its user is granted
}

// files are a pool domain's files (console log, root overlay) by its name.
func (p *pool) files(name string) (console, root string) {
	return filepath.Join(p.dir, name+".console"), filepath.Join(p.dir, name+"-root.qcow2")
}

// poolShape is a shape VMs used: the key and the spec a pool domain of it
// is rendered from (a VM's spec without what the pod plugs in).
type poolShape struct {
	Key  string       `json:"key"`
	Spec ports.VMSpec `json:"spec"`
}

// pool holds the pool domains; its mutex is never held while h.mu is
// taken, nor while libvirt is asked.
type pool struct {
	size           int
	firstUID, uids int
	owner, dir     string

	mu         sync.Mutex
	ready      []*poolDomain
	launching  *poolDomain
	claiming   map[string]bool // domains take handed out, until their claims end
	shapes     []poolShape     // most recently used first, at most size
	quietUntil time.Time
	backoff    time.Duration
	retryAt    time.Time
	kick       chan struct{}
	quit, done chan struct{}
}

func newPool(cfg PoolConfig, stateDir string) (*pool, error) {
	if cfg.Size < 0 {
		return nil, &ports.InvalidError{Field: "libvirt config pool.size", Value: strconv.Itoa(cfg.Size), Allowed: "0 (no pool) or more"}
	}
	users := cfg.Users
	if users == "" {
		users = defaultPoolUsers
	}
	first, last, ok := strings.Cut(users, "-")
	f, err1 := strconv.Atoi(first)
	l, err2 := strconv.Atoi(last)
	if !ok || err1 != nil || err2 != nil || f < 65536 || l < f || l >= 1<<31 {
		return nil, &ports.InvalidError{Field: "libvirt config pool.users", Value: users, Allowed: "FIRST-LAST, host user IDs from 65536 to 2^31-1"}
	}
	return &pool{size: cfg.Size, firstUID: f, uids: l - f + 1, owner: instanceOwner(stateDir),
		dir: filepath.Join(stateDir, "pool"), kick: make(chan struct{}, 1), claiming: map[string]bool{}}, nil
}

// poolable says whether a VM can be claimed from a pool domain and of
// which shape, or why it starts cold. It is the one place that decides.
func poolable(s ports.VMSpec, domainType string) (poolShape, string) {
	var why string
	switch m := machineOrDefault(s.Machine); {
	case s.UUID != "":
		why = "the pod asks for its UUID (VirtletSystemUUID); a pool domain's is fixed at its launch"
	case m != defaultMachine:
		why = "machine " + m + ": the pool keeps pc machines (q35 would need a PCIe root port per device at launch)"
	case s.Firmware != "" || s.SecureBoot || s.HyperV:
		why = "UEFI firmware or Hyper-V enlightenments"
	case s.HugepageSizeBytes > 0 || len(s.CPUSet) > 0:
		why = "hugepages or pinned CPUs"
	case s.MaxMemoryBytes > s.MemoryBytes:
		why = "a memory ceiling above its memory (VirtletMaxMemory)"
	case hotplugVCPUs(s) != nil:
		why = "vCPUs that can change while it runs (VirtletMaxVCPUCount)"
	case s.CPU.Setting != nil:
		why = "a full CPU definition (VirtletLibvirtCPUSetting)"
	case s.Clock.Offset != "" && s.Clock.Offset != "utc" || len(s.Clock.Timers) > 0:
		why = "a clock other than UTC with default timers"
	case s.Watchdog != nil:
		why = "a watchdog"
	case len(s.Filesystems) > 0:
		why = "9p shares, which cannot be hot-plugged"
	case s.RunAs == nil || s.RunAs.GID != s.RunAs.UID:
		why = "the daemon's VMs run as qemu.conf's user or share a group; pool domains run as users of their own"
	case layoutPCI(s).serial == 0:
		why = "more PCI devices than the machine's root bus holds"
	}
	for i, d := range s.Disks {
		switch {
		case why != "":
		case i == 0 && (d.Overlay == nil || !d.Boot):
			why = "its root is not an overlay of an image (a persistent root filesystem): pool domains are launched with their root overlay"
		case i > 0 && d.Boot:
			why = "another boot disk than its root"
		case d.Bus != ports.BusVirtio && d.Bus != ports.BusSCSI:
			why = "a disk on the " + string(d.Bus) + " bus, which cannot be hot-plugged"
		case d.Device == ports.DeviceCDROM && d.Bus != ports.BusSCSI:
			why = "a CD-ROM off the SCSI bus"
		}
	}
	if len(s.Disks) == 0 && why == "" {
		why = "no root disk"
	}
	if why != "" {
		return poolShape{}, why
	}
	t := ports.VMSpec{VCPUs: s.VCPUs, MemoryBytes: s.MemoryBytes, MaxMemoryBytes: s.MaxMemoryBytes, CPU: ports.CPUSpec{Model: s.CPU.Model}}
	for i, d := range s.Disks {
		skeleton := ports.Disk{Device: d.Device, Bus: d.Bus}
		switch {
		case i == 0: // the root overlay of the image, launched with the pool domain
			skeleton = d
			skeleton.Source.Path = ""
		case d.Device == ports.DeviceCDROM: // launched with the pool domain, as an empty tray
			skeleton.Serial, skeleton.Source.Format = d.Serial, d.Source.Format
		}
		t.Disks = append(t.Disks, skeleton)
	}
	for range s.NICs {
		t.NICs = append(t.NICs, ports.NIC{})
	}
	key, _ := json.Marshal(struct {
		Type string
		Spec ports.VMSpec
	}{domainType, t})
	sum := sha256.Sum256(key)
	return poolShape{Key: hex.EncodeToString(sum[:])[:12], Spec: t}, ""
}

// startPool takes up the pool domains a previous plugin process left and
// starts the refills. Configure calls it once it is connected.
func (h *Hypervisor) startPool(p *pool) error {
	if err := os.MkdirAll(p.dir, 0o711); err != nil {
		return fmt.Errorf("pool directory: %w", err)
	}
	if err := os.Chmod(p.dir, 0o711); err != nil { // QEMU's users reach their console logs' directory
		return err
	}
	if data, err := os.ReadFile(filepath.Join(p.dir, "shapes.json")); err == nil {
		if err := json.Unmarshal(data, &p.shapes); err != nil {
			h.log.WithError(err).Warn("pool: unreadable shapes; starting without")
			p.shapes = nil
		}
	}
	if len(p.shapes) > p.size {
		p.shapes = p.shapes[:p.size]
	}
	h.mu.Lock()
	h.pool = p
	h.mu.Unlock()
	h.sweepPool()
	p.quit, p.done = make(chan struct{}), make(chan struct{})
	go h.refill(p)
	h.log.WithFields(logrus.Fields{"size": p.size, "shapes": len(p.shapes), "users": fmt.Sprintf("%d-%d", p.firstUID, p.firstUID+p.uids-1)}).
		Info("pool of pre-launched domains on")
	return nil
}

// take hands out a ready pool domain of a shape (moving the shape to the
// front of the used ones), or nil; either way a refill follows.
func (p *pool) take(shape poolShape) *poolDomain {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.shapes = slices.DeleteFunc(p.shapes, func(s poolShape) bool { return s.Key == shape.Key })
	p.shapes = append([]poolShape{shape}, p.shapes...)
	if len(p.shapes) > p.size {
		p.shapes = p.shapes[:p.size]
	}
	p.saveShapesLocked()
	var got *poolDomain
	if i := slices.IndexFunc(p.ready, func(d *poolDomain) bool { return d.shape == shape.Key }); i >= 0 {
		got = p.ready[i]
		p.ready = slices.Delete(p.ready, i, i+1)
		p.claiming[got.uuid] = true
		p.quietUntil = time.Now().Add(poolClaimWait)
	}
	p.poke()
	return got
}

// dropShapeLocked forgets a shape (its image is gone).
func (p *pool) dropShapeLocked(key string) {
	p.shapes = slices.DeleteFunc(p.shapes, func(s poolShape) bool { return s.Key == key })
	p.saveShapesLocked()
}

// claimEnded ends the claim of a domain take handed out.
func (p *pool) claimEnded(d *poolDomain) {
	p.mu.Lock()
	delete(p.claiming, d.uuid)
	p.mu.Unlock()
}

// resumed lets the refills go on shortly after a claimed VM resumed.
func (p *pool) resumed() {
	if p == nil { // the plugin restarted without a pool
		return
	}
	p.mu.Lock()
	p.quietUntil = time.Now().Add(poolSettle)
	p.mu.Unlock()
	p.poke()
}

func (p *pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *pool) saveShapesLocked() {
	data, err := json.Marshal(p.shapes)
	if err == nil {
		err = atomicfile.Write(filepath.Join(p.dir, "shapes.json"), data, 0o600)
	}
	_ = err // the shapes are a hint: a pool without them fills at the first claims
}

// wanted is how many pool domains each shape should have: the size dealt
// round the shapes, most recently used first.
func (p *pool) wantedLocked() map[string]int {
	want := map[string]int{}
	for i := 0; i < p.size && len(p.shapes) > 0; i++ {
		want[p.shapes[i%len(p.shapes)].Key]++
	}
	return want
}

// refill keeps the pool at its size, one launch at a time and never
// within poolSettle of a claimed VM's resume (poolClaimWait of a claim),
// so that on a small node the pod's boot does not wait for a refill.
func (h *Hypervisor) refill(p *pool) {
	defer close(p.done)
	tick := time.NewTicker(poolCheckEvery)
	defer tick.Stop()
	for {
		wait := h.poolStep(p)
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
			h.checkReady(p)
		case <-timer.C:
		}
		timer.Stop()
	}
}

// poolStep does one thing the pool needs (a launch, or the destruction of
// a domain of a shape no longer wanted) and returns 0, or how long to wait
// before the next look.
func (h *Hypervisor) poolStep(p *pool) time.Duration {
	select {
	case <-p.quit:
		return time.Hour
	default:
	}
	conn, err := h.connection()
	if err != nil {
		return time.Second
	}
	used := h.claimedUIDs()
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
			h.destroyPoolDomain(conn, d.uuid, "its shape is no longer wanted", d.console, d.root)
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
	d.console, d.root = p.files(d.name)
	tmpl := shape.Spec
	p.launching = d
	p.mu.Unlock()
	start := time.Now()
	err = h.launch(conn, p, d, tmpl)
	took := time.Since(start)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.launching = nil
	if errors.Is(err, ports.ErrNotFound) { // its image is gone (removed)
		p.dropShapeLocked(d.shape)
		h.log.WithError(err).WithField("shape", d.shape).Info("pool: shape dropped: its image is gone")
		return 0
	}
	if err != nil {
		p.backoff = min(max(2*p.backoff, time.Second), time.Minute)
		p.retryAt = time.Now().Add(p.backoff)
		h.log.WithError(err).WithFields(logrus.Fields{"shape": d.shape, "retryIn": p.backoff}).Warn("pool: launch failed")
		return p.backoff
	}
	p.backoff, p.retryAt = 0, time.Time{}
	p.ready = append(p.ready, d)
	// Logged once a claim can take it.
	h.log.WithFields(logrus.Fields{"domain": d.name, "shape": d.shape, "vcpus": tmpl.VCPUs, "memory": tmpl.MemoryBytes,
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
func (h *Hypervisor) claimedUIDs() map[int]bool {
	used := map[int]bool{}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.Claim != "" && r.Spec.RunAs != nil {
			used[r.Spec.RunAs.UID] = true
		}
	}
	return used
}

// launch starts a pool domain of a shape, paused before its first
// instruction.
func (h *Hypervisor) launch(conn *libvirt.Connect, p *pool, d *poolDomain, tmpl ports.VMSpec) error {
	if d.uid < 0 {
		return fmt.Errorf("every user of the pool's range runs a pool domain or a VM claimed from one")
	}
	h.mu.Lock()
	accel := h.accel
	h.mu.Unlock()
	d.base = tmpl.Disks[0].Overlay.BasePath
	done, err := h.grantNow(d.uuid, d.uid, []string{d.base})
	if err != nil {
		return err
	}
	defer done() // the pool holds it as launching, then ready
	if _, err := createOverlay(context.Background(), d.root, *tmpl.Disks[0].Overlay, tmpl.Disks[0].Name); err != nil {
		return err
	}
	spec := tmpl
	spec.Name, spec.UUID, spec.RunAs = d.name, d.uuid, &ports.ProcessIdentity{UID: d.uid, GID: d.uid}
	domXML, err := domainXML(domainInput{Spec: spec, DomainType: accel.DomainType, ConsoleLog: d.console,
		DiskPaths: map[string]string{tmpl.Disks[0].Name: d.root}, Pool: &poolMetadata{Owner: p.owner, Shape: d.shape}})
	if err != nil {
		removeFiles(d.root)
		return err
	}
	dom, err := conn.DomainCreateXML(domXML, libvirt.DOMAIN_START_PAUSED|libvirt.DOMAIN_START_VALIDATE)
	if err != nil {
		removeFiles(d.root, d.console)
		return libvirtError("launch pool domain "+d.name, err)
	}
	dom.Free()
	return nil
}

// destroyPoolDomain ends a pool domain (transient: it vanishes) or a
// domain whose claim did not finish (persistent already: undefined too),
// and removes files (its console log and root overlay, unless a VM's
// record holds them).
func (h *Hypervisor) destroyPoolDomain(conn *libvirt.Connect, domUUID, why string, files ...string) {
	dom, err := conn.LookupDomainByUUIDString(domUUID)
	if err == nil {
		name, _ := dom.GetName()
		if active, _ := dom.IsActive(); active {
			if err := dom.Destroy(); err != nil {
				h.log.WithError(err).WithField("domain", name).Warn("pool: destroy domain")
			}
		}
		if persistent, _ := dom.IsPersistent(); persistent {
			if err := dom.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM); err != nil {
				h.log.WithError(err).WithField("domain", name).Warn("pool: undefine domain")
			}
		}
		dom.Free()
		h.log.WithFields(logrus.Fields{"domain": name, "why": why}).Info("pool: domain destroyed")
	}
	for _, f := range files {
		removeFiles(append(rotatedLogs(f), f)...)
	}
	h.syncGrantsSoon() // its user's entries go
}

// checkReady drops ready pool domains that are gone, no longer paused
// (their QEMU died, someone resumed them) or whose image is gone (they
// would keep its file allocated), and destroys strays: this plugin's pool
// domains it does not hold (a launch that ended after the plugin that
// asked for it gave up on it).
func (h *Hypervisor) checkReady(p *pool) {
	conn, err := h.connection()
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
		h.destroyPoolDomain(conn, d.uuid, why, d.console, d.root)
		p.poke()
	}
	h.destroyStrays(conn, p)
}

// destroyStrays destroys this plugin's pool domains that it neither holds
// ready, nor launches, nor hands to a claim, nor does a VM's record claim.
// What the pool holds is read before the records: a claim saves its VM's
// record before it lets its domain go, so a domain listed here is in one
// or the other.
func (h *Hypervisor) destroyStrays(conn *libvirt.Connect, p *pool) {
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
	h.mu.Lock()
	for _, r := range h.records {
		held[strings.ToLower(r.Spec.UUID)] = true
	}
	h.mu.Unlock()
	prefix := poolPrefix + p.owner + "-"
	for i := range doms {
		name, _ := doms[i].GetName()
		u, _ := doms[i].GetUUIDString()
		doms[i].Free()
		if strings.HasPrefix(name, prefix) && u != "" && !held[strings.ToLower(u)] {
			console, root := p.files(name)
			h.destroyPoolDomain(conn, u, "a stray: no launch of this plugin holds it", console, root)
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

// sweepPool reconciles the pool with libvirt after (re)connecting: this
// plugin's pool domains that are paused and of a wanted shape are taken
// up, any other is destroyed, and so is a domain whose claim a crash
// interrupted (its VM's record says claiming; the core then undoes the
// VM's creation).
func (h *Hypervisor) sweepPool() {
	h.mu.Lock()
	p := h.pool
	claims := map[string]claimState{}
	for _, r := range h.records {
		claims[strings.ToLower(r.Spec.UUID)] = r.Claim
	}
	h.mu.Unlock()
	conn, err := h.connection()
	if p == nil || err != nil {
		return
	}
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		h.log.WithError(err).Warn("pool: list domains")
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
		console, root := p.files(name)
		p.mu.Lock()
		inProgress := p.claiming[u] // a claim of this process (a reconnection's sweep)
		p.mu.Unlock()
		switch claim, known := claims[strings.ToLower(u)]; {
		case inProgress:
		case known && claim == claiming:
			h.destroyPoolDomain(conn, u, "its claim was interrupted") // its files are its VM's record's
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
				if _, statErr := os.Stat(root); err == nil && statErr == nil {
					adopt = append(adopt, &poolDomain{name: name, uuid: u, shape: m.Shape, console: console, root: root, uid: uid, base: p.shapeBase(m.Shape)})
					break
				}
			}
			if !persistent { // a persistent one without record is an orphan VM: the core removes it
				h.destroyPoolDomain(conn, u, "left by an earlier plugin process, not reusable", console, root)
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
	defer h.removePoolLeftovers(p)
	for _, d := range extra {
		h.destroyPoolDomain(conn, d.uuid, "its shape is no longer wanted", d.console, d.root)
	}
	if n > 0 {
		h.log.WithField("domains", n).Info("pool: took up the domains an earlier plugin process launched")
	}
	p.poke()
}

// Shutdown destroys the pool's domains: the plugin is being stopped. VMs
// claimed from the pool are VMs like any other and stay. The daemon kills
// a plugin that takes more than 2 s to stop, so the domains go at once,
// their files first (QEMU keeps what it has open); what a kill still
// leaves, the next start removes.
func (h *Hypervisor) Shutdown(ctx context.Context) {
	h.mu.Lock()
	p := h.pool
	h.mu.Unlock()
	if p == nil || p.quit == nil {
		return
	}
	begin := time.Now()
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	select { // a launch in progress ends first
	case <-p.done:
	case <-ctx.Done():
	}
	conn, err := h.connection()
	if err != nil {
		return
	}
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, d := range ready {
		removeFiles(append(rotatedLogs(d.console), d.console, d.root)...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.destroyPoolDomain(conn, d.uuid, "the plugin stops")
		}()
	}
	wg.Wait()
	h.syncGrants()
	h.log.WithFields(logrus.Fields{"domains": len(ready), "millis": time.Since(begin).Milliseconds()}).Info("pool: domains destroyed")
}

// claim makes a pool domain the VM's, or reports false (plugging in
// failed: the domain is destroyed) and leaves r as it was: the VM then
// starts cold. On success r holds the pool domain's identity, root overlay
// and console log, and is saved and kept.
func (h *Hypervisor) claim(conn *libvirt.Connect, d *poolDomain, spec ports.VMSpec, r *record, accel accelerator, log logrus.FieldLogger) bool {
	begin := time.Now()
	log = log.WithField("domain", d.name)
	if !pristine(conn, d.uuid) {
		h.destroyPoolDomain(conn, d.uuid, "no longer paused", d.console, d.root)
		log.Warn("cold start: the pool domain of its shape is gone")
		return false
	}
	// Its user keeps what the pool domain was granted until the record
	// holds the VM.
	if done, err := h.grantNow(spec.ID+"/claim", d.uid, []string{d.base}); err == nil {
		defer done()
	}
	asked := vmIdentity{Name: spec.Name, RunAs: spec.RunAs} // the spec asked for no UUID (poolable)
	spec.Name, spec.UUID, spec.RunAs = d.name, d.uuid, &ports.ProcessIdentity{UID: d.uid, GID: d.uid}
	before := *r
	r.Spec.Name, r.Spec.UUID, r.Spec.RunAs = spec.Name, spec.UUID, spec.RunAs
	r.Asked, r.ConsoleLog, r.Claim = &asked, d.console, claiming
	r.DiskPaths = map[string]string{spec.Disks[0].Name: d.root}
	steps := logrus.Fields{}
	fail := func(what string, err error) bool {
		h.destroyPoolDomain(conn, d.uuid, "its claim failed", d.console, d.root)
		if len(r.Secrets) > 0 {
			undefineSecrets(conn, spec.ID)
		}
		*r = before
		log.WithError(err).Warn("cold start: the pool domain could not take the VM: " + what)
		return false
	}
	h.mu.Lock()
	err := h.saveRecord(r) // intent first: after a crash from here on, the domain is destroyed
	h.mu.Unlock()
	if err != nil {
		return fail("save its record", err)
	}
	failpoint("claim-recorded")
	if r.Secrets, err = defineSecrets(conn, spec); err != nil {
		return fail("keep its disks' keys", err)
	}
	def, err := buildDomain(domainInput{Spec: spec, DomainType: accel.DomainType, DiskPaths: r.DiskPaths, ConsoleLog: d.console, Secrets: r.Secrets, Owner: h.owner})
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
	if err := setVMMetadata(dom, spec, h.owner, libvirt.DOMAIN_AFFECT_LIVE); err != nil {
		return fail("set its metadata", err)
	}
	step := func(name string, do func() error) error {
		t := time.Now()
		err := do()
		steps[name+"Millis"] = time.Since(t).Milliseconds()
		return err
	}
	// Disks in the spec's order (the domain's list follows it); the root
	// is the pool domain's own.
	for i, disk := range def.Devices.Disks[1:] {
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
		x, err := iface.Marshal()
		if err == nil {
			err = step(fmt.Sprintf("nic%d", i), func() error { return dom.AttachDeviceFlags(x, libvirt.DOMAIN_DEVICE_MODIFY_LIVE) })
		}
		if err != nil {
			return fail(fmt.Sprintf("plug in NIC %d", i), libvirtError("plug in a NIC", err))
		}
	}
	// The guest has not run: a reset makes the firmware and the guest
	// find the hot-plugged devices as a cold machine's (no pending ACPI
	// hotplug event, the boot order read again).
	if err := step("reset", func() error { return dom.Reset(0) }); err != nil {
		return fail("reset it", libvirtError("reset", err))
	}
	failpoint("claim-plugged")
	if err := step("define", func() error {
		live, err := dom.GetXMLDesc(libvirt.DOMAIN_XML_INACTIVE | libvirt.DOMAIN_XML_SECURE)
		if err != nil {
			return err
		}
		h.defineMu.Lock()
		defer h.defineMu.Unlock()
		persistent, err := conn.DomainDefineXMLFlags(live, libvirt.DOMAIN_DEFINE_VALIDATE)
		if err == nil {
			persistent.Free()
		}
		return err
	}); err != nil {
		return fail("define it persistently", libvirtError("define", err))
	}
	failpoint("claim-defined")
	r.Claim, r.Prelaunched = claimed, true
	h.mu.Lock()
	err = h.saveRecord(r)
	if err == nil {
		h.records[spec.ID] = r
	}
	h.mu.Unlock()
	if err != nil {
		return fail("save its record", err)
	}
	log.WithFields(steps).WithFields(logrus.Fields{"shape": d.shape, "user": d.uid, "millis": time.Since(begin).Milliseconds()}).
		Info("VM claimed a pool domain")
	return true
}

// removePoolLeftovers removes what the pool's directory holds that no
// pool domain and no VM's record uses: the files of pool domains a crash
// ended.
func (h *Hypervisor) removePoolLeftovers(p *pool) {
	keep := map[string]bool{filepath.Join(p.dir, "shapes.json"): true}
	h.mu.Lock()
	for _, r := range h.records {
		keep[r.ConsoleLog] = true
		for _, f := range r.DiskPaths {
			keep[f] = true
		}
	}
	h.mu.Unlock()
	p.mu.Lock()
	for _, d := range append(slices.Clone(p.ready), p.launching) {
		if d != nil {
			keep[d.console], keep[d.root] = true, true
		}
	}
	p.mu.Unlock()
	entries, _ := os.ReadDir(p.dir)
	var gone []string
	for _, e := range entries {
		f := filepath.Join(p.dir, e.Name())
		base := strings.TrimSuffix(f, filepath.Ext(f)) // console logs rotate to .console.1
		if !keep[f] && !keep[base] && !strings.HasSuffix(f, atomicfile.TempSuffix) {
			gone = append(gone, f)
		}
	}
	if len(gone) > 0 {
		removeFiles(gone...)
		h.log.WithField("files", gone).Info("pool: removed the files of pool domains a crash ended")
	}
}

// endPrelaunch ends a claimed VM's paused process before its first
// instruction (WriteFiles needs its root disk, which QEMU holds): the
// domain stays defined, with its devices, and starts cold.
func (h *Hypervisor) endPrelaunch(r *record) error {
	conn, err := h.connection()
	if err != nil {
		return err
	}
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
	h.mu.Lock()
	defer h.mu.Unlock()
	r.Prelaunched = false
	return h.saveRecord(r)
}
