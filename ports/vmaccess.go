package ports

import (
	"context"
	"io"
	"time"
)

// The ways to reach a running VM. Each is a small interface a hypervisor
// adapter may implement besides Hypervisor; the plugin client implements
// them all and reports ErrUnimplemented for what its plugin lacks.

// ConsoleOpener attaches viewers to a VM's serial console.
type ConsoleOpener interface {
	// OpenConsole attaches a viewer to the running VM's serial console.
	// Reads return console output from the moment of attaching; writes
	// reach the console's input. Several viewers may be attached at once:
	// each sees all output, and what any of them writes reaches the
	// console. Close detaches this viewer only; the VM keeps running.
	// Reads end with io.EOF when the VM stops. A VM that is not running:
	// ErrFailedPrecondition.
	OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error)
}

// GuestExecer runs commands in a VM's guest through its guest agent.
type GuestExecer interface {
	// GuestExec runs req.Argv in the guest and waits for it to end, at
	// most req.Timeout from its start (0: until ctx ends); a booting
	// guest's agent is waited for up to req.Timeout too, and the start
	// itself is bounded by ctx and the adapter's agent call limit. A
	// guest without a working
	// agent fails quickly with ErrFailedPrecondition. On timeout the result
	// says so (TimedOut) and whether the process was killed; the error is
	// nil: the command ran and the caller decides what a timeout means.
	GuestExec(ctx context.Context, id string, req GuestExecRequest) (GuestExecResult, error)
}

// GuestExecRequest is one command for the guest agent.
type GuestExecRequest struct {
	Argv    []string
	Stdin   []byte
	Timeout time.Duration
	// MaxOutputBytes caps each of stdout and stderr (0: the adapter's
	// default); what is cut is flagged in the result, never dropped
	// silently.
	MaxOutputBytes int
}

// GuestInformer reports what a running guest's agent says of itself.
type GuestInformer interface {
	// GuestInfo asks the guest's agent. A guest without a working agent
	// fails quickly with ErrFailedPrecondition.
	GuestInfo(ctx context.Context, id string) (GuestInfo, error)
}

// GuestInfo is a guest's own account of itself; what its agent does not
// report is empty.
type GuestInfo struct {
	OS         string           `json:"os,omitempty"` // e.g. Debian GNU/Linux 12 (bookworm)
	Kernel     string           `json:"kernel,omitempty"`
	Hostname   string           `json:"hostname,omitempty"`
	TimeZone   string           `json:"timeZone,omitempty"`
	Interfaces []GuestInterface `json:"interfaces,omitempty"`
}

// GuestInterface is a network interface as the guest sees it.
type GuestInterface struct {
	Name      string   `json:"name"`
	MAC       string   `json:"mac,omitempty"`
	Addresses []string `json:"addresses,omitempty"` // CIDR
}

// GuestExecResult is how a guest command ended.
type GuestExecResult struct {
	ExitCode        int32
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
	// TimedOut: the command did not end within the request's timeout.
	TimedOut bool
	// Killed: after the timeout the guest process was killed; KillError
	// says why it could not be when it was not.
	Killed    bool
	KillError string
	PID       int64 // the guest process
}

// StatsReporter reports VMs' resource usage.
type StatsReporter interface {
	// Stats reports the running VMs among ids with one query of the
	// hypervisor; VMs that are not running are left out.
	Stats(ctx context.Context, ids []string) ([]VMStats, error)
}

// VMStats is a running VM's resource usage.
type VMStats struct {
	ID        string
	Timestamp time.Time
	// CPUNanos is the CPU time the VM has used on the host, cumulative.
	CPUNanos uint64
	Memory   MemoryStats
	Disks    []DiskStats
	NICs     []NICStats
}

// MemoryStats is a VM's memory as its balloon device reports it. Each
// group of figures comes with whether it was reported at all: a figure
// that was not is unknown, not zero.
type MemoryStats struct {
	// HostReported: CurrentBytes and RSSBytes are known (the hypervisor
	// may not answer them while the VM's monitor is busy).
	HostReported bool
	// CurrentBytes is the memory the guest has (the balloon's size).
	CurrentBytes uint64
	// RSSBytes is the host memory the VM's process holds.
	RSSBytes uint64
	// GuestReported: the guest's balloon driver reports the three below.
	GuestReported bool
	// AvailableBytes is the memory the guest OS can use; UnusedBytes what
	// it leaves free; CacheBytes what it uses for caches it can drop.
	AvailableBytes, UnusedBytes, CacheBytes uint64
	// FaultsReported: the guest reports its page faults.
	FaultsReported           bool
	MinorFaults, MajorFaults uint64
}

// DiskStats is one disk's I/O and size.
type DiskStats struct {
	Name                  string // the VMSpec's disk name ("root", ...)
	ReadBytes, WriteBytes uint64
	ReadOps, WriteOps     uint64
	// SizesReported: the two below are known.
	SizesReported   bool
	AllocationBytes uint64 // host storage the disk's data takes
	CapacityBytes   uint64 // size the guest sees
}

// NICStats is one NIC's traffic.
type NICStats struct {
	Name                 string // the VMSpec's NIC name (the pod interface, "eth0")
	RxBytes, TxBytes     uint64
	RxErrors, TxErrors   uint64
	RxPackets, TxPackets uint64
}

// VMInspector tells what the hypervisor knows of one VM, for diagnostics.
type VMInspector interface {
	// Diagnose returns the VM's definition and the hypervisor's view of it.
	Diagnose(ctx context.Context, id string) (VMDiagnostics, error)
	// Inspect runs one read-only command of the hypervisor's own tool
	// (virsh for libvirt) against the VM. Commands that could change
	// anything are refused with ErrInvalidArgument naming what is allowed.
	Inspect(ctx context.Context, id string, args []string) (CommandOutput, error)
	// Display reports where the VM's graphical console listens on this
	// host (e.g. VNC at 127.0.0.1:5900).
	Display(ctx context.Context, id string) (Display, error)
}

// VMDiagnostics is the hypervisor's view of a VM.
type VMDiagnostics struct {
	// Definition is the VM as the hypervisor holds it (libvirt: the live
	// domain XML).
	Definition string
	// Details are short facts: state, accelerator, console and agent
	// state, files.
	Details map[string]string
}

// CommandOutput is what a command printed and how it ended.
type CommandOutput struct {
	Stdout, Stderr []byte
	ExitCode       int32
}

// Display is a VM's graphical console.
type Display struct {
	Protocol string // "vnc"
	// Network is "unix" (Address is a socket's path on this host, which
	// only the VM's QEMU and root may open) or "tcp" (host:port).
	Network string
	Address string
}

// Dialer opens connections from the node's network namespace (the node
// reaches its pods' addresses, as Kubernetes' network model requires) and
// to the host's unix sockets.
type Dialer interface {
	// Dial connects to address on network: "tcp" (host:port) or "unix"
	// (a socket's path).
	Dial(ctx context.Context, network, address string) (Conn, error)
}

// Conn is a stream connection that can close its sending half.
type Conn interface {
	io.ReadWriteCloser
	CloseWrite() error
}
