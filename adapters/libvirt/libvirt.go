// Package libvirt runs VMs as libvirt/QEMU domains: the hypervisor plugin
// shipped with Virtlet. Domains are persistent and tagged as Virtlet's
// (name prefix and a metadata element naming the plugin instance, so
// daemons sharing a libvirtd leave each other's domains alone); states
// come from libvirt's lifecycle events; the serial console goes through
// virtlogd to a raw file and from there into the container's CRI log.
package libvirt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"

	"github.com/virtlet/virtlet/adapters/diskfiles"
	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/ports"
)

// Config is the plugin's manifest config.
type Config struct {
	// URI of libvirtd (default qemu:///system).
	URI string `json:"uri,omitempty"`
	// Accelerator: "auto" (default: probe KVM, else TCG), "kvm" or "tcg".
	Accelerator string `json:"accelerator,omitempty"`
	// VMDir holds root disk overlays and raw console logs; QEMU must be able
	// to reach it (default <plugin state dir>/vms).
	VMDir string `json:"vmDir,omitempty"`
	// QEMU is the emulator run by the accelerator probe.
	QEMU string `json:"qemu,omitempty"`
	// AgentWait is how long after a VM starts an exec waits for its guest
	// agent to connect (a duration such as 2m; default 2m, 0 fails at
	// once): a booting guest starts its agent late.
	AgentWait string `json:"agentWait,omitempty"`
	agentWait time.Duration
	// QEMUStateDir is libvirtd's QEMU state directory (default
	// /var/lib/libvirt/qemu), which holds each running domain's private
	// directory and guest agent socket. A VM that runs as a user of its own
	// must be able to pass through it; see grants.go.
	QEMUStateDir string `json:"qemuStateDir,omitempty"`
	// Pool keeps domains launched paused ahead of the VMs that claim
	// them (see PoolConfig); off unless pool.size is set.
	Pool PoolConfig `json:"pool,omitempty"`
	// AutoDumpDir is libvirtd's auto_dump_path (default
	// DefaultAutoDumpDir): a VM's watchdog dumps there are pruned to its
	// newest, and removed with the VM.
	AutoDumpDir string `json:"autoDumpDir,omitempty"`
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
	conn     *libvirt.Connect
	connErr  error
	records  map[string]*record
	tailers  map[string]*tailer
	subs     map[chan ports.VMStatus]struct{}
	stopped  map[string][]chan struct{} // Stop calls waiting for a VM to stop
	ready    bool

	// agentMu guards agentConn, the connection that carries guest-agent
	// commands (see agentDomain).
	agentMu   sync.Mutex
	agentConn *libvirt.Connect

	// callbackIDs are conn's event callbacks (lifecycle, watchdog); reconnecting is set
	// while a lost connection is being replaced.
	callbackIDs  []int
	reconnecting bool

	consoleMu sync.Mutex
	consoles  map[string]*consoleHub // one console stream per VM, shared by its viewers

	// defineMu makes one validated define at a time: libvirtd validates
	// against its RNG schema with libxml2, whose first concurrent
	// validations after libvirtd starts race (Debian 12's 2.9.14: "Unable
	// to parse RNG ...: Error type 'unsignedInt' is not exported by type
	// library"). A define takes milliseconds.
	defineMu sync.Mutex

	// machineTypes caches the machine types libvirt offers (guarded by mu).
	machineTypes []string
	// pool holds the pre-launched paused domains (nil: no pool).
	pool *pool
	// onlining cancels the background onlining of hot-plugged vCPUs, by
	// VM id (guarded by mu).
	onlining map[string]*onlining

	// grantsMu serialises syncGrants and grantNow (grants.go); inflight
	// (guarded by mu) holds what creations in progress were granted, and
	// imageDirs the directories of the images VMs used, whose images
	// syncGrants keeps clean.
	grantsMu    sync.Mutex
	inflight    map[string][]grant
	imageDirs   map[string]bool
	syncPending atomic.Bool

	events chan event
	// resyncs asks the dispatcher to resynchronise: nil after lost events,
	// a channel to close when done from resume.
	resyncs chan chan struct{}
	// resyncEvery is how often the dispatcher resynchronises anyway.
	resyncEvery time.Duration
	// quit ends the dispatcher, which closes dispatched (close: tests).
	quit, dispatched chan struct{}

	// domainState asks libvirt for a domain's state and reason (a seam:
	// tests make it slow).
	domainState func(*libvirt.Domain) (libvirt.DomainState, int, error)
}

// event is a lifecycle event of one of our domains, or (watchdog set) the
// firing of its watchdog.
type event struct {
	uuid     string
	kind     libvirt.DomainEventType
	detail   int
	watchdog string
	domain   string // the domain's name, for a watchdog's firing
}

// New returns an unconfigured adapter; the plugin host configures it.
func New(log logrus.FieldLogger) *Hypervisor {
	return &Hypervisor{log: log, records: map[string]*record{}, tailers: map[string]*tailer{},
		subs: map[chan ports.VMStatus]struct{}{}, stopped: map[string][]chan struct{}{}, events: make(chan event, 256),
		resyncs: make(chan chan struct{}, 1), resyncEvery: 30 * time.Second,
		consoles: map[string]*consoleHub{}, domainState: (*libvirt.Domain).GetState}
}

func (h *Hypervisor) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "libvirt", Kind: ports.KindHypervisor, Handles: []string{"libvirt"}}
}

var eventLoopOnce sync.Once

// Configure connects to libvirtd, chooses the accelerator, and takes up the
// VMs a previous plugin process left: their records, states and console
// streams.
func (h *Hypervisor) Configure(ctx context.Context, pc ports.PluginConfig) error {
	cfg := Config{URI: "qemu:///system", Accelerator: "auto", QEMU: "qemu-system-x86_64", AgentWait: DefaultAgentWait.String(),
		QEMUStateDir: "/var/lib/libvirt/qemu"}
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
	h.mu.Unlock()
	records, err := h.loadRecords()
	if err != nil {
		return err
	}
	// A WriteFiles the previous process did not finish leaves its work
	// files.
	if err := diskfiles.Cleanup(filepath.Join(pc.StateDir, injectDir)); err != nil {
		h.log.WithError(err).Warn("clean up after interrupted file writes")
	}
	accel, cached := cachedAccelerator(ctx, cfg.Accelerator, cfg.QEMU, pc.StateDir)
	h.log.WithFields(logrus.Fields{"accelerator": accel.Name, "domainType": accel.DomainType, "why": accel.Reason, "cached": cached}).
		Info("accelerator chosen")

	startEventLoop(h.log)
	h.mu.Lock()
	h.records, h.accel = records, accel
	startDispatch := h.quit == nil
	if startDispatch {
		h.quit, h.dispatched = make(chan struct{}), make(chan struct{})
	}
	quit, dispatched := h.quit, h.dispatched
	h.mu.Unlock()
	if startDispatch {
		go h.dispatch(quit, dispatched)
	}
	if err := h.connect(); err != nil {
		return err
	}
	h.resume()
	h.stampOwners()
	if p != nil && h.pool == nil {
		if err := h.startPool(p); err != nil {
			return err
		}
	}
	// What VM users were granted for VMs and pool domains an earlier
	// process left, and that none needs now, goes.
	h.syncGrantsOf(true)
	h.mu.Lock()
	h.ready = true
	h.mu.Unlock()
	return nil
}

// startEventLoop runs libvirt's event loop, once per process; it must run
// before a connection is opened for the connection's events to arrive.
func startEventLoop(log logrus.FieldLogger) {
	eventLoopOnce.Do(func() {
		if err := libvirt.EventRegisterDefaultImpl(); err != nil {
			log.WithError(err).Error("register libvirt event loop")
			return
		}
		go func() {
			for {
				if err := libvirt.EventRunDefaultImpl(); err != nil {
					log.WithError(err).Error("libvirt event loop")
					time.Sleep(time.Second)
				}
			}
		}()
	})
}

// dial opens a connection to the configured libvirtd, with keepalives
// (what names it in the log).
func (h *Hypervisor) dial(what string) (*libvirt.Connect, string, error) {
	h.mu.Lock()
	uri := h.cfg.URI
	h.mu.Unlock()
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, uri, err
	}
	if err := conn.SetKeepAlive(5, 3); err != nil {
		h.log.WithError(err).WithField("connection", what).Warn("libvirt keepalive")
	}
	return conn, uri, nil
}

// connect opens the libvirt connection and subscribes to lifecycle events.
func (h *Hypervisor) connect() error {
	conn, uri, err := h.dial("main")
	if err != nil {
		h.setConnErr(err)
		return fmt.Errorf("connect to libvirtd at %s: %v: %w", uri, err, ports.ErrUnavailable)
	}
	id, err := conn.DomainEventLifecycleRegister(nil, h.onLifecycle)
	if err != nil {
		conn.Close()
		return fmt.Errorf("subscribe to libvirt events: %w", err)
	}
	wid, err := conn.DomainEventWatchdogRegister(nil, h.onWatchdog)
	if err != nil {
		conn.DomainEventDeregister(id)
		conn.Close()
		return fmt.Errorf("subscribe to libvirt watchdog events: %w", err)
	}
	if err := conn.RegisterCloseCallback(h.onClose); err != nil {
		h.log.WithError(err).Warn("libvirt close callback")
	}
	h.mu.Lock()
	old, oldIDs := h.conn, h.callbackIDs
	h.conn, h.callbackIDs, h.connErr = conn, []int{id, wid}, nil
	h.mu.Unlock()
	if old != nil {
		h.hangUp(old, oldIDs)
	}
	h.log.WithField("uri", uri).Info("connected to libvirtd")
	return nil
}

func (h *Hypervisor) setConnErr(err error) {
	h.mu.Lock()
	h.conn, h.connErr = nil, err
	h.mu.Unlock()
}

// onClose runs (on libvirt's event loop) when libvirtd goes away: the
// watchers are ended (the core then resynchronises), and in the background
// the dead connection is released and a new one opened.
func (h *Hypervisor) onClose(_ *libvirt.Connect, reason libvirt.ConnectCloseReason) {
	h.mu.Lock()
	old, oldIDs := h.conn, h.callbackIDs
	h.conn, h.connErr = nil, fmt.Errorf("the connection closed (reason %d)", reason)
	already := h.reconnecting
	h.reconnecting = true
	h.mu.Unlock()
	if already {
		return
	}
	h.log.WithField("reason", reason).Error("lost the libvirtd connection; reconnecting")
	h.endWatches()
	go func() {
		if old != nil {
			h.hangUp(old, oldIDs)
		}
		for backoff := 200 * time.Millisecond; ; backoff = min(backoff*2, 10*time.Second) {
			time.Sleep(backoff)
			if err := h.connect(); err == nil {
				h.mu.Lock()
				h.reconnecting = false
				h.mu.Unlock()
				h.resume()
				h.sweepPool()
				h.syncGrants()
				return
			}
		}
	}()
}

// hangUp releases a connection the adapter no longer uses. Its callbacks
// hold references to it: without deregistering them, Close would leave
// the connection, its socket and the callbacks alive, and a later
// connection's events would arrive twice. On a dead connection the
// deregistrations fail after dropping the callbacks locally, which is all
// that is needed.
func (h *Hypervisor) hangUp(conn *libvirt.Connect, callbackIDs []int) {
	for _, id := range callbackIDs {
		if err := conn.DomainEventDeregister(id); err != nil {
			h.log.WithError(err).Debug("deregister events of the old libvirt connection")
		}
	}
	if err := conn.UnregisterCloseCallback(); err != nil {
		h.log.WithError(err).Debug("unregister the close callback of the old libvirt connection")
	}
	// Domains still held by calls in flight keep it referenced until
	// they are freed.
	if refs, err := conn.Close(); err != nil || refs > 0 {
		h.log.WithError(err).WithField("references", refs).Debug("old libvirt connection still referenced")
	}
}

// onLifecycle runs on libvirt's event loop: it only queues the event.
func (h *Hypervisor) onLifecycle(c *libvirt.Connect, d *libvirt.Domain, e *libvirt.DomainEventLifecycle) {
	uuid, err := d.GetUUIDString()
	if err != nil {
		return
	}
	h.queue(event{uuid: uuid, kind: e.Event, detail: e.Detail})
}

// watchdogActions name libvirt's watchdog actions as the annotation does.
var watchdogActions = map[libvirt.DomainEventWatchdogAction]string{
	libvirt.DOMAIN_EVENT_WATCHDOG_NONE: "none", libvirt.DOMAIN_EVENT_WATCHDOG_PAUSE: "pause",
	libvirt.DOMAIN_EVENT_WATCHDOG_RESET: "reset", libvirt.DOMAIN_EVENT_WATCHDOG_POWEROFF: "poweroff",
	libvirt.DOMAIN_EVENT_WATCHDOG_SHUTDOWN: "shutdown", libvirt.DOMAIN_EVENT_WATCHDOG_DEBUG: "dump",
	libvirt.DOMAIN_EVENT_WATCHDOG_INJECTNMI: "inject-nmi",
}

// onWatchdog runs on libvirt's event loop when a guest's watchdog fires:
// it queues the firing, in order with the lifecycle events it causes.
func (h *Hypervisor) onWatchdog(c *libvirt.Connect, d *libvirt.Domain, e *libvirt.DomainEventWatchdog) {
	uuid, err := d.GetUUIDString()
	if err != nil {
		return
	}
	action := watchdogActions[e.Action]
	if action == "" {
		action = fmt.Sprintf("action %d", e.Action)
	}
	name, _ := d.GetName()
	h.queue(event{uuid: uuid, watchdog: action, domain: name})
}

func (h *Hypervisor) queue(e event) {
	select {
	case h.events <- e:
	default:
		h.log.Warn("libvirt event queue full; a resync will catch up")
		select {
		case h.resyncs <- nil:
		default: // one is pending already
		}
	}
}

// dispatch applies queued lifecycle events in order, and resynchronises
// with libvirt when asked (events were lost, or the connection is new) and
// every resyncEvery (an event may be lost where nobody notices). Both run
// here, so that no event older than a resync is applied after it.
func (h *Hypervisor) dispatch(quit <-chan struct{}, dispatched chan<- struct{}) {
	defer close(dispatched)
	tick := time.NewTicker(h.resyncEvery)
	defer tick.Stop()
	for {
		select {
		case <-quit:
			return
		case e := <-h.events:
			h.apply(e)
		case done := <-h.resyncs:
			h.drainEvents()
			h.resync()
			if done != nil {
				close(done)
			}
		case <-tick.C:
			h.drainEvents()
			h.resync()
		}
	}
}

// drainEvents applies the events queued so far.
func (h *Hypervisor) drainEvents() {
	for {
		select {
		case e := <-h.events:
			h.apply(e)
		default:
			return
		}
	}
}

// apply applies one lifecycle event.
func (h *Hypervisor) apply(e event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var r *record
	for _, rec := range h.records {
		if strings.EqualFold(rec.Spec.UUID, e.uuid) {
			r = rec
			break
		}
	}
	if r == nil {
		return // not ours
	}
	if e.watchdog != "" {
		// The guest stopped petting its watchdog: the VM it stops (poweroff,
		// shutdown) ends with reason Watchdog; a reset or a dump leaves it
		// running, and is logged.
		h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "action": e.watchdog}).Warn("the guest's watchdog fired")
		if e.watchdog == "dump" && e.domain != "" {
			h.pruneDumps(r.Spec.Name, e.domain, 1) // and again as it resumes, the new dump written
		}
		if e.watchdog == "poweroff" || e.watchdog == "shutdown" {
			r.Watchdog = e.watchdog
			if err := h.saveRecord(r); err != nil {
				h.log.WithError(err).Warn("save VM record")
			}
		}
		return
	}
	switch e.kind {
	case libvirt.DOMAIN_EVENT_STARTED, libvirt.DOMAIN_EVENT_RESUMED:
		// libvirtd resumes a guest once its watchdog's dump is written
		// (the firing's event comes before the dump): the older ones go.
		if wd := r.Spec.Watchdog; wd != nil && wd.Action == "dump" && e.kind == libvirt.DOMAIN_EVENT_RESUMED {
			h.pruneDumps(r.Spec.Name, r.Spec.Name, 1)
		}
		if r.State == ports.VMRunning {
			return
		}
		r.State = ports.VMRunning
		r.seq++
		if r.StartedAt.IsZero() {
			r.StartedAt = time.Now().UTC()
		}
	case libvirt.DOMAIN_EVENT_CRASHED:
		r.Crashed = true
		return
	case libvirt.DOMAIN_EVENT_STOPPED:
		if r.State != ports.VMRunning {
			return // applied already, from the shutoff reason (Stop, a resync)
		}
		h.exitLocked(r, exitFromEvent(libvirt.DomainEventStoppedDetailType(e.detail), r))
	default:
		return
	}
	if err := h.saveRecord(r); err != nil {
		h.log.WithError(err).Warn("save VM record")
	}
	h.notifyLocked(r.status())
}

// exit is how a VM ended.
type exit struct {
	code    int32
	reason  string
	message string
}

func exitFromEvent(detail libvirt.DomainEventStoppedDetailType, r *record) exit {
	switch detail {
	case libvirt.DOMAIN_EVENT_STOPPED_SHUTDOWN:
		if r.StopRequested {
			return exit{0, "Completed", "the guest shut down on request"}
		}
		return exit{0, "Completed", "the guest powered off"}
	case libvirt.DOMAIN_EVENT_STOPPED_DESTROYED:
		return forcedExit(r)
	case libvirt.DOMAIN_EVENT_STOPPED_CRASHED:
		return exit{1, "Crashed", "the guest crashed"}
	case libvirt.DOMAIN_EVENT_STOPPED_FAILED:
		return exit{1, "Failed", "the QEMU process ended unexpectedly"}
	default:
		return exit{255, "Stopped", fmt.Sprintf("stopped by libvirt (event detail %d)", detail)}
	}
}

func exitFromShutoff(reason libvirt.DomainShutoffReason, r *record) exit {
	switch reason {
	case libvirt.DOMAIN_SHUTOFF_SHUTDOWN:
		return exitFromEvent(libvirt.DOMAIN_EVENT_STOPPED_SHUTDOWN, r)
	case libvirt.DOMAIN_SHUTOFF_DESTROYED:
		return forcedExit(r)
	case libvirt.DOMAIN_SHUTOFF_CRASHED:
		return exit{1, "Crashed", "the guest crashed"}
	case libvirt.DOMAIN_SHUTOFF_FAILED:
		return exit{1, "Failed", "the QEMU process ended unexpectedly"}
	default:
		return exit{255, "Stopped", fmt.Sprintf("found shut off (reason %d)", reason)}
	}
}

func forcedExit(r *record) exit {
	switch {
	case r.Crashed:
		return exit{1, "Crashed", "the guest crashed"}
	case r.ForcedAfter > 0:
		return exit{137, "Killed", fmt.Sprintf("forced off: the guest did not shut down within the %s grace period", r.ForcedAfter)}
	case r.StopRequested:
		return exit{137, "Killed", "forced off"}
	default:
		return exit{137, "Killed", "destroyed outside Virtlet"}
	}
}

// exitLocked records a VM's end; callers hold h.mu.
func (h *Hypervisor) exitLocked(r *record, e exit) {
	r.State = ports.VMStopped
	r.seq++
	r.FinishedAt = time.Now().UTC()
	if r.Watchdog != "" && !r.StopRequested {
		e = exit{1, "Watchdog", fmt.Sprintf("the guest stopped petting its %s watchdog, which did %s", watchdogModel(r), r.Watchdog)}
	}
	r.Watchdog = ""
	r.ExitCode, r.Reason, r.Message = e.code, e.reason, e.message
	r.StopRequested, r.Crashed = false, false
	for _, ch := range h.stopped[r.Spec.ID] {
		close(ch)
	}
	delete(h.stopped, r.Spec.ID)
	if t := h.tailers[r.Spec.ID]; t != nil {
		delete(h.tailers, r.Spec.ID)
		go t.close() // drains the last output
	}
	// Not here, under h.mu: closing takes consoleMu, which OpenConsole
	// holds while it opens a stream (lock order).
	ended := r.runs
	r.runs++
	go h.closeConsole(r.Spec.ID, ended)
}

// notifyLocked sends a state change to the watchers. One that does not
// keep up is cut off (its channel closed) rather than skipped: a change it
// never hears of would stay unknown, while the end of its watch makes it
// resubscribe and resynchronise with List.
func (h *Hypervisor) notifyLocked(st ports.VMStatus) {
	for ch := range h.subs {
		select {
		case ch <- st:
		default:
			h.log.WithField("vm", st.ID).Warn("a watcher fell behind; ending its watch so that it resynchronises")
			delete(h.subs, ch)
			close(ch)
		}
	}
}

func (h *Hypervisor) endWatches() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		close(ch)
	}
	h.subs = map[chan ports.VMStatus]struct{}{}
}

// resume takes up the VMs of the records after (re)connecting: states
// that changed while nobody listened, and console streams of running VMs.
// The dispatcher does it (see dispatch); resume waits for it.
func (h *Hypervisor) resume() {
	done := make(chan struct{})
	h.resyncs <- done
	<-done
}

// resync compares what libvirt says of the records' domains with what the
// records last reported, and applies (and reports) the difference: the
// transitions of events lost or never received. It is cheap enough to run
// often: one call lists the running domains; a VM found stopped costs one
// more (for its shutoff reason). libvirt is asked without h.mu held (a
// slow domain must not hold up calls about others); what it says applies
// only to a record that did not change meanwhile.
func (h *Hypervisor) resync() {
	conn, err := h.connection()
	if err != nil {
		return // the reconnection resumes
	}
	type check struct {
		r     *record
		seq   uint64
		state ports.VMState
	}
	h.mu.Lock()
	checks := make([]check, 0, len(h.records))
	for _, r := range h.records {
		if r.Prelaunched || r.Claim == claiming {
			continue // its domain is paused before its first instruction: defined, not running
		}
		checks = append(checks, check{r, r.seq, r.State})
	}
	h.mu.Unlock()
	if len(checks) == 0 {
		return
	}
	doms, err := conn.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_ACTIVE)
	if err != nil {
		h.log.WithError(err).Warn("resync: list running domains")
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
			s, reason, err = h.domainState(dom)
			dom.Free()
			if err != nil || s != libvirt.DOMAIN_SHUTOFF {
				continue // started again since the list
			}
			state = libvirt.DOMAIN_SHUTOFF
		}
		h.mu.Lock()
		if r := c.r; h.records[r.Spec.ID] == r && r.seq == c.seq {
			h.resumeLocked(r, state, reason)
			if r.State != c.state {
				h.notifyLocked(r.status())
			}
		}
		h.mu.Unlock()
	}
}

// resumeLocked applies a domain's state found by resync; callers hold
// h.mu.
func (h *Hypervisor) resumeLocked(r *record, state libvirt.DomainState, reason int) {
	switch {
	case state == libvirt.DOMAIN_RUNNING || state == libvirt.DOMAIN_PAUSED || state == libvirt.DOMAIN_BLOCKED:
		if r.State != ports.VMRunning {
			r.State = ports.VMRunning
			r.seq++
			if r.StartedAt.IsZero() || r.FinishedAt.After(r.StartedAt) {
				r.StartedAt, r.FinishedAt = time.Now().UTC(), time.Time{} // started where no event told
			}
			h.saveRecord(r)
			h.log.WithFields(logrus.Fields{"vm": r.Spec.Name}).Info("VM found running")
		}
		if h.tailers[r.Spec.ID] == nil {
			h.startTailerLocked(r)
		}
	case state == libvirt.DOMAIN_SHUTOFF && r.State == ports.VMRunning:
		h.exitLocked(r, exitFromShutoff(libvirt.DomainShutoffReason(reason), r))
		h.saveRecord(r)
		h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "reason": r.Reason}).Info("VM found stopped")
	}
}

func (h *Hypervisor) startTailerLocked(r *record) {
	id := r.Spec.ID
	t, err := startTailer(r.ConsoleLog, r.Spec.ConsoleLogPath, r.ConsoleOffset, r.ConsoleInode, func(off int64, ino uint64) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if rec := h.records[id]; rec != nil {
			rec.ConsoleOffset, rec.ConsoleInode = off, ino
			h.saveRecord(rec)
		}
	}, h.log.WithField("vm", r.Spec.Name))
	if err != nil {
		h.log.WithError(err).WithField("vm", r.Spec.Name).Error("cannot stream the console to the CRI log")
		return
	}
	h.tailers[id] = t
}

// connection returns the live connection or says why there is none.
func (h *Hypervisor) connection() (*libvirt.Connect, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		if !h.ready && h.connErr == nil {
			return nil, fmt.Errorf("the libvirt plugin is not configured yet: %w", ports.ErrUnavailable)
		}
		return nil, fmt.Errorf("libvirtd at %s is unreachable: %v: %w", h.cfg.URI, h.connErr, ports.ErrUnavailable)
	}
	return h.conn, nil
}

// libvirtError classifies libvirt's errors into port error kinds.
func libvirtError(op string, err error) error {
	var le libvirt.Error
	if errors.As(err, &le) {
		msg := fmt.Sprintf("%s: %s", op, le.Message)
		switch le.Code {
		case libvirt.ERR_NO_DOMAIN:
			return fmt.Errorf("%s: %w", msg, ports.ErrNotFound)
		case libvirt.ERR_XML_ERROR, libvirt.ERR_CONFIG_UNSUPPORTED, libvirt.ERR_INVALID_ARG, libvirt.ERR_XML_DETAIL:
			return fmt.Errorf("%s: %w", msg, ports.ErrInvalidArgument)
		case libvirt.ERR_OPERATION_INVALID:
			return fmt.Errorf("%s: %w", msg, ports.ErrFailedPrecondition)
		case libvirt.ERR_SYSTEM_ERROR, libvirt.ERR_NO_CONNECT, libvirt.ERR_INTERNAL_ERROR:
			if strings.Contains(le.Message, "already exists") {
				return fmt.Errorf("%s: %w", msg, ports.ErrAlreadyExists)
			}
		}
		// The connection to libvirtd is gone: the caller may retry.
		if le.Domain == libvirt.FROM_RPC || le.Code == libvirt.ERR_NO_CONNECT || le.Code == libvirt.ERR_INVALID_CONN || le.Code == libvirt.ERR_RPC {
			return fmt.Errorf("%s (libvirtd unreachable): %w", msg, ports.ErrUnavailable)
		}
		if strings.Contains(le.Message, "already exists") {
			return fmt.Errorf("%s: %w", msg, ports.ErrAlreadyExists)
		}
		return errors.New(msg)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Capabilities reports libvirt's and QEMU's versions and the accelerator;
// it fails while libvirtd is unreachable (the runtime is then not ready).
func (h *Hypervisor) Capabilities(ctx context.Context) (ports.HypervisorCapabilities, error) {
	conn, err := h.connection()
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

// Define creates the VM's root disk overlay and defines its domain.
func (h *Hypervisor) Define(ctx context.Context, spec ports.VMSpec) error {
	if err := validID(spec.ID); err != nil {
		return err
	}
	if spec.VCPUs < 1 || spec.MemoryBytes <= 0 {
		return fmt.Errorf("VM %s: needs vCPUs and memory: %w", spec.Name, ports.ErrInvalidArgument)
	}
	conn, err := h.connection()
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
		done, err := h.grantNow(spec.ID, spec.RunAs.UID, overlayBases(spec))
		if err != nil {
			return fmt.Errorf("VM %s runs as user %d: %w", spec.Name, spec.RunAs.UID, err)
		}
		defer func() {
			done()
			// A failed creation's grants go; so do those of the user the
			// VM asked for when it took a pool domain's.
			h.syncGrantsSoon()
		}()
	} else if err := openToQEMUUser(h.log, overlayBases(spec)); err != nil {
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}

	if err := h.checkMachine(conn, accel, spec.Machine); err != nil {
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}
	if err := checkWatchdog(conn, spec.Watchdog); err != nil {
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}
	if err := checkHugepages(conn, spec.HugepageSizeBytes, spec.MemoryBytes); err != nil {
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}
	if spec.HyperV && accel.DomainType != kvmAccel.DomainType {
		return fmt.Errorf("VM %s: %w", spec.Name, &ports.InvalidError{Field: "annotation VirtletHyperV", Value: "true",
			Reason:  fmt.Sprintf("Hyper-V enlightenments need KVM; this node runs its VMs under %s (%s)", accel.Name, accel.Reason),
			Allowed: "false, or a node whose VMs run under KVM"})
	}
	hostCPUs, err := checkCPUSet(conn, spec.CPUSet)
	if err != nil {
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}
	log := h.log.WithFields(logrus.Fields{"vm": spec.Name, "pod": spec.PodNamespace + "/" + spec.PodName})
	shape, coldWhy := poolable(spec, accel.DomainType)
	r := &record{Spec: spec.WithoutSecrets(), DiskPaths: map[string]string{}, ConsoleLog: filepath.Join(vmDir, spec.ID+".console"), State: ports.VMDefined}
	if spec.UUID == "" {
		// The pod asks for no UUID: one derived from the VM's ID, stable
		// for its life (a VM claimed from the pool gets the pool's).
		r.Asked = &vmIdentity{Name: spec.Name, RunAs: spec.RunAs}
		spec.UUID = uuid.NewSHA1(vmUUIDSpace, []byte(spec.ID)).String()
		r.Spec.UUID = spec.UUID
	}
	switch {
	case pool == nil:
	case coldWhy != "":
		log.WithField("why", coldWhy).Info("cold start: the VM cannot come from the pool")
	default:
		if d := pool.take(shape); d == nil {
			log.WithField("shape", shape.Key).Info("cold start: no pool domain of the VM's shape is ready")
		} else {
			claimed := h.claim(conn, d, spec, r, accel, log)
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
	for _, d := range spec.Disks {
		if d.Overlay == nil {
			continue
		}
		p := filepath.Join(vmDir, spec.ID+"-"+d.Name+".qcow2")
		took, err := createOverlay(ctx, p, *d.Overlay, d.Name)
		if err != nil {
			undo()
			return fmt.Errorf("VM %s: %w", spec.Name, err)
		}
		made = append(made, p)
		r.DiskPaths[d.Name] = p
		log.WithFields(logrus.Fields{"disk": d.Name, "base": d.Overlay.BasePath, "millis": took.Milliseconds()}).Info("root disk overlay created")
	}
	removeFiles(append(rotatedLogs(r.ConsoleLog), r.ConsoleLog)...) // a stale log of a reused ID
	if r.Secrets, err = defineSecrets(conn, spec); err != nil {
		undo()
		return fmt.Errorf("VM %s: %w", spec.Name, err)
	}
	domXML, err := domainXML(domainInput{Spec: spec, DomainType: accel.DomainType, DiskPaths: r.DiskPaths, ConsoleLog: r.ConsoleLog, Secrets: r.Secrets,
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
	if err := h.saveRecord(r); err != nil {
		return err
	}
	h.records[spec.ID] = r
	log.WithField("accelerator", accel.Name).Info("domain defined")
	return nil
}

func (h *Hypervisor) lookup(id string) (*record, *libvirt.Domain, error) {
	conn, err := h.connection()
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
	if err == nil && state == libvirt.DOMAIN_RUNNING {
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
		h.startTailerLocked(r)
	}
	h.mu.Unlock()
	start := dom.Create
	if resume {
		start = dom.Resume // a VM claimed from the pool: paused before its first instruction
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
	if err := h.saveRecord(r); err != nil {
		return err
	}
	h.notifyLocked(r.status())
	if resume {
		h.pool.resumed()
	}
	h.log.WithFields(logrus.Fields{"vm": r.Spec.Name, "resumed": resume, "millis": time.Since(begin).Milliseconds()}).Info("VM started")
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
		return h.foundShutOff(r, reason), nil // the stop event may still be on its way
	}
	done := make(chan struct{})
	h.mu.Lock()
	r.StopRequested = true
	h.saveRecord(r)
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
			return h.foundShutOff(r, reason), nil
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return r.status(), nil
}

// foundShutOff records the end of a VM found shut off whose stop event has
// not been applied (yet), and reports the VM.
func (h *Hypervisor) foundShutOff(r *record, reason int) ports.VMStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.State == ports.VMRunning {
		h.exitLocked(r, exitFromShutoff(libvirt.DomainShutoffReason(reason), r))
		h.saveRecord(r)
		h.notifyLocked(r.status())
	}
	return r.status()
}

// Undefine removes the domain (forcing it off first), its overlay disks,
// its console logs and its record.
func (h *Hypervisor) Undefine(ctx context.Context, id string) error {
	conn, err := h.connection()
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
		dom, err = h.findOrphan(conn, id)
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
		if err := h.removeLeftovers(id); err != nil {
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
			h.pruneDumps(id, name, 0)
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
		h.syncGrants()
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
	h.closeConsole(id, allRuns)
	files := []string{r.ConsoleLog}
	files = append(files, rotatedLogs(r.ConsoleLog)...)
	for _, p := range r.DiskPaths {
		files = append(files, p)
	}
	if err := removeFiles(files...); err != nil {
		return fmt.Errorf("remove files of VM %s: %w", r.Spec.Name, err)
	}
	if err := h.deleteRecord(id); err != nil {
		return err
	}
	h.syncGrants() // its user's entries go
	h.log.WithField("vm", r.Spec.Name).Info("domain undefined, disks removed")
	return nil
}

// stampOwners names this plugin instance the owner of its VMs' domains
// that name none: VMs that claimed a pool domain before a claim recorded
// its owner (or made before owners were). Another plugin instance on the
// same libvirtd would take them for orphans of its own and remove them.
func (h *Hypervisor) stampOwners() {
	conn, err := h.connection()
	if err != nil {
		return
	}
	h.mu.Lock()
	rs := make([]*record, 0, len(h.records))
	for _, r := range h.records {
		if r.Claim != claiming {
			rs = append(rs, r)
		}
	}
	h.mu.Unlock()
	for _, r := range rs {
		dom, err := conn.LookupDomainByUUIDString(r.Spec.UUID)
		if err != nil {
			continue
		}
		if m, ok := ours(dom, h.owner); ok && m.Owner == "" && m.ID == r.Spec.ID {
			flags := libvirt.DOMAIN_AFFECT_CONFIG
			if active, _ := dom.IsActive(); active {
				flags |= libvirt.DOMAIN_AFFECT_LIVE
			}
			if err := setVMMetadata(dom, r.Spec, h.owner, flags); err != nil {
				h.log.WithError(err).WithField("vm", r.Spec.Name).Warn("name this plugin instance the owner of the VM's domain")
			} else {
				h.log.WithField("vm", r.Spec.Name).Info("the VM's domain now names its owner")
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

// findOrphan finds a domain of ours that has no record.
func (h *Hypervisor) findOrphan(conn *libvirt.Connect, id string) (*libvirt.Domain, error) {
	doms, err := conn.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_PERSISTENT)
	if err != nil {
		return nil, err
	}
	var found *libvirt.Domain
	for i := range doms {
		if m, ok := ours(&doms[i], h.owner); ok && m.ID == id && found == nil {
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

// Status reports one VM.
func (h *Hypervisor) Status(ctx context.Context, id string) (ports.VMStatus, error) {
	if _, err := h.connection(); err != nil {
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
	conn, err := h.connection()
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
	if _, err := h.connection(); err != nil {
		return nil, err
	}
	ch := make(chan ports.VMStatus, 64)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	go func() {
		<-ctx.Done()
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.subs[ch]; ok {
			delete(h.subs, ch)
			close(ch)
		}
	}()
	return ch, nil
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

// SetMemory resizes a VM's memory within its maximum: through the balloon
// while it runs (the guest gives pages back or takes them), and in its
// definition for the next boot.
func (h *Hypervisor) SetMemory(ctx context.Context, id string, bytes int64) error {
	r, dom, err := h.lookup(id)
	if err != nil {
		return err
	}
	defer dom.Free()
	h.mu.Lock()
	name, max := r.Spec.Name, maxMemory(r.Spec)
	h.mu.Unlock()
	if bytes <= 0 || bytes > max {
		return &ports.InvalidError{Field: "resources.limits.memory", Value: fmt.Sprintf("%d bytes", bytes),
			Reason: fmt.Sprintf("outside what VM %s can be resized to", name), Allowed: fmt.Sprintf("at most %d bytes (VirtletMaxMemory)", max)}
	}
	flags := libvirt.DOMAIN_MEM_CONFIG
	if state, _, err := dom.GetState(); err == nil && state == libvirt.DOMAIN_RUNNING {
		flags |= libvirt.DOMAIN_MEM_LIVE
	}
	if err := dom.SetMemoryFlags(uint64(bytes>>10), flags); err != nil {
		return libvirtError("resize the memory of domain "+name, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := r.Spec.MemoryBytes
	r.Spec.MemoryBytes = bytes
	if err := h.saveRecord(r); err != nil {
		r.Spec.MemoryBytes = old // the record on disk still says so
		return err
	}
	return nil
}

// SetVCPUs changes a VM's vCPUs within its range, live while it runs and
// in its definition for the next boot. Growing hot-plugs vCPUs and has the
// guest's agent bring them online in the background (Linux leaves a
// hot-plugged CPU offline unless told). Shrinking has the agent take vCPUs offline, and unplugs
// them at the next boot: Debian 12's QEMU 7.2 does not report a removed
// vCPU (no DEVICE_DELETED for the CPU itself, only for its local APIC), so
// libvirt 9.0 times out and keeps counting an unplugged vCPU as present,
// and can neither plug it again nor tell its true count. A shrink
// therefore needs the guest's agent; a later grow brings the offline vCPUs
// back before it plugs new ones.
func (h *Hypervisor) SetVCPUs(ctx context.Context, id string, n int) error {
	r, dom, err := h.lookup(id)
	if err != nil {
		return err
	}
	defer dom.Free()
	h.mu.Lock()
	name, old, lo, hi := r.Spec.Name, r.Spec.VCPUs, max(r.Spec.MinVCPUs, 1), topVCPUs(r.Spec)
	fixed := r.Spec.MaxVCPUs == 0
	h.mu.Unlock()
	if fixed {
		lo, hi = old, old
	}
	if n < lo || n > hi {
		return &ports.InvalidError{Field: "vCPUs", Value: strconv.Itoa(n),
			Reason: fmt.Sprintf("outside what VM %s can be given while it runs", name), Allowed: fmt.Sprintf("%d to %d", lo, hi)}
	}
	if n == old {
		return nil
	}
	log := h.log.WithFields(logrus.Fields{"vm": name, "from": old, "to": n})
	onlineLater := false
	if state, _, err := dom.GetState(); err == nil && state == libvirt.DOMAIN_RUNNING {
		plugged, err := dom.GetVcpusFlags(libvirt.DOMAIN_VCPU_LIVE)
		if err != nil {
			return libvirtError("the live vCPUs of domain "+name, err)
		}
		if n > int(plugged) {
			if err := dom.SetVcpusFlags(uint(n), libvirt.DOMAIN_VCPU_LIVE); err != nil {
				return libvirtError(fmt.Sprintf("hot-plug vCPUs into domain %s (%d to %d)", name, plugged, n), err)
			}
		}
		// An onlining of an earlier grow ends first (its last agent call
		// included): it must not online vCPUs after this resize.
		h.stopOnliningVCPUs(id)
		if n < old {
			if err := onlineGuestVCPUs(ctx, dom, n); err != nil {
				return fmt.Errorf("take vCPUs of VM %s offline (%d to %d) through its guest agent: %w: %w", name, old, n, err, ports.ErrFailedPrecondition)
			}
		} else {
			onlineLater = true
		}
	}
	if err := dom.SetVcpusFlags(uint(n), libvirt.DOMAIN_VCPU_CONFIG); err != nil {
		return libvirtError(fmt.Sprintf("set the vCPUs of domain %s to %d for its next boot", name, n), err)
	}
	h.mu.Lock()
	r.Spec.VCPUs = n
	if err := h.saveRecord(r); err != nil {
		r.Spec.VCPUs = old // the record on disk still says so
		h.mu.Unlock()
		return err
	}
	h.mu.Unlock()
	if onlineLater {
		// The guest's kernel learns of a hot-plugged vCPU through ACPI,
		// which a busy TCG guest may handle a minute later; its agent may
		// be busy with execs meanwhile. The resize returns now and the
		// agent onlines them when it can.
		h.onlineVCPUsLater(r, n, log)
	}
	log.Info("vCPUs set")
	return nil
}

// onlineGuestVCPUs waits until the guest has seen at least n vCPUs (a
// hot-plugged CPU reaches the guest's kernel through ACPI a little after
// QEMU added it) and has its agent keep exactly n of them online.
func onlineGuestVCPUs(ctx context.Context, dom *libvirt.Domain, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		err := setGuestVCPUs(dom, n)
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// setGuestVCPUs has the guest's agent keep n vCPUs online once the guest
// sees n.
func setGuestVCPUs(dom *libvirt.Domain, n int) error {
	gv, err := dom.GetGuestVcpus(0)
	if err != nil {
		return err
	}
	if seen := countTrue(gv.Vcpus); seen < n {
		return fmt.Errorf("the guest sees %d of its %d vCPUs", seen, n)
	}
	return dom.SetVcpusFlags(uint(n), libvirt.DOMAIN_VCPU_GUEST)
}

// vcpuOnlineWindow bounds how long hot-plugged vCPUs are waited for in the
// background, and vcpuOnlineRetry how often the guest is asked meanwhile.
const (
	vcpuOnlineWindow = 5 * time.Minute
	vcpuOnlineRetry  = time.Second
)

// onlineVCPUsLater has the guest's agent bring n vCPUs online in the
// background, retrying until it has, the VM is shut off or removed,
// another resize or close supersedes it, or vcpuOnlineWindow ends.
func (h *Hypervisor) onlineVCPUsLater(r *record, n int, log logrus.FieldLogger) {
	id := r.Spec.ID
	h.stopOnliningVCPUs(id)
	ctx, cancel := context.WithTimeout(context.Background(), vcpuOnlineWindow)
	job := &onlining{cancel: cancel, done: make(chan struct{})}
	h.mu.Lock()
	if h.onlining == nil {
		h.onlining = map[string]*onlining{}
	}
	h.onlining[id] = job
	h.mu.Unlock()
	go func() {
		defer close(job.done)
		defer cancel()
		defer func() {
			h.mu.Lock()
			if h.onlining[id] == job {
				delete(h.onlining, id)
			}
			h.mu.Unlock()
		}()
		var err error
		for attempt := 0; ; attempt++ {
			if attempt > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(vcpuOnlineRetry):
				}
			}
			if ctx.Err() != nil {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					log.WithError(err).Warn("vCPUs hot-plugged; the guest's agent did not bring them online (the guest may do it itself)")
				}
				return
			}
			h.mu.Lock()
			gone := h.records[id] != r
			h.mu.Unlock()
			if gone {
				return // removed (a record of its own for a redefined VM)
			}
			var dom *libvirt.Domain
			if dom, err = h.agentDomain(r); err != nil {
				continue
			}
			state, _, serr := dom.GetState()
			switch {
			case serr == nil && (state == libvirt.DOMAIN_SHUTOFF || state == libvirt.DOMAIN_CRASHED || state == libvirt.DOMAIN_SHUTDOWN):
				dom.Free()
				log.WithField("state", state).Info("the VM stopped before its hot-plugged vCPUs came online")
				return
			case serr == nil && state != libvirt.DOMAIN_RUNNING:
				err = fmt.Errorf("the VM is not running (state %d)", state) // paused: later
			default:
				err = setGuestVCPUs(dom, n)
			}
			dom.Free()
			if err == nil {
				log.WithField("attempts", attempt+1).Info("hot-plugged vCPUs online")
				return
			}
		}
	}()
}

// onlining is one background onlining of hot-plugged vCPUs; done closes
// when its goroutine has returned (its last agent call over).
type onlining struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stopOnliningVCPUs cancels a background onlining of VM id's vCPUs and
// waits until it has ended. Called without h.mu.
func (h *Hypervisor) stopOnliningVCPUs(id string) {
	h.mu.Lock()
	job := h.onlining[id]
	delete(h.onlining, id)
	h.mu.Unlock()
	if job != nil {
		job.cancel()
		<-job.done
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
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
		if err := h.endPrelaunch(r); err != nil {
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

// vmUUIDSpace derives the UUIDs of VMs whose pods ask for none from their
// IDs (the core did, before the hypervisor chose).
var vmUUIDSpace = uuid.MustParse("a3f0c1de-5b2c-4e1f-9d53-6c1b7e3d9a10")

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
	h.mu.Lock()
	conn, ids := h.conn, h.callbackIDs
	h.conn, h.ready = nil, false
	var jobs []*onlining
	for id, job := range h.onlining {
		job.cancel()
		jobs = append(jobs, job)
		delete(h.onlining, id)
	}
	quit, dispatched := h.quit, h.dispatched
	h.quit = nil
	p := h.pool
	h.mu.Unlock()
	for _, job := range jobs {
		<-job.done // an agent call in flight ends at its own timeout
	}
	if p != nil && p.quit != nil {
		select {
		case <-p.quit:
		default:
			close(p.quit)
		}
		<-p.done
	}
	if conn != nil {
		h.hangUp(conn, ids)
	}
	h.agentMu.Lock()
	if h.agentConn != nil {
		h.agentConn.Close() // calls still in flight hold their domains' references
		h.agentConn = nil
	}
	h.agentMu.Unlock()
	// No event or resync applies (and writes a record) after close.
	if quit != nil {
		close(quit)
		<-dispatched
	}
}

func watchdogModel(r *record) string {
	if r.Spec.Watchdog == nil {
		return ""
	}
	return r.Spec.Watchdog.Model
}
