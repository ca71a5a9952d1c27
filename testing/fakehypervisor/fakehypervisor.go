// Package fakehypervisor is an in-memory hypervisor for tests: it drives the
// core's VM lifecycle without libvirt. Served as a plugin process (see
// testing/fakeplugin) it persists its VMs in its state directory, so that a
// restart of the plugin, like a restart of libvirt's client, loses no VM.
//
// It is a test double only; it runs no guest.
package fakehypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/crilog"
	"github.com/virtlet/virtlet/ports"
)

// BootMarker is the last console line a fake VM prints when it starts.
const BootMarker = "@@FAKE-VM-BOOTED"

// Hypervisor implements ports.Hypervisor in memory.
type Hypervisor struct {
	mu        sync.Mutex
	vms       map[string]*vm
	subs      map[chan ports.VMStatus]struct{}
	sent      uint64 // state changes sent to watchers, each counted once a watcher
	reopened  map[string]int
	stateFile string
	now       func() time.Time

	// Fail makes the named method ("Define", "Start", ...) return the error.
	Fail map[string]error
	// GuestIgnoresShutdown makes guests ignore ACPI shutdown requests, so
	// Stop must force them off when the timeout expires.
	GuestIgnoresShutdown bool
	// NoAgent makes guests have no guest agent: GuestExec fails.
	NoAgent bool
	// Pool makes Define claim each VM from an imaginary pool of
	// pre-launched VMs, as a hypervisor with a pool does: the VM keeps
	// the pool's name and UUID, and is prelaunched until its first Start
	// (or until WriteFiles writes its root disk).
	Pool bool
	// Log receives a line per VM started, tagged with the VM's name as
	// real plugins tag theirs (nil: none).
	Log logrus.FieldLogger

	consoles   map[string]*console
	claimed    int // pool VMs claimed (Pool)
	execs      int
	running    map[string]int // guest commands in progress, by VM
	statsCalls int
	vnc        net.Listener
}

type vm struct {
	Spec   ports.VMSpec   `json:"spec"`
	Status ports.VMStatus `json:"status"`
	// Files lists what WriteFiles wrote, as "path mode size" (never the
	// data, which may be secret).
	Files []string `json:"files,omitempty"`
	// PoolName is the name of the pool VM it was claimed from (Pool).
	PoolName    string `json:"poolName,omitempty"`
	Prelaunched bool   `json:"prelaunched,omitempty"`
}

// status is the VM's status with the identity the fake gave it.
func (v *vm) status() ports.VMStatus {
	st := v.Status
	switch {
	case v.PoolName != "":
		st.Name, st.UUID = v.PoolName, uuid.NewSHA1(uuid.NameSpaceOID, []byte(v.PoolName)).String()
	case v.Spec.UUID == "":
		// The hypervisor picks a VM's UUID when the pod asks for none.
		st.UUID = uuid.NewSHA1(uuid.NameSpaceOID, []byte(v.Spec.ID)).String()
	}
	st.Prelaunched = v.Prelaunched
	return st
}

// New returns an empty in-memory hypervisor.
func New() *Hypervisor {
	return &Hypervisor{vms: map[string]*vm{}, subs: map[chan ports.VMStatus]struct{}{}, reopened: map[string]int{}, now: time.Now, Fail: map[string]error{}}
}

// Open returns a hypervisor persisted in dir, loading the VMs saved there.
func Open(dir string) (*Hypervisor, error) {
	h := New()
	h.stateFile = filepath.Join(dir, "vms.json")
	data, err := os.ReadFile(h.stateFile)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return h, nil
	case err != nil:
		return nil, fmt.Errorf("read fake hypervisor state: %w", err)
	}
	if err := json.Unmarshal(data, &h.vms); err != nil {
		return nil, fmt.Errorf("decode fake hypervisor state %s: %w", h.stateFile, err)
	}
	return h, nil
}

// Config is the fake's plugin configuration (manifest `config`).
type Config struct {
	// GuestIgnoresShutdown: see Hypervisor.GuestIgnoresShutdown.
	GuestIgnoresShutdown bool `json:"guestIgnoresShutdown,omitempty"`
	// NoAgent: see Hypervisor.NoAgent.
	NoAgent bool `json:"noAgent,omitempty"`
}

// Configure loads the VMs persisted in the plugin's state directory, so
// that a restarted plugin knows the VMs its previous process defined.
func (h *Hypervisor) Configure(ctx context.Context, cfg ports.PluginConfig) error {
	var c Config
	if err := cfg.Decode(&c); err != nil {
		return fmt.Errorf("fake hypervisor: %w", err)
	}
	loaded, err := Open(cfg.StateDir)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.vms, h.stateFile, h.GuestIgnoresShutdown, h.NoAgent = loaded.vms, loaded.stateFile, c.GuestIgnoresShutdown, c.NoAgent
	return nil
}

// PluginInfo describes the fake when served as a plugin.
func (h *Hypervisor) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "fake-hypervisor", Kind: ports.KindHypervisor, Version: "0.0.0-test", Handles: []string{"fake"}}
}

func (h *Hypervisor) fail(method string) error {
	if err := h.Fail[method]; err != nil {
		return fmt.Errorf("fake %s: %w", method, err)
	}
	return nil
}

// save persists the VMs; callers hold h.mu.
func (h *Hypervisor) save() error {
	if h.stateFile == "" {
		return nil
	}
	data, err := json.Marshal(h.vms)
	if err != nil {
		return err
	}
	tmp := h.stateFile + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("save fake hypervisor state: %w", err)
	}
	return os.Rename(tmp, h.stateFile)
}

// notify sends a state change to the watchers; callers hold h.mu. A
// watcher that does not keep up is cut off, as the port asks.
func (h *Hypervisor) notify(st ports.VMStatus) {
	for ch := range h.subs {
		select {
		case ch <- st:
			h.sent++
		default:
			delete(h.subs, ch)
			close(ch)
		}
	}
}

func (h *Hypervisor) Capabilities(ctx context.Context) (ports.HypervisorCapabilities, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("Capabilities"); err != nil {
		return ports.HypervisorCapabilities{}, err
	}
	return ports.HypervisorCapabilities{Name: "fake", Version: "0.0.0-test", Accelerator: "none",
		Details: map[string]string{"vms": fmt.Sprint(len(h.vms))}}, nil
}

func (h *Hypervisor) Define(ctx context.Context, spec ports.VMSpec) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("Define"); err != nil {
		return err
	}
	switch {
	case spec.ID == "" || spec.Name == "":
		return fmt.Errorf("fake define: VM needs an ID and a name: %w", ports.ErrInvalidArgument)
	case spec.VCPUs < 1 || spec.MemoryBytes <= 0:
		return fmt.Errorf("fake define %s: %d vCPUs, %d bytes: %w", spec.Name, spec.VCPUs, spec.MemoryBytes, ports.ErrInvalidArgument)
	}
	spec = spec.WithoutSecrets() // like a real hypervisor, keep no key in a record
	if old, ok := h.vms[spec.ID]; ok {
		if reflect.DeepEqual(old.Spec, spec) {
			return nil
		}
		return fmt.Errorf("fake define %s: %w", spec.Name, ports.ErrAlreadyExists)
	}
	for _, other := range h.vms {
		if other.Spec.Name == spec.Name || (spec.UUID != "" && other.Spec.UUID == spec.UUID) {
			return fmt.Errorf("fake define %s: name or UUID used by %s: %w", spec.Name, other.Spec.ID, ports.ErrAlreadyExists)
		}
	}
	v := &vm{Spec: spec, Status: ports.VMStatus{ID: spec.ID, State: ports.VMDefined}}
	if h.Pool && spec.UUID == "" { // a pod asking for a UUID starts cold
		h.claimed++
		v.PoolName, v.Prelaunched = fmt.Sprintf("virtlet-pool-fake-%d", h.claimed), true
	}
	h.vms[spec.ID] = v
	return h.save()
}

func (h *Hypervisor) Start(ctx context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("Start"); err != nil {
		return err
	}
	v, ok := h.vms[id]
	if !ok {
		return fmt.Errorf("fake start %s: %w", id, ports.ErrNotFound)
	}
	if v.Status.State == ports.VMRunning {
		return nil
	}
	if err := h.console(v.Spec); err != nil {
		return err
	}
	v.Status = ports.VMStatus{ID: id, State: ports.VMRunning, StartedAt: h.now()}
	v.Prelaunched = false
	if err := h.save(); err != nil {
		return err
	}
	h.notify(v.Status)
	if h.Log != nil {
		h.Log.WithField("vm", v.Spec.Name).Info("fake VM started")
	}
	return nil
}

// console writes the fake boot messages to the VM's CRI log.
func (h *Hypervisor) console(spec ports.VMSpec) error {
	if spec.ConsoleLogPath == "" {
		return nil
	}
	w, err := crilog.Open(spec.ConsoleLogPath, "stdout")
	if err != nil {
		return fmt.Errorf("fake start %s: console: %w", spec.Name, err)
	}
	fmt.Fprintf(w, "fake VM %s booting: %d vCPUs, %d MiB\n", spec.Name, spec.VCPUs, spec.MemoryBytes>>20)
	for _, d := range spec.Disks {
		fmt.Fprintf(w, "disk %s on %s bus\n", d.Name, d.Bus)
	}
	fmt.Fprintln(w, BootMarker)
	return w.Close()
}

func (h *Hypervisor) Stop(ctx context.Context, id string, timeout time.Duration) (ports.VMStatus, error) {
	h.mu.Lock()
	if err := h.fail("Stop"); err != nil {
		h.mu.Unlock()
		return ports.VMStatus{}, err
	}
	v, ok := h.vms[id]
	if !ok {
		h.mu.Unlock()
		return ports.VMStatus{}, fmt.Errorf("fake stop %s: %w", id, ports.ErrNotFound)
	}
	if v.Status.State != ports.VMRunning {
		st := v.Status
		h.mu.Unlock()
		return st, nil
	}
	ignores := h.GuestIgnoresShutdown
	h.mu.Unlock()
	if ignores && timeout > 0 {
		// The guest does not react: wait out the grace period.
		t := time.NewTimer(timeout)
		select {
		case <-ctx.Done():
			t.Stop()
			return ports.VMStatus{}, ctx.Err()
		case <-t.C:
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if ignores || timeout == 0 {
		return h.exitLocked(v, 137, "Killed", "forced off")
	}
	return h.exitLocked(v, 0, "Completed", "guest shut down on request")
}

func (h *Hypervisor) exitLocked(v *vm, code int32, reason, msg string) (ports.VMStatus, error) {
	v.Status = ports.VMStatus{ID: v.Spec.ID, State: ports.VMStopped, StartedAt: v.Status.StartedAt,
		FinishedAt: h.now(), ExitCode: code, Reason: reason, Message: msg}
	h.closeConsoleLocked(v.Spec.ID)
	if err := h.save(); err != nil {
		return ports.VMStatus{}, err
	}
	h.notify(v.Status)
	return v.Status, nil
}

// PowerOff simulates the guest powering itself off (exit code 0).
func (h *Hypervisor) PowerOff(id string) error {
	return h.guestExit(id, 0, "Completed", "guest powered off")
}

// Crash simulates a guest crash (exit code 1).
func (h *Hypervisor) Crash(id string) error { return h.guestExit(id, 1, "Crashed", "guest crashed") }

func (h *Hypervisor) guestExit(id string, code int32, reason, msg string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.vms[id]
	if !ok || v.Status.State != ports.VMRunning {
		return fmt.Errorf("fake: VM %s is not running", id)
	}
	_, err := h.exitLocked(v, code, reason, msg)
	return err
}

// Vanish drops a VM behind the runtime's back, as a wiped hypervisor would.
func (h *Hypervisor) Vanish(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.vms, id)
	h.save()
}

func (h *Hypervisor) Undefine(ctx context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("Undefine"); err != nil {
		return err
	}
	if _, ok := h.vms[id]; !ok {
		return fmt.Errorf("fake undefine %s: %w", id, ports.ErrNotFound)
	}
	delete(h.vms, id)
	return h.save()
}

func (h *Hypervisor) Status(ctx context.Context, id string) (ports.VMStatus, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("Status"); err != nil {
		return ports.VMStatus{}, err
	}
	v, ok := h.vms[id]
	if !ok {
		return ports.VMStatus{}, fmt.Errorf("fake status %s: %w", id, ports.ErrNotFound)
	}
	return v.status(), nil
}

func (h *Hypervisor) List(ctx context.Context) ([]ports.VMStatus, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("List"); err != nil {
		return nil, err
	}
	out := make([]ports.VMStatus, 0, len(h.vms))
	for _, v := range h.vms {
		out = append(out, v.status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Spec returns the spec a VM was defined with.
func (h *Hypervisor) Spec(id string) (ports.VMSpec, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.vms[id]
	if !ok {
		return ports.VMSpec{}, false
	}
	return v.Spec, true
}

func (h *Hypervisor) Watch(ctx context.Context) (<-chan ports.VMStatus, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("Watch"); err != nil {
		return nil, err
	}
	ch := make(chan ports.VMStatus, 64)
	h.subs[ch] = struct{}{}
	go func() {
		<-ctx.Done()
		h.mu.Lock()
		if _, ok := h.subs[ch]; ok {
			delete(h.subs, ch)
			close(ch)
		}
		h.mu.Unlock()
	}()
	return ch, nil
}

// Sent is how many state changes the fake has sent to its watchers (one
// per watcher that took it).
func (h *Hypervisor) Sent() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sent
}

// Watchers is how many watchers the fake has now.
func (h *Hypervisor) Watchers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// ReopenLog reopens nothing: the fake writes its console log once, at start.
func (h *Hypervisor) ReopenLog(ctx context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.vms[id]; !ok {
		return fmt.Errorf("fake reopen log %s: %w", id, ports.ErrNotFound)
	}
	h.reopened[id]++
	return nil
}

// SetMemory records the VM's new memory.
func (h *Hypervisor) SetMemory(ctx context.Context, id string, bytes int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("SetMemory"); err != nil {
		return err
	}
	v, ok := h.vms[id]
	if !ok {
		return fmt.Errorf("fake set memory %s: %w", id, ports.ErrNotFound)
	}
	v.Spec.MemoryBytes = bytes
	return h.save()
}

// SetCPULimits records the VM's new CPU limits.
func (h *Hypervisor) SetCPULimits(ctx context.Context, id string, l ports.CPULimits) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("SetCPULimits"); err != nil {
		return err
	}
	v, ok := h.vms[id]
	if !ok {
		return fmt.Errorf("fake set CPU limits %s: %w", id, ports.ErrNotFound)
	}
	v.Spec.CPULimits = l
	return h.save()
}

// SetVCPUs records the VM's new vCPU count, refusing one outside the
// VM's hotplug range as a hypervisor would.
func (h *Hypervisor) SetVCPUs(ctx context.Context, id string, n int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("SetVCPUs"); err != nil {
		return err
	}
	v, ok := h.vms[id]
	if !ok {
		return fmt.Errorf("fake set vCPUs %s: %w", id, ports.ErrNotFound)
	}
	if n < max(v.Spec.MinVCPUs, 1) || n > max(v.Spec.MaxVCPUs, v.Spec.VCPUs) {
		return &ports.InvalidError{Field: "vCPUs", Value: fmt.Sprint(n), Allowed: fmt.Sprintf("%d to %d", max(v.Spec.MinVCPUs, 1), max(v.Spec.MaxVCPUs, v.Spec.VCPUs))}
	}
	v.Spec.VCPUs = n
	return h.save()
}

// WriteFiles records which files a VM's root file system received.
func (h *Hypervisor) WriteFiles(ctx context.Context, id string, files []ports.GuestFile) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("WriteFiles"); err != nil {
		return err
	}
	v, ok := h.vms[id]
	if !ok {
		return fmt.Errorf("fake write files %s: %w", id, ports.ErrNotFound)
	}
	if v.Status.State != ports.VMDefined {
		return fmt.Errorf("fake write files %s: the VM has booted already: %w", id, ports.ErrFailedPrecondition)
	}
	for _, f := range files {
		v.Files = append(v.Files, fmt.Sprintf("%s %04o %d", f.Path, f.Mode.Perm(), len(f.Data)))
	}
	v.Prelaunched = false // its paused process had the disk open
	return h.save()
}

// Files returns what WriteFiles recorded for a VM ("path mode size").
func (h *Hypervisor) Files(id string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if v, ok := h.vms[id]; ok {
		return append([]string(nil), v.Files...)
	}
	return nil
}

// Reopened counts ReopenLog calls for a VM.
func (h *Hypervisor) Reopened(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reopened[id]
}

var _ ports.Hypervisor = (*Hypervisor)(nil)
