package libvirt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
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
// cloud-init medium written into the placeholder the pool domain holds
// (or put into an empty CD-ROM tray), the machine reset if anything was
// plugged in (the guest has not run yet: it finds the devices as it finds
// a cold machine's), and the domain defined persistently from its live
// definition, so that it survives a stop and keeps its devices across
// reboots. Start then only resumes it. See ARCHITECTURE.md, "Boot overhead
// (P1)".
// PoolConfig is the `pool` section of the plugin's config.
type PoolConfig struct {
	// The pool's domains go to the shapes VMs used most recently, at least
	// one each while there is room.
	Size int `json:"size,omitempty" jsonschema:"minimum=0" jsonschema_description:"the most pool domains held at once (0: no pool)"`
	// A pool domain runs before its VM exists, so its QEMU cannot run as
	// the user the daemon gives the VM: the claimed VM keeps the pool
	// domain's, unique on the node as the daemon's are.
	Users string `json:"users,omitempty" jsonschema_description:"the range of host users (FIRST-LAST) pool domains run as, one each, apart from the daemon's vmUsers"`
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

// Failpoint, set by a test build of the plugin, is called at the steps
// where a crash leaves the most to recover: of a claim (claim-recorded,
// claim-plugged, claim-defined) and of a checkpoint (checkpoint-written:
// the guest paused, its memory written).
var Failpoint func(name string)

func failpoint(name string) {
	if Failpoint != nil {
		Failpoint(name)
	}
}

// shapeFiles is the base image of a shape's root disk ("" when the pool
// has no such shape) and the size of its domains' medium placeholder.
func (p *pool) shapeFiles(key string) (base string, medium int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.shapes {
		if s.Key == key && len(s.Spec.Disks) > 0 && s.Spec.Disks[0].Overlay != nil {
			return s.Spec.Disks[0].Overlay.BasePath, s.mediumSize()
		}
	}
	return "", 0
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
	poolFiles
	mediumSize int64 // of the placeholder of its VM's cloud-init medium it holds (0: none)
	uid        int
	base       string // its root disk's base image, which its user is granted
}

// poolFiles are a pool domain's files, in the pool's directory: its
// console log, root overlay and, where its shape has one, the placeholder
// its VM's cloud-init medium is written into.
type poolFiles struct {
	console, root, medium string
}

// all lists the files.
func (f poolFiles) all() []string { return []string{f.console, f.root, f.medium} }

// files are a pool domain's files by its name.
func (p *pool) files(name string) poolFiles {
	return poolFiles{console: filepath.Join(p.dir, name+".console"), root: filepath.Join(p.dir, name+"-root.qcow2"),
		medium: filepath.Join(p.dir, name+"-medium.img")}
}

// poolShape is a shape VMs used: the key and the spec a pool domain of it
// is rendered from (a VM's spec without what the pod plugs in).
type poolShape struct {
	Key  string       `json:"key"`
	Spec ports.VMSpec `json:"spec"`
	// Medium, when set, is the cloud-init medium a pool domain of the
	// shape holds a placeholder of (see inPlaceMedium).
	Medium *poolMedium `json:"medium,omitempty"`
}

// mediumSize is the size of the medium placeholder its pool domains
// hold (0: none).
func (s poolShape) mediumSize() int64 {
	if s.Medium == nil {
		return 0
	}
	return s.Medium.Size
}

// poolMedium is a placeholder disk: which of the shape's disks, and its
// size.
type poolMedium struct {
	Disk string `json:"disk"`
	Size int64  `json:"size"`
}

// mediumDisk is the name the core gives a VM's cloud-init medium.
const mediumDisk = "cloud-init"

// maxPlaceholder bounds the medium a claim copies (the datasources pad
// theirs to 1 MiB: a copy of ≈ 0.3 ms); a larger one is hot-plugged.
const maxPlaceholder = 8 << 20

// inPlaceMedium is the index of the VM's disk a pool domain can hold a
// placeholder of (-1 if none): its cloud-init medium, a read-only raw
// file, as a virtio-blk disk or a SCSI CD-ROM. Hot-plugging the disk (or
// inserting the medium into an empty tray) costs a claim ≈ 15–20 ms of
// libvirt's; a placeholder of the medium's size is launched with the pool
// domain instead, and the claim writes the medium into it before the
// guest's first instruction.
func inPlaceMedium(s ports.VMSpec) int {
	for i, d := range s.Disks {
		onBus := d.Bus == ports.BusVirtio && d.Device == ports.DeviceDisk || d.Bus == ports.BusSCSI && d.Device == ports.DeviceCDROM
		if i > 0 && d.Name == mediumDisk && onBus && d.ReadOnly && d.Overlay == nil &&
			d.Source.Type == ports.SourceFile && d.Source.Format == "raw" && d.Source.Offset == 0 && d.Source.Size == 0 {
			return i
		}
	}
	return -1
}

// mediumSize is the size of the VM's medium a pool domain could hold a
// placeholder of, or 0.
func mediumSize(s ports.VMSpec) int64 {
	i := inPlaceMedium(s)
	if i < 0 {
		return 0
	}
	st, err := os.Stat(s.Disks[i].Source.Path)
	if err != nil || !st.Mode().IsRegular() || st.Size() > maxPlaceholder {
		return 0
	}
	return st.Size()
}

// poolEnv is what the pool uses of the adapter.
type poolEnv struct {
	log    logrus.FieldLogger
	vms    vmSource
	live   func() (*libvirt.Connect, error)
	grants *grants
	store  recordStore
	// keep saves a claimed VM's record and makes it the VM's, under h.mu.
	keep func(r *record) error
}

// pool holds the pool domains; its mutex is never held while h.mu is
// taken, nor while libvirt is asked.
type pool struct {
	size           int
	firstUID, uids int
	owner, dir     string
	env            poolEnv // set by open

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
//
// medium is the size of its cloud-init medium (mediumSize): a pool
// domain of the shape holds a placeholder of that size.
func poolable(s ports.VMSpec, accel accelerator, medium int64) (poolShape, string) {
	var why string
	switch {
	case s.UUID != "":
		why = "the pod asks for its UUID (VirtletSystemUUID); a pool domain's is fixed at its launch"
	case !pcMachine(machineOrDefault(s.Machine)):
		why = "machine " + s.Machine + ": the pool keeps pc and q35 machines"
	case s.Firmware != "" || s.SecureBoot || s.HyperV:
		why = "UEFI firmware or Hyper-V enlightenments"
	case s.HugepageSizeBytes > 0 || len(s.CPUSet) > 0:
		why = "hugepages or pinned CPUs"
	case s.NoMemorySharing:
		why = "no memory sharing (VirtletMemorySharing), which a domain takes at its launch"
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
	machine := s.Machine
	if machineOrDefault(machine) == defaultMachine {
		machine = "" // one shape, named or not
	}
	t := ports.VMSpec{Machine: machine, VCPUs: s.VCPUs, MemoryBytes: s.MemoryBytes, MaxMemoryBytes: s.MaxMemoryBytes, CPU: ports.CPUSpec{Model: s.CPU.Model}}
	var placeholder *poolMedium
	in := inPlaceMedium(s)
	for i, d := range s.Disks {
		skeleton := ports.Disk{Device: d.Device, Bus: d.Bus}
		switch {
		case i == 0: // the root overlay of the image, launched with the pool domain
			skeleton = d
			skeleton.Source.Path = ""
		case i == in && medium > 0: // launched with the pool domain, as a placeholder
			skeleton = d
			skeleton.Source.Path = ""
			placeholder = &poolMedium{Disk: d.Name, Size: medium}
		case d.Device == ports.DeviceCDROM: // launched with the pool domain, as an empty tray
			skeleton.Serial, skeleton.Source.Format = d.Serial, d.Source.Format
		}
		t.Disks = append(t.Disks, skeleton)
	}
	for range s.NICs {
		t.NICs = append(t.NICs, ports.NIC{})
	}
	return poolShape{Key: shapeKey(accel, t, placeholder), Spec: t, Medium: placeholder}, ""
}

// shapeKey names a shape: its skeleton spec and what of the accelerator a
// domain takes at its launch (the domain type, TCG's translation cache),
// so that a pool domain launched before a change of those is not claimed
// after it.
func shapeKey(accel accelerator, skeleton ports.VMSpec, medium *poolMedium) string {
	key, _ := json.Marshal(struct {
		Type       string
		TBCacheMiB int `json:",omitempty"`
		Spec       ports.VMSpec
		Medium     *poolMedium `json:",omitempty"`
	}{accel.DomainType, accel.tbCacheMiB(maxMemory(skeleton)), skeleton, medium})
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:])[:12]
}

// open makes the pool's directory and reads the shapes VMs used; run
// then starts the pool. Configure calls them once it is connected.
func (p *pool) open(env poolEnv) error {
	p.env = env
	if err := os.MkdirAll(p.dir, 0o711); err != nil {
		return fmt.Errorf("pool directory: %w", err)
	}
	if err := os.Chmod(p.dir, 0o711); err != nil { // QEMU's users reach their console logs' directory
		return err
	}
	if data, err := os.ReadFile(filepath.Join(p.dir, "shapes.json")); err == nil {
		if err := json.Unmarshal(data, &p.shapes); err != nil {
			p.env.log.WithError(err).Warn("pool: unreadable shapes; starting without")
			p.shapes = nil
		}
	}
	if len(p.shapes) > p.size {
		p.shapes = p.shapes[:p.size]
	}
	// Shapes named under another accelerator setting (a changed
	// tcgTranslationCacheMiB) get today's names: the sweep then destroys
	// the pool domains launched before, and the refill launches new ones.
	accel := env.vms.settings().accel
	for i := range p.shapes {
		p.shapes[i].Key = shapeKey(accel, p.shapes[i].Spec, p.shapes[i].Medium)
	}
	return nil
}

// run takes up the pool domains a previous plugin process left and starts
// the refills.
func (p *pool) run() {
	p.sweep()
	p.quit, p.done = make(chan struct{}), make(chan struct{})
	go p.refill()
	p.env.log.WithFields(logrus.Fields{"size": p.size, "shapes": len(p.shapes), "users": fmt.Sprintf("%d-%d", p.firstUID, p.firstUID+p.uids-1)}).
		Info("pool of pre-launched domains on")
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

// newPoolEnv is what h's pool uses of it.
func newPoolEnv(h *Hypervisor) poolEnv {
	return poolEnv{log: h.log, vms: h, live: h.conn.current, grants: &h.grants, store: h.store,
		keep: func(r *record) error {
			h.mu.Lock()
			defer h.mu.Unlock()
			if err := h.store.save(r); err != nil {
				return err
			}
			h.records[r.Spec.ID] = r
			return nil
		}}
}

// Shutdown destroys the pool's domains (see pool.shutdown).
func (h *Hypervisor) Shutdown(ctx context.Context) {
	if p := h.settings().pool; p != nil {
		p.shutdown(ctx)
	}
}

// shutdown destroys the pool's domains: the plugin is being stopped. VMs
// claimed from the pool are VMs like any other and stay. The daemon kills
// a plugin that takes more than 2 s to stop, so the domains go at once,
// their users' grants and files first (QEMU keeps what it has open); what
// a kill still leaves, the next start removes.
func (p *pool) shutdown(ctx context.Context) {
	if p.quit == nil {
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
	conn, err := p.env.live()
	if err != nil {
		return
	}
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	// The pool users' grants go first, in a few file operations: a paused
	// QEMU keeps what it has open, and a plugin killed while its domains
	// are destroyed (a loaded node takes seconds) leaves no grant behind.
	p.env.grants.sync()
	var wg sync.WaitGroup
	for _, d := range ready {
		removeFiles(append(consoleSideFiles(d.console), d.all()...)...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.destroy(conn, d.uuid, "the plugin stops")
		}()
	}
	wg.Wait()
	p.env.log.WithFields(logrus.Fields{"domains": len(ready), "millis": time.Since(begin).Milliseconds()}).Info("pool: domains destroyed")
}

// removeLeftovers removes what the pool's directory holds that no
// pool domain and no VM's record uses: the files of pool domains a crash
// ended.
func (p *pool) removeLeftovers() {
	keep := map[string]bool{filepath.Join(p.dir, "shapes.json"): true}
	p.env.vms.each(func(r *record) {
		keep[r.ConsoleLog] = true
		for _, f := range r.DiskPaths {
			keep[f] = true
		}
	})
	p.mu.Lock()
	for _, d := range append(slices.Clone(p.ready), p.launching) {
		if d != nil {
			for _, f := range d.all() {
				keep[f] = true
			}
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
		p.env.log.WithField("files", gone).Info("pool: removed the files of pool domains a crash ended")
	}
}
