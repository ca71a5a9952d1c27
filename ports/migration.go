package ports

import (
	"context"
	"time"
)

// Live migration of a running VM from one node's daemon to another's. The
// receiving node defines the VM first (VMSpec.Incoming: the migrating
// domain's identity, an empty root overlay over the same image), then the
// source's hypervisor moves the running guest into it. The two daemons
// carry the hypervisors' traffic between them (MigrationPeers): no
// hypervisor listens on the network.

// VMIncoming, set in a VMSpec, makes Define prepare a VM that a live
// migration fills: it takes the migrating domain's name and UUID (a
// running guest keeps them, as its NICs keep their MACs, which the spec's
// NICs already carry), and Start waits for the guest to arrive instead of
// booting one.
type VMIncoming struct {
	Name string `json:"name"`
	UUID string `json:"uuid"`
}

// MigrationEndpoint is where a migration goes: the receiving VM's
// definition (its disks, taps and console on that node) and the local
// sockets the hypervisors' traffic passes through. MemorySocket and
// DisksSocket are paths the two nodes share by name: each node's end of
// the migration uses the same path on its own file system.
type MigrationEndpoint struct {
	DomainXML     string `json:"domainXML"`
	ControlSocket string `json:"controlSocket"`
	MemorySocket  string `json:"memorySocket"`
	DisksSocket   string `json:"disksSocket"`
}

// MigrationRunDir is where a migration's sockets are on both nodes: one
// directory per migration, named by 32 hex digits, holding memory.sock and
// disks.sock (libvirt's run directory is the node's own).
const MigrationRunDir = "/run/libvirt/virtlet-migrate"

// MigrationStats describe a finished live migration. PausedThroughout:
// the guest was paused for the whole copy, not only its last part (a
// hypervisor that cannot track the guest's writes reliably, such as QEMU's
// TCG, copies a paused guest); Downtime is then that whole pause.
type MigrationStats struct {
	Total            time.Duration `json:"total"`
	Downtime         time.Duration `json:"downtime"`
	MemoryBytes      uint64        `json:"memoryBytes"`
	DiskBytes        uint64        `json:"diskBytes"`
	PausedThroughout bool          `json:"pausedThroughout,omitempty"`
}

// VMMigrator live-migrates running VMs. A hypervisor adapter may implement
// it besides Hypervisor; the plugin client implements it and reports
// ErrUnimplemented when its plugin does not.
type VMMigrator interface {
	// MigrationIdentity is what a receiving node needs of running VM id:
	// its domain's name and UUID (its NICs' MACs are in its spec). A VM
	// that cannot be migrated whole (a 9p share, a volume disk) is refused
	// with ErrFailedPrecondition naming what.
	MigrationIdentity(ctx context.Context, id string) (VMIncoming, error)
	// IncomingEndpoint (receiving side) makes the sockets incoming VM id's
	// migration arrives through and returns them with its definition.
	IncomingEndpoint(ctx context.Context, id string) (MigrationEndpoint, error)
	// CheckArrival (receiving side) checks the definition the sending
	// hypervisor asks this node's to run incoming VM id's guest in: its
	// identity and everything of this node in it (files, devices, the
	// emulator, labels) must be the VM's own definition's, so that the
	// sending node decides nothing of this one's; refused with
	// ErrFailedPrecondition naming what differs. It returns the
	// definition to hand this node's hypervisor: the one it checked, as
	// it understood it (what it does not know of is left out).
	CheckArrival(ctx context.Context, id, domainXML string) (string, error)
	// MigrateVM (sending side) moves running VM id's guest, live, into the
	// VM at to: its disks are copied as the guest runs, then its memory,
	// and it pauses only for the last of it. On success VM id has exited
	// with reason Migrated and its domain is gone from this node; on
	// failure it runs on here as before.
	MigrateVM(ctx context.Context, id string, to MigrationEndpoint) (MigrationStats, error)
}

// ReasonMigrated is the exit reason of a VM whose guest moved to another
// node.
const ReasonMigrated = "Migrated"

// MigrationPeer is another node's daemon.
type MigrationPeer struct {
	Node    string // the node's name: its certificate says system:node:<Node>
	Address string // host:port of its migration endpoint
}

// MigrationOffer is what the sending daemon tells the receiving one.
type MigrationOffer struct {
	// ReceivingPodUID is the pod that receives the VM.
	ReceivingPodUID string `json:"receivingPodUID"`
	// SourcePod (namespace/name) and SourcePodUID are the VM's pod now.
	SourcePod    string     `json:"sourcePod"`
	SourcePodUID string     `json:"sourcePodUID"`
	VM           VMIncoming `json:"vm"`
}

// MigrationSession is the sending side's hold on an accepted offer: the
// receiving daemon's endpoint, reached through local sockets that forward
// to it. Finish tells the receiving daemon the outcome and closes it.
type MigrationSession interface {
	Endpoint() MigrationEndpoint
	Finish(err error)
}

// MigrationPeers carries a live migration between daemons.
type MigrationPeers interface {
	// Offer asks to's daemon to receive offer's VM. It fails with
	// ErrNotFound while the receiving pod's VM is not defined there yet.
	// The session's memory and disk sockets are for vmUser alone (the
	// sending VM's hypervisor process connects to them; nil: qemu.conf's
	// one user for every VM, and so for any local user).
	Offer(ctx context.Context, to MigrationPeer, offer MigrationOffer, vmUser *ProcessIdentity) (MigrationSession, error)
}

// MigrationReceiver is the receiving daemon's side (the core): it checks
// an offer from a node and prepares the incoming migration.
type MigrationReceiver interface {
	ReceiveMigration(ctx context.Context, fromNode string, offer MigrationOffer) (IncomingMigration, error)
}

// IncomingMigration is an accepted offer on the receiving side.
type IncomingMigration struct {
	Endpoint MigrationEndpoint
	// Domain is the name the migrating VM keeps.
	Domain string
	// Check vets the definition the sending hypervisor asks this node's
	// to run the guest in, and returns the one to pass on
	// (VMMigrator.CheckArrival).
	Check func(ctx context.Context, domainXML string) (string, error)
	// Done is called once with the outcome the sender reports (or the
	// connection's loss).
	Done func(error)
}
