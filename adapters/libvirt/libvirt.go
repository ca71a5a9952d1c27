// Package libvirt runs VMs as libvirt/QEMU domains: the hypervisor plugin
// shipped with Virtlet. Domains are persistent and tagged as Virtlet's
// (name prefix and a metadata element naming the plugin instance, so
// daemons sharing a libvirtd leave each other's domains alone); states
// come from libvirt's lifecycle events; the serial console goes through
// virtlogd to a raw file and from there into the container's CRI log.
//
// Hypervisor holds the VMs' records (under its mu) and serves the ports;
// each concern is a type of its own, with its own lock where it has
// state: connection dials and redials libvirtd; recordStore keeps the
// records' files; dispatcher queues libvirt's events and runs the one
// goroutine that hands them, and resyncs, to reconciler, which keeps the
// records true to libvirt; watchers fan state changes out to Watch;
// guestAgent (GuestExec, GuestInfo), consoles (OpenConsole) and inspector
// (Inspect, Diagnose, Display) serve their ports through vmSource;
// grants keeps VM users' ACL entries; pool pre-launches paused domains;
// onliner brings hot-plugged vCPUs online; machineTypes and dumps cache
// libvirt's machine types and prune watchdog dumps; accelProbe chooses
// KVM or TCG by booting a probe disk. The domain XML converter
// (domain*.go) is a table of pure functions, one per concern.
package libvirt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/adapters/diskfiles"
	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/ports"
)

// Config is the plugin's manifest config.
type Config struct {
	URI         string `json:"uri,omitempty" jsonschema_description:"URI of libvirtd"`
	Accelerator string `json:"accelerator,omitempty" jsonschema:"enum=auto,enum=kvm,enum=tcg" jsonschema_description:"auto (probe KVM, else TCG), kvm or tcg"`
	VMDir       string `json:"vmDir,omitempty" jsonschema_description:"directory of the VMs' root disk overlays and raw console logs, which QEMU must reach (empty: vms in the plugin's state directory)"`
	QEMU        string `json:"qemu,omitempty" jsonschema_description:"the emulator the accelerator probe runs"`
	// A booting guest starts its agent late.
	AgentWait string `json:"agentWait,omitempty" jsonschema_description:"how long after a VM starts an exec waits for its guest agent to connect: a duration such as 2m; 0 fails at once"`
	agentWait time.Duration
	// A VM that runs as a user of its own must be able to pass through
	// QEMUStateDir; see grants.go.
	QEMUStateDir string     `json:"qemuStateDir,omitempty" jsonschema_description:"libvirtd's QEMU state directory, which holds each running domain's private directory and guest agent socket"`
	Pool         PoolConfig `json:"pool,omitempty" jsonschema_description:"domains launched paused ahead of the VMs that claim them; off unless size is set"`
	AutoDumpDir  string     `json:"autoDumpDir,omitempty" jsonschema_description:"libvirtd's auto_dump_path: a VM's watchdog dumps there are pruned to its newest, and removed with the VM"`
	// TCGTranslationCacheMiB caps each TCG VM's translated code (QEMU's
	// tb-size; its default reserves 1 GiB and fills it as the guest runs
	// new code); 0 sizes it per VM (accelerator.tbCacheMiB). Ignored
	// under KVM.
	TCGTranslationCacheMiB int `json:"tcgTranslationCacheMiB,omitempty" jsonschema_description:"the most memory, in MiB, each VM's TCG translation cache holds (libvirt's <tcg><tb-cache>); 0: sized per VM, an eighth of its memory, 16 to 256 MiB; 1024: QEMU's default (on a host of 8 GiB or more); ignored under KVM"`
}

// Hypervisor is the libvirt hypervisor adapter.
type Hypervisor struct {
	log logrus.FieldLogger

	mu       sync.Mutex
	cfg      Config
	stateDir string
	vmDir    string
	owner    string // instanceOwner(stateDir): marks the domains this plugin instance made
	accel    accelerator
	records  map[string]*record
	// restoring holds the UUIDs of the checkpointed domains being
	// restored, until their records are saved: two restores of one
	// checkpoint must not both define the one domain.
	restoring map[string]bool
	tailers   map[string]*tailer
	stopped   map[string][]chan struct{} // Stop calls waiting for a VM to stop

	conn     connection
	store    recordStore
	events   dispatcher
	watchers watchers

	// The concerns whose methods are the adapter's: GuestExec and
	// GuestInfo; OpenConsole; Inspect, Diagnose and Display.
	guestAgent
	consoles
	inspector
	migrations

	// defineMu makes one validated define at a time: libvirtd validates
	// against its RNG schema with libxml2, whose first concurrent
	// validations after libvirtd starts race (Debian 12's 2.9.14: "Unable
	// to parse RNG ...: Error type 'unsignedInt' is not exported by type
	// library"). A define takes milliseconds.
	defineMu sync.Mutex

	// pool holds the pre-launched paused domains (nil: no pool).
	pool *pool

	reconciler reconciler
	grants     grants
	onliner    onliner
	machines   machineTypes
	dumps      dumps // set by Configure

	// domainState asks libvirt for a domain's state and reason (a seam:
	// tests make it slow).
	domainState func(*libvirt.Domain) (libvirt.DomainState, int, error)
}

// New returns an unconfigured adapter; the plugin host configures it.
func New(log logrus.FieldLogger) *Hypervisor {
	h := &Hypervisor{log: log, records: map[string]*record{}, tailers: map[string]*tailer{},
		stopped: map[string][]chan struct{}{}, domainState: (*libvirt.Domain).GetState,
		store: recordStore{log: log}, watchers: watchers{log: log}}
	h.reconciler = reconciler{h: h}
	h.events = newDispatcher(log, h.reconciler.apply, h.reconciler.resync)
	h.conn = connection{log: log, onLifecycle: h.events.onLifecycle, onWatchdog: h.events.onWatchdog, lost: h.watchers.end,
		restored: func() {
			h.events.resume()
			if p := h.settings().pool; p != nil {
				p.sweep()
			}
			h.grants.sync()
		}}
	h.grants = grants{log: log, vms: h}
	h.dumps = dumps{log: log}
	h.guestAgent = guestAgent{log: log, vms: h, dial: h.conn.dial, ready: h.conn.isReady}
	h.onliner = onliner{vms: h, domain: h.guestAgent.domain}
	h.consoles = consoles{log: log, vms: h, live: h.conn.current, dial: h.conn.dial, hubs: map[string]*consoleHub{}}
	h.inspector = inspector{vms: h, consoles: &h.consoles}
	h.migrations = migrations{h: h}
	return h
}

// vmSource is what the concern types read of the adapter's VMs: a VM's
// record, with its live domain or without, or every record; the lock that
// guards the records' fields (h.mu: locked and each run f holding it);
// and what Configure set up.
type vmSource interface {
	lookup(id string) (*record, *libvirt.Domain, error)
	record(id string) *record
	locked(f func())
	each(f func(r *record))
	settings() setup
}

// setup is what Configure set up: the config, the accelerator, the
// directories, and the pool (nil: none).
type setup struct {
	cfg                    Config
	accel                  accelerator
	stateDir, vmDir, owner string
	pool                   *pool
}

// record returns VM id's record, or nil.
func (h *Hypervisor) record(id string) *record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.records[id]
}

// locked runs f with h.mu held.
func (h *Hypervisor) locked(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f()
}

// each runs f for every record, with h.mu held.
func (h *Hypervisor) each(f func(r *record)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		f(r)
	}
}

// settings returns what Configure set up.
func (h *Hypervisor) settings() setup {
	h.mu.Lock()
	defer h.mu.Unlock()
	return setup{cfg: h.cfg, accel: h.accel, stateDir: h.stateDir, vmDir: h.vmDir, owner: h.owner, pool: h.pool}
}

func (h *Hypervisor) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "libvirt", Kind: ports.KindHypervisor, Handles: []string{"libvirt"}}
}

// DefaultConfig declares the plugin's config (ports.ConfigDefaulter).
func (h *Hypervisor) DefaultConfig() any {
	return Config{URI: "qemu:///system", Accelerator: "auto", QEMU: "qemu-system-x86_64", AgentWait: DefaultAgentWait.String(),
		QEMUStateDir: "/var/lib/libvirt/qemu", AutoDumpDir: DefaultAutoDumpDir, Pool: PoolConfig{Users: defaultPoolUsers}}
}

// Configure connects to libvirtd, chooses the accelerator, and takes up the
// VMs a previous plugin process left: their records, states and console
// streams.
func (h *Hypervisor) Configure(ctx context.Context, pc ports.PluginConfig) error {
	cfg := h.DefaultConfig().(Config)
	if err := pc.Decode(&cfg); err != nil {
		return fmt.Errorf("libvirt: %w", err)
	}
	switch cfg.Accelerator {
	case "auto", "kvm", "tcg":
	default:
		return &ports.InvalidError{Field: "libvirt config accelerator", Value: cfg.Accelerator, Allowed: "auto, kvm or tcg"}
	}
	wait, err := time.ParseDuration(cfg.AgentWait)
	if err != nil || wait < 0 {
		return &ports.InvalidError{Field: "libvirt config agentWait", Value: cfg.AgentWait, Allowed: "a duration of 0 or more, such as 2m or 30s"}
	}
	cfg.agentWait = wait
	if cfg.TCGTranslationCacheMiB < 0 || cfg.TCGTranslationCacheMiB > maxTBCacheMiB {
		return &ports.InvalidError{Field: "libvirt config tcgTranslationCacheMiB", Value: fmt.Sprint(cfg.TCGTranslationCacheMiB),
			Allowed: fmt.Sprintf("0 (sized per VM) to %d (QEMU's largest default)", maxTBCacheMiB)}
	}
	if pc.StateDir == "" {
		return fmt.Errorf("libvirt plugin needs a state directory: %w", ports.ErrInvalidArgument)
	}
	var p *pool
	if cfg.Pool.Size != 0 {
		if p, err = newPool(cfg.Pool, pc.StateDir); err != nil {
			return err
		}
	}
	vmDir := cfg.VMDir
	if vmDir == "" {
		vmDir = filepath.Join(pc.StateDir, "vms")
	}
	// QEMU runs as another user: the path to the overlays must be traversable.
	for _, d := range []string{pc.StateDir, vmDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	h.mu.Lock()
	h.cfg, h.stateDir, h.vmDir, h.owner = cfg, pc.StateDir, vmDir, instanceOwner(pc.StateDir)
	h.store.stateDir, h.dumps.dir = pc.StateDir, cfg.AutoDumpDir
	h.mu.Unlock()
	h.conn.configure(cfg.URI)
	records, err := h.store.load()
	if err != nil {
		return err
	}
	// A WriteFiles the previous process did not finish leaves its work
	// files.
	if err := diskfiles.Cleanup(filepath.Join(pc.StateDir, injectDir)); err != nil {
		h.log.WithError(err).Warn("clean up after interrupted file writes")
	}
	accel, cached := accelProbe{qemu: cfg.QEMU, dir: pc.StateDir}.choose(ctx, cfg.Accelerator)
	h.log.WithFields(logrus.Fields{"accelerator": accel.Name, "domainType": accel.DomainType, "why": accel.Reason, "cached": cached}).
		Info("accelerator chosen")

	startEventLoop(h.log)
	if accel.DomainType == tcgAccel.DomainType {
		accel.TBCacheMiB = cfg.TCGTranslationCacheMiB
	}
	h.mu.Lock()
	h.records, h.accel = records, accel
	h.mu.Unlock()
	h.events.start()
	if err := h.conn.connect(); err != nil {
		return err
	}
	h.events.resume()
	h.reconciler.stampOwners()
	if p != nil && h.pool == nil {
		if err := p.open(newPoolEnv(h)); err != nil {
			return err
		}
		h.mu.Lock()
		h.pool = p
		h.mu.Unlock()
		p.run()
	}
	// What VM users were granted for VMs and pool domains an earlier
	// process left, and that none needs now, goes.
	h.grants.syncOf(true)
	h.conn.setReady()
	return nil
}

// Capabilities reports libvirt's and QEMU's versions and the accelerator;
// it fails while libvirtd is unreachable (the runtime is then not ready).
func (h *Hypervisor) Capabilities(ctx context.Context) (ports.HypervisorCapabilities, error) {
	conn, err := h.conn.current()
	if err != nil {
		return ports.HypervisorCapabilities{}, err
	}
	lib, err := conn.GetLibVersion()
	if err != nil {
		return ports.HypervisorCapabilities{}, libvirtError("libvirt version", err)
	}
	hv, err := conn.GetVersion()
	if err != nil {
		return ports.HypervisorCapabilities{}, libvirtError("QEMU version", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return ports.HypervisorCapabilities{
		Name:        "libvirt",
		Version:     fmt.Sprintf("libvirt %s, QEMU %s", version(lib), version(hv)),
		Accelerator: h.accel.Name,
		Details:     map[string]string{"uri": h.cfg.URI, "domainType": h.accel.DomainType, "accelerator": h.accel.Reason, "vms": fmt.Sprint(len(h.records))},
	}, nil
}

func version(v uint32) string { return fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000) }

// Status reports one VM.
func (h *Hypervisor) Status(ctx context.Context, id string) (ports.VMStatus, error) {
	if _, err := h.conn.current(); err != nil {
		return ports.VMStatus{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.records[id]
	if r == nil {
		return ports.VMStatus{}, fmt.Errorf("VM %s: %w", id, ports.ErrNotFound)
	}
	return r.status(), nil
}

// List reports the VMs whose domains exist, and domains of ours without a
// record (for the core to remove).
func (h *Hypervisor) List(ctx context.Context) ([]ports.VMStatus, error) {
	conn, err := h.conn.current()
	if err != nil {
		return nil, err
	}
	doms, err := conn.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_PERSISTENT)
	if err != nil {
		return nil, libvirtError("list domains", err)
	}
	defer func() {
		for i := range doms {
			doms[i].Free()
		}
	}()
	// Which domains are ours takes a call per domain: made without h.mu.
	mine := map[string]*libvirt.Domain{}
	for i := range doms {
		if m, ok := ours(&doms[i], h.owner); ok {
			mine[m.ID] = &doms[i]
		}
	}
	var out []ports.VMStatus
	orphans := map[string]*libvirt.Domain{}
	h.mu.Lock()
	for id, dom := range mine {
		if r := h.records[id]; r != nil {
			out = append(out, r.status())
		} else {
			orphans[id] = dom
		}
	}
	h.mu.Unlock()
	for id, dom := range orphans {
		state, _, _ := h.domainState(dom)
		st := ports.VMStatus{ID: id, State: ports.VMStopped}
		if state != libvirt.DOMAIN_SHUTOFF {
			st.State = ports.VMRunning
		}
		out = append(out, st)
	}
	return out, nil
}

// Watch streams state changes until ctx ends or libvirtd goes away.
func (h *Hypervisor) Watch(ctx context.Context) (<-chan ports.VMStatus, error) {
	if _, err := h.conn.current(); err != nil {
		return nil, err
	}
	return h.watchers.add(ctx), nil
}

// ReopenLog reopens the VM's CRI log after kubelet rotated it.
func (h *Hypervisor) ReopenLog(ctx context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.records[id] == nil {
		return fmt.Errorf("VM %s: %w", id, ports.ErrNotFound)
	}
	t := h.tailers[id]
	if t == nil {
		return fmt.Errorf("VM %s has no console stream (not running): %w", id, ports.ErrFailedPrecondition)
	}
	return t.reopen()
}

// WriteFiles writes files into the root file system of a VM's boot disk
// before its first boot.
func (h *Hypervisor) WriteFiles(ctx context.Context, id string, files []ports.GuestFile) error {
	h.mu.Lock()
	r := h.records[id]
	var disk diskfiles.Disk
	var state ports.VMState
	if r != nil {
		state = r.State
		disk = bootDisk(r)
	}
	stateDir := h.stateDir
	h.mu.Unlock()
	switch {
	case r == nil:
		return fmt.Errorf("VM %s: %w", id, ports.ErrNotFound)
	case state != ports.VMDefined:
		return fmt.Errorf("VM %s has booted already; files are written before the first boot: %w", r.Spec.Name, ports.ErrFailedPrecondition)
	case disk.Path == "":
		return fmt.Errorf("VM %s has no boot disk on a file or block device to write files into: %w", r.Spec.Name, ports.ErrFailedPrecondition)
	}
	h.mu.Lock()
	prelaunched := r.Prelaunched
	h.mu.Unlock()
	if prelaunched {
		conn, err := h.conn.current()
		if err == nil {
			err = endPrelaunch(conn, h, h.store, r)
		}
		if err != nil {
			return fmt.Errorf("VM %s: %w", r.Spec.Name, err)
		}
		h.log.WithField("vm", r.Spec.Name).Info("the paused process of the VM claimed from the pool is ended: files are written into its root disk, and it starts cold")
	}
	start := time.Now()
	if err := diskfiles.Write(ctx, diskimage.Tool{UID: diskimage.LibvirtToolUID}, disk, files, filepath.Join(stateDir, injectDir, id)); err != nil {
		return fmt.Errorf("VM %s: %w", r.Spec.Name, err)
	}
	h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "files": len(files), "millis": time.Since(start).Milliseconds()}).
		Info("files written into the root file system")
	return nil
}

// injectDir, below the state directory, holds WriteFiles' work.
const injectDir = "inject"

// bootDisk is the disk a VM boots from, as diskfiles reads it.
func bootDisk(r *record) diskfiles.Disk {
	for _, d := range r.Spec.Disks {
		if !d.Boot {
			continue
		}
		switch {
		case d.Overlay != nil:
			return diskfiles.Disk{Path: r.DiskPaths[d.Name], Format: "qcow2", Backing: d.Overlay.BasePath}
		case d.Source.Type == ports.SourceFile || d.Source.Type == ports.SourceBlock:
			return diskfiles.Disk{Path: d.Source.Path, Format: d.Source.Format, Offset: d.Source.Offset, Size: d.Source.Size}
		}
		break
	}
	return diskfiles.Disk{}
}

var _ ports.Hypervisor = (*Hypervisor)(nil)

// close drops the libvirt connection (tests run many adapters in one
// process; the plugin process just exits).
func (h *Hypervisor) close() {
	conn, ids := h.conn.drop()
	h.onliner.stopAll()
	p := h.settings().pool
	if p != nil && p.quit != nil {
		select {
		case <-p.quit:
		default:
			close(p.quit)
		}
		<-p.done
	}
	if conn != nil {
		h.conn.hangUp(conn, ids)
	}
	h.guestAgent.hangUp()
	h.consoles.closeAll() // each stream has its own connection
	h.events.stop()
}

func watchdogModel(r *record) string {
	if r.Spec.Watchdog == nil {
		return ""
	}
	return r.Spec.Watchdog.Model
}
