package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/singleflight"

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

// Runtime runs VM pods. It keeps every record in memory (lists and statuses
// never touch a plugin) and writes each change through to the state store
// before acting on it.
type Runtime struct {
	deps Deps
	opts Options
	log  logrus.FieldLogger

	mu         sync.RWMutex
	sandboxes  map[string]*Sandbox
	containers map[string]*Container
	images     map[string]*Image // by ID

	revision uint64 // last Revision given to a record; guarded by mu

	users  vmUserPool         // the VMs' own users, when Options.VMUsers
	pods   keyedLock          // one operation at a time per sandbox ID
	imgMu  sync.Mutex         // serialises image index updates
	pulls  singleflight.Group // one download per image at a time
	synced chan struct{}      // closed after the first resync with the hypervisor
	undos  chan string        // containers whose failed creation could not be undone (retryUndos)
	events eventQueue         // the hypervisor's VM state events, applied per VM (Run)

	fsMu         sync.Mutex // guards fsMountpoint
	fsMountpoint string     // the image store's filesystem, once found (stats)
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
	r := &Runtime{
		deps:       deps,
		opts:       opts,
		log:        opts.Log,
		sandboxes:  make(map[string]*Sandbox),
		containers: make(map[string]*Container),
		images:     make(map[string]*Image),
		synced:     make(chan struct{}),
		undos:      make(chan string, 64),
	}
	r.events.r = r
	return r, nil
}

// Load reads every record from the state store into memory.
func (r *Runtime) Load(ctx context.Context) error {
	sandboxes := make(map[string]*Sandbox)
	containers := make(map[string]*Container)
	images := make(map[string]*Image)
	if err := loadBucket(ctx, r.deps.Store, ports.BucketSandboxes, sandboxes); err != nil {
		return err
	}
	if err := loadBucket(ctx, r.deps.Store, ports.BucketContainers, containers); err != nil {
		return err
	}
	if err := loadBucket(ctx, r.deps.Store, ports.BucketImages, images); err != nil {
		return err
	}
	r.mu.Lock()
	r.sandboxes, r.containers, r.images = sandboxes, containers, images
	for _, sb := range sandboxes {
		r.revision++
		sb.Revision = r.revision
	}
	for _, c := range containers {
		r.revision++
		c.Revision = r.revision
	}
	r.mu.Unlock()
	r.log.WithFields(logrus.Fields{"sandboxes": len(sandboxes), "containers": len(containers), "images": len(images)}).
		Info("state loaded")
	return r.collectImageFiles(ctx)
}

// collectImageFiles removes stored image data that no image record and no
// VM refers to: what a crash between storing a download and recording it
// leaves.
func (r *Runtime) collectImageFiles(ctx context.Context) error {
	digests, err := r.deps.ImageFiles.List(ctx)
	if err != nil {
		return fmt.Errorf("list image data: %w", err)
	}
	r.mu.RLock()
	var garbage []string
	for _, d := range digests {
		if _, ok := r.images[d]; !ok && !r.imageInUseLocked(d) {
			garbage = append(garbage, d)
		}
	}
	r.mu.RUnlock()
	for _, d := range garbage {
		if err := r.deps.ImageFiles.Remove(ctx, d); err != nil {
			return fmt.Errorf("remove unreferenced image data %s: %w", d, err)
		}
		r.log.WithField("id", d).Info("removed image data no record refers to")
	}
	return nil
}

func loadBucket[T any](ctx context.Context, store ports.StateStore, bucket ports.Bucket, into map[string]*T) error {
	records, err := store.List(ctx, bucket)
	if err != nil {
		return fmt.Errorf("load %s: %w", bucket, err)
	}
	for key, raw := range records {
		v := new(T)
		if err := json.Unmarshal(raw, v); err != nil {
			return fmt.Errorf("load %s/%s: decode record: %w", bucket, key, err)
		}
		into[key] = v
	}
	return nil
}

// write stores records durably and then updates the in-memory view. A nil
// value deletes.
type write struct {
	sandbox   *Sandbox
	container *Container
	image     *Image
	// deletes
	sandboxID, containerID, imageID string
}

func (r *Runtime) commit(ctx context.Context, writes ...write) error {
	ops := make([]ports.StoreOp, 0, len(writes))
	put := func(bucket ports.Bucket, id string, v interface{}) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode the record of %s: %w", id, err)
		}
		ops = append(ops, ports.Put(bucket, id, b))
		return nil
	}
	for _, w := range writes {
		var err error
		switch {
		case w.sandbox != nil:
			err = put(ports.BucketSandboxes, w.sandbox.ID, w.sandbox)
		case w.container != nil:
			err = put(ports.BucketContainers, w.container.ID, w.container)
		case w.image != nil:
			err = put(ports.BucketImages, w.image.ID, w.image)
		case w.sandboxID != "":
			ops = append(ops, ports.Delete(ports.BucketSandboxes, w.sandboxID))
		case w.containerID != "":
			ops = append(ops, ports.Delete(ports.BucketContainers, w.containerID))
		case w.imageID != "":
			ops = append(ops, ports.Delete(ports.BucketImages, w.imageID))
		}
		if err != nil {
			return fmt.Errorf("write state: %w", err)
		}
	}
	if err := r.deps.Store.Apply(ctx, ops...); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range writes {
		switch {
		case w.sandbox != nil:
			r.revision++
			w.sandbox.Revision = r.revision
			r.sandboxes[w.sandbox.ID] = w.sandbox
		case w.container != nil:
			r.revision++
			w.container.Revision = r.revision
			r.containers[w.container.ID] = w.container
		case w.image != nil:
			r.images[w.image.ID] = w.image
		case w.sandboxID != "":
			delete(r.sandboxes, w.sandboxID)
		case w.containerID != "":
			delete(r.containers, w.containerID)
		case w.imageID != "":
			delete(r.images, w.imageID)
		}
	}
	return nil
}

// detached runs a slow operation so that it completes even if the caller's
// context ends first (kubelet's request timeout): kubelet then retries, and
// the retry, serialised behind the first attempt by the pod lock, finds the
// result instead of creating a second VM.
func (r *Runtime) detached(ctx context.Context, op func(context.Context) error) error {
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
func (r *Runtime) lockPod(ctx context.Context, sandboxID string) (func(), error) {
	unlock, err := r.pods.lock(ctx, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("wait for other operations on sandbox %s: %w", short(sandboxID), err)
	}
	return unlock, nil
}

func (r *Runtime) sandbox(id string) (*Sandbox, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.sandboxes[id]
	return s, ok
}

func (r *Runtime) container(id string) (*Container, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c, ok := r.containers[id]
	return c, ok
}

// containersOf returns a sandbox's containers, oldest first.
func (r *Runtime) containersOf(sandboxID string) []*Container {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*Container
	for _, c := range r.containers {
		if c.SandboxID == sandboxID {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// resolveSandbox maps an ID or unique prefix to a full sandbox ID.
func (r *Runtime) resolveSandbox(id string) (string, bool, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	full, ok, err := lookupPrefix(r.sandboxes, id)
	if err != nil {
		return "", false, fmt.Errorf("sandbox: %w: %w", ports.ErrInvalidArgument, err)
	}
	return full, ok, nil
}

// resolveContainer maps an ID or unique prefix to a full container ID.
func (r *Runtime) resolveContainer(id string) (string, bool, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	full, ok, err := lookupPrefix(r.containers, id)
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
