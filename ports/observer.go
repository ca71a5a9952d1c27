package ports

import "time"

// Observer hears what the core measures while it works: how long the
// steps of a VM's life take and how image pulls end. The daemon's metrics
// adapter implements it; the core knows nothing of how it is exported.
// Calls come from the use cases themselves, so an implementation must be
// quick, must not block and must be safe for concurrent use.
type Observer interface {
	// VMPhase reports a step of a VM pod's creation or start that
	// succeeded, and how long it took.
	VMPhase(phase VMPhase, took time.Duration)
	// ImagePull reports a pull that ended, downloaded or failed.
	ImagePull(p ImagePull)
}

// MigrationObserver, when an Observer implements it, is told of each
// live migration that moved a VM away from this node.
type MigrationObserver interface {
	Migration(st MigrationStats)
}

// VMPhase names a step of a VM pod's creation or start.
type VMPhase string

const (
	PhaseNetwork    VMPhase = "network"     // RunPodSandbox: the pod's network set up
	PhaseVolumes    VMPhase = "volumes"     // CreateContainer: every volume prepared by its plugin
	PhaseCloudInit  VMPhase = "cloud_init"  // CreateContainer: cloud-init data built and its medium made
	PhaseDefine     VMPhase = "define"      // CreateContainer: the VM defined by the hypervisor
	PhaseWriteFiles VMPhase = "write_files" // CreateContainer: VirtletFilesFromDataSource written
	PhaseStart      VMPhase = "start"       // StartContainer: the hypervisor started the VM
	// A VM claimed from the hypervisor's pool of pre-launched VMs meets
	// these in place of define and start.
	PhaseClaim  VMPhase = "claim"  // CreateContainer: a pre-launched VM claimed, the pod's devices plugged in
	PhaseResume VMPhase = "resume" // StartContainer: the claimed VM resumed
)

// VMPhases lists the phases in the order a VM pod meets them.
var VMPhases = []VMPhase{PhaseNetwork, PhaseVolumes, PhaseCloudInit, PhaseDefine, PhaseClaim, PhaseWriteFiles, PhaseStart, PhaseResume}

// ImagePull is one image pull's outcome. Concurrent pulls of one image
// share a download and are reported once.
type ImagePull struct {
	// Scheme is the location's scheme or transport (https, docker, ...):
	// which image plugin served it; empty when the pull failed before a
	// location was known.
	Scheme string
	// Bytes is what was downloaded (the image's size; 0 on failure).
	Bytes int64
	// Took is the pull's duration, download and storing.
	Took time.Duration
	// Failure is empty for a pull that succeeded, else its class.
	Failure PullFailure
}

// PullFailure classes why a pull failed, coarsely enough to count.
type PullFailure string

const (
	PullInvalidName  PullFailure = "invalid_name"  // the name or its translation was refused
	PullNoPlugin     PullFailure = "no_plugin"     // no image plugin handles the location
	PullNotFound     PullFailure = "not_found"     // the source has no such image
	PullUnavailable  PullFailure = "unavailable"   // the source or the image plugin could not serve now
	PullInvalidImage PullFailure = "invalid_image" // the data is not a VM disk, or not the pinned digest
	PullTimeout      PullFailure = "timeout"       // the operation timeout ran out
	PullCanceled     PullFailure = "canceled"      // the daemon gave up (shutting down)
	PullStore        PullFailure = "store"         // the image store could not keep it
	PullOther        PullFailure = "other"
)

// PullFailures lists every class.
var PullFailures = []PullFailure{PullInvalidName, PullNoPlugin, PullNotFound, PullUnavailable, PullInvalidImage,
	PullTimeout, PullCanceled, PullStore, PullOther}
