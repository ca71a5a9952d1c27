package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core/presets"
	"github.com/virtlet/virtlet/ports"
)

// Deps are the ports the core works through. Hypervisor, ImageFiles and
// Store are required; the rest may be empty, and features needing them then
// fail with an error saying which plugin is missing.
type Deps struct {
	Hypervisor   ports.Hypervisor
	ImageSources map[string]ports.ImageSource // by URL scheme / transport
	ImageFiles   ports.ImageFiles
	Translations ports.ImageTranslations // nil: Virtlet's default rule only
	Store        ports.StateStore
	Network      ports.Network               // nil: pods get no network
	Volumes      map[string]ports.Volumes    // by volume type
	Datasources  map[string]ports.Datasource // by datasource name
	Kube         ports.KubeObjects           // nil: annotations naming ConfigMaps/Secrets fail
	Files        ports.ProjectedFiles        // nil: ConfigMap/Secret volume mounts fail
	VolumeDirs   ports.VolumeDirs            // nil: flexvolume mounts fail
	Dialer       ports.Dialer                // nil: port-forward and the VNC display fail
	Observer     ports.Observer              // nil: nothing is measured
	Node         ports.NodeInspector         // nil: diagnostics hold nothing read from the node
	Checkpoints  ports.CheckpointArchiver    // nil: CheckpointContainer fails
	Migration    ports.MigrationPeers        // nil: VMs are not live-migrated away
}

// Options tune the runtime.
type Options struct {
	// DefaultMemoryBytes is a VM's memory when its container has no memory
	// limit.
	DefaultMemoryBytes int64
	// OperationTimeout bounds slow operations (RunPodSandbox,
	// CreateContainer, PullImage) that keep running after the caller gave up.
	OperationTimeout time.Duration
	// ProbeTimeout bounds the readiness probes of Status.
	ProbeTimeout time.Duration
	Log          logrus.FieldLogger
	Now          func() time.Time
	// Failpoint, when set, is called at each step named in failpoints.go
	// (crash tests only).
	Failpoint func(name string)
	// VMUsers, when set, gives every VM a host user of its own.
	VMUsers *VMUsers
	// Presets are the operator's VM presets (nil: none).
	Presets *presets.Set
	// AllowWatchdogDump lets a pod's watchdog action be "dump": libvirtd
	// then writes the guest's whole memory to the node's disk, as root,
	// each time the guest stops petting its watchdog. Off, such a pod is
	// refused.
	AllowWatchdogDump bool
	// NoMemorySharing keeps every VM's memory pages out of the host's
	// merging (KSM), whatever its pod says (the node's memorySharing off).
	NoMemorySharing bool
	// MaxImageBytes bounds an image's download, MaxVirtualBytes the disk
	// its guest sees (the image's virtual size, a root volume's size);
	// KeepFreeBytes is the space a pull leaves free on the image store's
	// file system. 0: no bound.
	MaxImageBytes, MaxVirtualBytes, KeepFreeBytes int64
}

const (
	// DefaultMemoryBytes is Virtlet's default VM memory: 1 GiB.
	DefaultMemoryBytes = 1 << 30
	// MinMemoryBytes is the least memory a VM is given.
	MinMemoryBytes = 32 << 20
)

// Runtime runs VM pods. It is made of services, each owning its state and
// lock: the pod sandboxes, the VM containers, the images, access to the
// VMs (exec, attach, port-forward, console, power, resize), statistics and
// the reconciler. They share one small store of records (one table per
// kind, each behind its own lock) and a per-pod lock that serialises the
// operations on one VM pod. Lists and statuses never touch a plugin; every
// change is written through to the state store before it is acted on.
//
// Every service's methods take the receiver name r: each is a part of the
// runtime.
type Runtime struct {
	*shared
	*sandboxService
	*vmService
	*imageService
	*volumeService
	*accessService
	*statsService
	*reconciler
}

// shared is what the services share: the dependencies, the records and
// the per-pod lock.
type shared struct {
	deps Deps
	opts Options
	log  logrus.FieldLogger

	sandboxes  *table[Sandbox]
	containers *table[Container]
	images     *table[Image] // by ID
	podLocks   keyedLock     // one operation at a time per sandbox ID
}

// New checks the dependencies and returns a runtime with no records; call
// Load to read the state store.
func New(deps Deps, opts Options) (*Runtime, error) {
	switch {
	case deps.Hypervisor == nil:
		return nil, errors.New("core: no hypervisor")
	case deps.ImageFiles == nil:
		return nil, errors.New("core: no image file store")
	case deps.Store == nil:
		return nil, errors.New("core: no state store")
	}
	if u := opts.VMUsers; u != nil {
		if err := u.Validate(); err != nil {
			return nil, fmt.Errorf("core: VM users: %w", err)
		}
	}
	if opts.DefaultMemoryBytes == 0 {
		opts.DefaultMemoryBytes = DefaultMemoryBytes
	}
	if opts.OperationTimeout == 0 {
		opts.OperationTimeout = 15 * time.Minute
	}
	if opts.ProbeTimeout == 0 {
		opts.ProbeTimeout = 5 * time.Second
	}
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	// Sandboxes and containers share one revision counter: a resync
	// tells a record changed since it listed them by it.
	revision := new(atomic.Uint64)
	sh := &shared{
		deps: deps, opts: opts, log: opts.Log,
		sandboxes: newTable(deps.Store, ports.BucketSandboxes, func(s *Sandbox) string { return s.ID }).
			revisioned(revision, func(s *Sandbox, rev uint64) { s.Revision = rev }),
		containers: newTable(deps.Store, ports.BucketContainers, func(c *Container) string { return c.ID }).
			revisioned(revision, func(c *Container, rev uint64) { c.Revision = rev }),
		images: newTable(deps.Store, ports.BucketImages, func(i *Image) string { return i.ID }),
	}
	images := &imageService{shared: sh}
	volumes := &volumeService{shared: sh}
	vms := &vmService{shared: sh, imgs: images, vols: volumes, ci: &cloudInitService{shared: sh}, undos: make(chan string, 64)}
	sandboxes := &sandboxService{shared: sh, vms: vms}
	rec := &reconciler{shared: sh, pods: sandboxes, vms: vms, synced: make(chan struct{})}
	rec.events.apply, rec.events.log = rec.observe, sh.log
	return &Runtime{
		shared: sh, sandboxService: sandboxes, vmService: vms, imageService: images, volumeService: volumes,
		accessService: &accessService{shared: sh, pods: sandboxes, vms: vms},
		statsService:  &statsService{shared: sh, pods: sandboxes, vms: vms},
		reconciler:    rec,
	}, nil
}

// Load reads every record from the state store into memory.
func (r *Runtime) Load(ctx context.Context) error {
	sandboxes, err := r.sandboxes.load(ctx)
	if err != nil {
		return err
	}
	containers, err := r.containers.load(ctx)
	if err != nil {
		return err
	}
	images, err := r.images.load(ctx)
	if err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"sandboxes": sandboxes, "containers": containers, "images": images}).
		Info("state loaded")
	return r.collectImageFiles(ctx)
}

// detached runs a slow operation so that it completes even if the caller's
// context ends first (kubelet's request timeout): kubelet then retries, and
// the retry, serialised behind the first attempt by the pod lock, finds the
// result instead of creating a second VM.
func (r *shared) detached(ctx context.Context, op func(context.Context) error) error {
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.OperationTimeout)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		done <- op(opCtx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: the operation goes on in the background; a retry returns its result", ctx.Err())
	}
}

// lockPod serialises work on one VM pod.
func (r *shared) lockPod(ctx context.Context, sandboxID string) (func(), error) {
	unlock, err := r.podLocks.lock(ctx, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("wait for other operations on sandbox %s: %w", short(sandboxID), err)
	}
	return unlock, nil
}

// containersOf returns a sandbox's containers, oldest first.
func (r *shared) containersOf(sandboxID string) []*Container {
	out := r.containers.list(func(c *Container) bool { return c.SandboxID == sandboxID })
	slices.SortFunc(out, func(a, b *Container) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// resolveSandbox maps an ID or unique prefix to a full sandbox ID.
func (r *shared) resolveSandbox(id string) (string, bool, error) {
	full, ok, err := r.sandboxes.resolve(id)
	if err != nil {
		return "", false, fmt.Errorf("sandbox: %w: %w", ports.ErrInvalidArgument, err)
	}
	return full, ok, nil
}

// resolveContainer maps an ID or unique prefix to a full container ID.
func (r *shared) resolveContainer(id string) (string, bool, error) {
	full, ok, err := r.containers.resolve(id)
	if err != nil {
		return "", false, fmt.Errorf("container: %w: %w", ports.ErrInvalidArgument, err)
	}
	return full, ok, nil
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

func notFound(what, id string) error {
	return fmt.Errorf("%s %s: %w", what, id, ports.ErrNotFound)
}
