package libvirt

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

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

	ConsoleOffset int64  `json:"consoleOffset,omitempty"`
	ConsoleInode  uint64 `json:"consoleInode,omitempty"`

	// runs counts the VM's ends seen by this process: a console stream
	// opened during one run is closed when that run ends, not a later one.
	runs uint64
}

func (r *record) status() ports.VMStatus {
	return ports.VMStatus{ID: r.Spec.ID, State: r.State, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
		ExitCode: r.ExitCode, Reason: r.Reason, Message: r.Message}
}

var idRE = regexp.MustCompile(`^[0-9a-f]{8,64}$`)

func validID(id string) error {
	if !idRE.MatchString(id) {
		return &ports.InvalidError{Field: "VM ID", Value: id, Allowed: "8 to 64 lowercase hex digits"}
	}
	return nil
}

func (h *Hypervisor) recordPath(id string) string {
	return filepath.Join(h.stateDir, "records", id+".json")
}

// saveRecord writes a record atomically; callers hold h.mu.
func (h *Hypervisor) saveRecord(r *record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	p := h.recordPath(r.Spec.ID)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("save VM record: %w", err)
	}
	return os.Rename(tmp, p)
}

func (h *Hypervisor) deleteRecord(id string) error {
	if err := os.Remove(h.recordPath(id)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// loadRecords reads every saved record.
func (h *Hypervisor) loadRecords() (map[string]*record, error) {
	dir := filepath.Join(h.stateDir, "records")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
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
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		r := &record{}
		if err := json.Unmarshal(data, r); err != nil {
			return nil, fmt.Errorf("VM record %s: %w", e.Name(), err)
		}
		out[r.Spec.ID] = r
	}
	return out, nil
}
