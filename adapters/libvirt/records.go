package libvirt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/ports"
)

// record is what the plugin remembers of a VM beyond libvirt's domain:
// the spec it was defined from, the files made for it, its exit status
// (libvirt keeps only the shutoff reason) and the console log position.
type record struct {
	Spec       ports.VMSpec      `json:"spec"`
	DiskPaths  map[string]string `json:"diskPaths"`
	ConsoleLog string            `json:"consoleLog"`
	// Secrets are the UUIDs of the libvirt secrets of network disks.
	Secrets map[string]string `json:"secrets,omitempty"`

	State      ports.VMState `json:"state"`
	StartedAt  time.Time     `json:"startedAt,omitempty"`
	FinishedAt time.Time     `json:"finishedAt,omitempty"`
	ExitCode   int32         `json:"exitCode,omitempty"`
	Reason     string        `json:"reason,omitempty"`
	Message    string        `json:"message,omitempty"`

	// StopRequested: a Stop is in progress; ForcedAfter: it ran out of time.
	StopRequested bool          `json:"stopRequested,omitempty"`
	ForcedAfter   time.Duration `json:"forcedAfter,omitempty"`
	Crashed       bool          `json:"crashed,omitempty"`
	// Watchdog is the action of a watchdog that fired and stops the VM.
	Watchdog string `json:"watchdog,omitempty"`

	ConsoleOffset int64  `json:"consoleOffset,omitempty"`
	ConsoleInode  uint64 `json:"consoleInode,omitempty"`

	// Asked is what the VM's spec asked for when the record's spec names
	// the domain otherwise: a VM claimed from the pool runs in the pool
	// domain, under its name, UUID and user; a spec without a UUID gets
	// one derived from the VM's ID.
	Asked *vmIdentity `json:"asked,omitempty"`
	// Claim is the VM's claim of a pool domain: claiming while it is
	// being plugged in (a crash then destroys the domain), claimed once
	// it is the VM's.
	Claim claimState `json:"claim,omitempty"`
	// Prelaunched: the claimed domain is still paused before its first
	// instruction; Start resumes it.
	Prelaunched bool `json:"prelaunched,omitempty"`
	// RestoreState, until a restored VM's first start, is the checkpoint's
	// state Start resumes its guest from.
	RestoreState string `json:"restoreState,omitempty"`
	// CheckpointPaused: a checkpoint paused the guest and has not resumed
	// it yet; a plugin that starts (or reconnects) and finds the domain
	// paused resumes it (the checkpoint was cut short).
	CheckpointPaused bool `json:"checkpointPaused,omitempty"`
	// Incoming: the VM waits for a live migration to bring its guest;
	// IncomingDir holds the sockets the migration's streams arrive on.
	Incoming    bool   `json:"incoming,omitempty"`
	IncomingDir string `json:"incomingDir,omitempty"`

	// runs counts the VM's ends seen by this process: a console stream
	// opened during one run is closed when that run ends, not a later one.
	runs uint64
	// seq counts the changes of State (and of a Start in progress): what
	// libvirt said while h.mu was not held applies only if none happened
	// since.
	seq uint64
}

func (r *record) status() ports.VMStatus {
	return ports.VMStatus{ID: r.Spec.ID, State: r.State, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
		ExitCode: r.ExitCode, Reason: r.Reason, Message: r.Message, Name: r.Spec.Name, UUID: r.Spec.UUID, Prelaunched: r.Prelaunched}
}

// vmIdentity is what names a VM's domain and runs its QEMU.
type vmIdentity struct {
	Name  string                 `json:"name"`
	UUID  string                 `json:"uuid,omitempty"`
	RunAs *ports.ProcessIdentity `json:"runAs,omitempty"`
}

type claimState string

const (
	claiming claimState = "claiming"
	claimed  claimState = "claimed"
)

// definedFrom reports whether spec is the one the record was defined
// from: the same spec, but for the identity the plugin gave the VM.
func (r *record) definedFrom(spec ports.VMSpec) bool {
	spec = spec.WithoutSecrets()
	if a := r.Asked; a != nil {
		if !reflect.DeepEqual(*a, vmIdentity{Name: spec.Name, UUID: spec.UUID, RunAs: spec.RunAs}) {
			return false
		}
		spec.Name, spec.UUID, spec.RunAs = r.Spec.Name, r.Spec.UUID, r.Spec.RunAs
	}
	return r.Claim != claiming && reflect.DeepEqual(r.Spec, spec)
}

var idRE = regexp.MustCompile(`^[0-9a-f]{8,64}$`)

func validID(id string) error {
	if !idRE.MatchString(id) {
		return &ports.InvalidError{Field: "VM ID", Value: id, Allowed: "8 to 64 lowercase hex digits"}
	}
	return nil
}

// recordStore keeps the records as files, one per VM, below the plugin's
// state directory. It holds no lock: the record it saves is guarded by
// h.mu, which save's callers hold.
type recordStore struct {
	stateDir string
	log      logrus.FieldLogger
}

func (s recordStore) dir() string { return filepath.Join(s.stateDir, "records") }

func (s recordStore) path(id string) string {
	return filepath.Join(s.dir(), id+".json")
}

// save writes a record atomically and durably; callers hold h.mu.
func (s recordStore) save(r *record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path(r.Spec.ID), data, 0o600); err != nil {
		return fmt.Errorf("save VM record: %w", err)
	}
	return nil
}

func (s recordStore) remove(id string) error {
	if err := os.Remove(s.path(id)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// load reads every saved record. One that cannot be read back is set
// aside (see quarantine): the plugin starts with the others.
func (s recordStore) load() (map[string]*record, error) {
	dir := s.dir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for _, d := range []string{dir, s.stateDir} { // records; the accelerator cache
		if removed, err := atomicfile.RemoveTemps(d); err != nil {
			return nil, err
		} else if len(removed) > 0 {
			s.log.WithField("files", removed).Info("removed what interrupted writes left")
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]*record{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		r := &record{}
		if err = json.Unmarshal(data, r); err == nil && validID(r.Spec.ID) != nil {
			err = errors.New("the record holds no valid VM ID")
		}
		if err != nil {
			s.quarantine(p, err)
			continue
		}
		out[r.Spec.ID] = r
	}
	return out, nil
}

// quarantine sets aside a record that cannot be read back. Its VM, if any,
// is then a domain of ours without a record: List reports it and the core
// removes it, as after a crash between defining and recording. The log
// names the file and the parse error, never the content (it may hold
// parts of the VM's spec).
func (s recordStore) quarantine(p string, why error) {
	log := s.log.WithError(why).WithField("path", p)
	aside, err := atomicfile.Quarantine(p, time.Now())
	if err != nil {
		log.WithField("quarantineError", err.Error()).Error("unreadable VM record; could not set it aside, ignoring it")
		return
	}
	log.WithField("quarantinedAs", aside).Error("unreadable VM record set aside; its VM, if any, is left to the core's reconciliation")
}
