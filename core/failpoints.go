package core

// Failpoints name the steps between a use case's side effects: the places
// where a crash leaves the most to recover. Options.Failpoint is called at
// each; the crash-matrix tests build a daemon whose hook kills it there
// (cmd/virtlet, build tag failpoints). A production daemon has no hook.
const (
	FPSandboxRecorded   = "run-sandbox/recorded"   // pending record written; no network yet
	FPSandboxNetworked  = "run-sandbox/networked"  // network set up; not recorded ready
	FPCreateRecorded    = "create/recorded"        // creating record written; nothing made
	FPCreateVolumes     = "create/volumes-ready"   // volumes prepared; no media, no domain
	FPCreateMedia       = "create/media-built"     // cloud-init media made; no domain
	FPCreateDefined     = "create/defined"         // domain defined; record still creating
	FPStartStarted      = "start/started"          // VM running; record says created
	FPStopStopped       = "stop/stopped"           // VM off; record says running
	FPRemoveReleased    = "remove/released"        // domain, volumes and media gone; record stays
	FPStopSandboxDown   = "stop-sandbox/torn-down" // network gone; record says ready
	FPRemoveSandboxVMs  = "remove-sandbox/vms-removed"
	FPRemoveSandboxDown = "remove-sandbox/torn-down" // network gone; record stays
	FPPullFetched       = "pull/fetched"             // image data downloaded; not stored
	FPPullStored        = "pull/stored"              // image data stored; not indexed
	FPRemoveImageForgot = "remove-image/forgotten"   // index forgets the image; its data stays
)

// Failpoints lists every failpoint, in the order a pod's life meets them.
var Failpoints = []string{
	FPPullFetched, FPPullStored,
	FPSandboxRecorded, FPSandboxNetworked,
	FPCreateRecorded, FPCreateVolumes, FPCreateMedia, FPCreateDefined,
	FPStartStarted, FPStopStopped, FPRemoveReleased,
	FPStopSandboxDown, FPRemoveSandboxVMs, FPRemoveSandboxDown,
	FPRemoveImageForgot,
}

func (r *shared) failpoint(name string) {
	if f := r.opts.Failpoint; f != nil {
		f(name)
	}
}
