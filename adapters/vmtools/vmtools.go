// Package vmtools is the protocol between virtletctl and the daemon.
// virtletctl reaches the daemon of a VM pod's node the only way a
// Kubernetes user reaches a node: through the pod's exec subresource
// (API server → kubelet → CRI Exec → the daemon's streaming server). Exec
// commands whose first word starts with Prefix are Virtlet's own: the
// daemon serves them itself, about that pod's VM only, and never passes
// them to the guest. Whoever may exec into the pod may use them, and they
// show nothing of other pods.
package vmtools

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// Prefix marks Virtlet's own exec commands (no guest program is named
// like this).
const Prefix = "virtlet.cloud:"

// The commands.
const (
	// Version prints the daemon's version (JSON VersionInfo).
	Version = Prefix + "version"
	// Diag prints diagnostics of the pod's VM and its node's daemon (JSON
	// Diagnostics).
	Diag = Prefix + "diag"
	// DiagNode prints the node's diagnostics (JSON NodeDiagnostics): its
	// interfaces, routes, processes and network namespaces, libvirt's
	// logs, and every Virtlet pod's network namespace and QEMU log. They
	// show every pod of the node, and the right to exec into one pod is
	// no right to see them: the daemon serves them only when its operator
	// turned diagNodeData on.
	DiagNode = Prefix + "diag-node"
	// Virsh runs a read-only virsh command against the pod's VM: the
	// arguments follow, the domain is added by the daemon.
	Virsh = Prefix + "virsh"
	// VNC connects the exec's stdin and stdout to the VM's VNC display.
	VNC = Prefix + "vnc"
	// Status prints the VM's state and the guest's own account of itself
	// from its agent (JSON VMStatus).
	Status = Prefix + "status"
	// Stop halts the pod's VM and keeps its container (run strategies:
	// README). An optional argument is the grace period in seconds
	// before the VM is forced off (default DefaultGracePeriod).
	Stop = Prefix + "stop"
	// Start boots a halted VM.
	Start = Prefix + "start"
	// Restart power-cycles the VM: a stop (same argument) and a start.
	Restart = Prefix + "restart"
	// MigrationSource prints what a receiving pod's VirtletMigrateFrom
	// says of the pod's VM (JSON annotations.MigrationSource, without the
	// node, which virtletctl adds), once the VM is one a migration moves.
	MigrationSource = Prefix + "migration-source"
	// Migrate live-migrates the pod's VM into the receiving pod: its
	// arguments are that pod's UID, its node's name and the node's address;
	// it prints the migration's figures (JSON ports.MigrationStats).
	Migrate = Prefix + "migrate"
)

// DefaultGracePeriod is how long Stop and Restart wait for the guest to
// shut down after the ACPI power button before forcing the VM off:
// kubelet's default termination grace period.
const DefaultGracePeriod = 30 * time.Second

// Commands lists the commands, for help and errors.
var Commands = []string{Version, Diag, DiagNode, Virsh, VNC, Status, Stop, Start, Restart, MigrationSource, Migrate}

// IsCommand reports whether cmd is one of Virtlet's own commands.
func IsCommand(cmd []string) bool {
	return len(cmd) > 0 && strings.HasPrefix(cmd[0], Prefix)
}

// VersionInfo is the daemon's answer to Version.
type VersionInfo struct {
	Version string `json:"version"`
}

// Diagnostics is the daemon's answer to Diag.
type Diagnostics struct {
	Node      string    `json:"node"`
	Version   string    `json:"version"`
	Collected time.Time `json:"collected"`
	// Status is the runtime's readiness (the CRI Status conditions).
	Status json.RawMessage `json:"status"`
	// Plugins: each plugin's name, kind, version, state, restarts.
	Plugins json.RawMessage `json:"plugins"`
	// Records are the daemon's records of the pod and its VMs.
	Records json.RawMessage `json:"records"`
	// VMs: the hypervisor's view of each VM (definition, details), by
	// container ID.
	VMs map[string]VMInfo `json:"vms"`
	// PluginLogs are the plugins' recent log lines about this pod or about
	// no pod in particular.
	PluginLogs []LogLine `json:"pluginLogs"`
	// Files are what the node shows of this pod alone: its network
	// namespace's interfaces and routes, its VMs' QEMU logs.
	Files    []File   `json:"files,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

// NodeDiagnostics is the daemon's answer to DiagNode.
type NodeDiagnostics struct {
	Node      string    `json:"node"`
	Version   string    `json:"version"`
	Collected time.Time `json:"collected"`
	// Files: ip-a.txt, ip-r.txt, ps.txt, netns.txt,
	// netns/<name>/ip-{a,r}.txt, libvirt/libvirtd.log,
	// libvirt/qemu/<domain>.log.
	Files    []File   `json:"files"`
	Problems []string `json:"problems,omitempty"`
}

// File is one file read from the node: a listing (`ip a`) or the end of a
// log, its secrets redacted.
type File struct {
	// Name is a relative, slash-separated path.
	Name    string `json:"name"`
	Content string `json:"content"`
	// Truncated: Content holds part of the file's Size bytes, and says
	// at its start or end where it was cut.
	Truncated bool  `json:"truncated,omitempty"`
	Size      int64 `json:"size,omitempty"`
}

// FilesOf converts a node inspector's files.
func FilesOf(files []ports.NodeFile) []File {
	out := make([]File, 0, len(files))
	for _, f := range files {
		out = append(out, File{Name: f.Name, Content: string(f.Data), Truncated: f.Truncated, Size: f.Size})
	}
	return out
}

// VMInfo is the hypervisor's view of one VM.
type VMInfo struct {
	Definition string            `json:"definition"`
	Details    map[string]string `json:"details,omitempty"`
}

// LogLine is one log entry of a plugin.
type LogLine struct {
	Time    time.Time         `json:"time"`
	Plugin  string            `json:"plugin"`
	Level   string            `json:"level"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields,omitempty"`
}

// VMStatus is the daemon's answer to Status.
type VMStatus struct {
	Pod       string    `json:"pod"`
	VM        string    `json:"vm"`
	State     string    `json:"state"`
	StartedAt time.Time `json:"startedAt,omitempty"`
	// HaltedAt is when the VM was halted (virtletctl stop), while it is.
	HaltedAt    time.Time `json:"haltedAt,omitempty"`
	VCPUs       int       `json:"vcpus"`
	MemoryBytes int64     `json:"memoryBytes"`
	// Guest is what the guest's agent says; GuestError why it says nothing.
	Guest      *ports.GuestInfo `json:"guest,omitempty"`
	GuestError string           `json:"guestError,omitempty"`
}
