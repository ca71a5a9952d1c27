package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// vmService creates, starts, stops and removes the VMs of VM pods (their
// containers), with the volumes and cloud-init media made for them.
type vmService struct {
	*shared
	imgs  *imageService // the images VMs boot from
	vols  *volumeService
	ci    *cloudInitService
	users vmUserPool // the VMs' own users, when Options.VMUsers
	// undos are the containers whose failed creation could not be undone;
	// the reconciler retries them (retryUndos).
	undos chan string
	// incoming are the receiving VMs' live migrations (migration.go).
	incoming incomingWaits
}

// ContainerConfig is what kubelet asks for in CreateContainer.
type ContainerConfig struct {
	Name    string
	Attempt uint32
	// Image is kubelet's image reference (usually the ID PullImage returned);
	// UserImage is the image as the pod spec names it.
	Image       string
	UserImage   string
	Labels      map[string]string
	Annotations map[string]string
	LogPath     string // relative to the sandbox's log directory
	Env         []EnvVar
	Mounts      []Mount
	Devices     []Device
	// MemoryLimitBytes is the container's memory limit (0: none).
	MemoryLimitBytes int64
	// CPUSet is the host CPUs the container may use, in Linux's list
	// format ("1,3-5"): kubelet's static CPU manager gives a Guaranteed
	// pod's exclusive CPUs here. The VM's vCPUs are pinned to them.
	CPUSet string
	// HugepageLimits are the pod's hugepages-<size> limits (those above 0).
	HugepageLimits []HugepageLimit
	// CPUQuota and CPUPeriod are the container's CPU limit as CFS
	// figures (quota ≤ 0: no limit). A VM with VirtletMaxVCPUCount has as
	// many vCPUs as the limit, rounded up.
	CPUQuota, CPUPeriod int64
	// CPUShares is the container's CPU request as CFS shares (0: none).
	CPUShares int64
}

// HugepageLimit is a container's limit of hugepages of one size.
type HugepageLimit struct {
	PageSize string // as CRI names it: "2MB", "1GB"
	Bytes    uint64
}

// EnvVar is one environment variable of the container.
type EnvVar struct {
	Name  string
	Value string
}

// CreateContainer defines the VM of a VM pod. A VM pod has exactly one
// container; kubelet may create it again (a new attempt) once the previous
// VM has exited. Creating the same name and attempt again returns the same
// ID.
func (r *vmService) CreateContainer(ctx context.Context, sandboxID string, cfg ContainerConfig) (string, error) {
	full, ok, err := r.resolveSandbox(sandboxID)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", notFound("sandbox", sandboxID)
	}
	var id string
	err = r.detached(ctx, func(ctx context.Context) error {
		unlock, err := r.lockPod(ctx, full)
		if err != nil {
			return err
		}
		defer unlock()
		id, err = r.createLocked(ctx, full, cfg)
		return err
	})
	return id, err
}

// definedAs asks the hypervisor how it defined a VM and takes the name
// and UUID it gave the VM into the spec: a VM claimed from a pool of
// pre-launched VMs keeps the pool's, and a spec without a UUID gets the
// hypervisor's.
func (r *vmService) definedAs(ctx context.Context, spec *ports.VMSpec) (ports.VMStatus, error) {
	vm, err := r.deps.Hypervisor.Status(ctx, spec.ID)
	if err != nil {
		return ports.VMStatus{}, fmt.Errorf("VM %s after its definition: %w", spec.Name, err)
	}
	if vm.Name != "" {
		spec.Name = vm.Name
	}
	if vm.UUID != "" {
		spec.UUID = vm.UUID
	}
	return vm, nil
}

// maxDisksPerBus bounds a VM's disks: the guest names them sda…sdz or
// vda…vdz.
const maxDisksPerBus = 26

func checkDiskCount(disks []ports.Disk) error {
	per := map[ports.DiskBus]int{}
	for _, d := range disks {
		per[d.Bus]++
		if per[d.Bus] > maxDisksPerBus {
			return fmt.Errorf("the VM would have more than %d disks on its %s bus (root, volumes and cloud-init media): %w",
				maxDisksPerBus, d.Bus, ports.ErrInvalidArgument)
		}
	}
	return nil
}

// undoCreate undoes a creation from its record: every step's undo, then
// the record goes. When an undo fails, the record stays "creating" and
// the undo is tried again shortly (retryUndos; the next resync would too).
func (r *vmService) undoCreate(ctx context.Context, c *Container, log logrus.FieldLogger) {
	r.forgetCreation(ctx, c, r.releaseVM(ctx, c), log)
}

// forgetCreation removes the record of a creation whose steps were undone,
// or, when undoErr says they were not all undone, queues the undo again.
func (r *vmService) forgetCreation(ctx context.Context, c *Container, undoErr error, log logrus.FieldLogger) {
	if undoErr != nil {
		log.WithError(undoErr).Error("undo VM creation; will retry")
		select {
		case r.undos <- c.ID:
		default: // a full queue: the next resync undoes it
		}
		return
	}
	if err := r.containers.delete(ctx, c.ID); err != nil {
		log.WithError(err).Error("forget failed container")
	}
}

// releaseVM undoes every step of a VM's creation, as its record says it
// was made: the domain, its cloud-init media, its volumes; each undo
// tolerates what is already gone.
func (r *vmService) releaseVM(ctx context.Context, c *Container) error {
	log := r.log.WithField("container", short(c.ID))
	return undoSteps(ctx, createSteps, &creation{rt: r, c: c}, log)
}

// removeMedia has the datasource plugin that made a VM's cloud-init media
// remove it.
func (r *vmService) removeMedia(ctx context.Context, c *Container) error {
	if c.Datasource == "" {
		return nil
	}
	ds, ok := r.deps.Datasources[c.Datasource]
	if !ok {
		r.log.WithFields(logrus.Fields{"container": short(c.ID), "datasource": c.Datasource}).
			Warn("the datasource plugin that made this VM's cloud-init media is no longer installed; its media stays in the plugin's directory")
		return nil
	}
	if err := ds.RemoveMedia(ctx, c.ID); err != nil {
		return fmt.Errorf("remove %s cloud-init media: %w", c.Datasource, err)
	}
	return nil
}

// imageForContainer finds the stored image a container names, and checks
// that the pod asks for a VM image.
func (r *vmService) imageForContainer(cfg ContainerConfig) (*Image, error) {
	if cfg.UserImage != "" {
		if _, err := ParseImageName(cfg.UserImage); err != nil {
			return nil, err
		}
	}
	img, err := r.imgs.resolveImage(cfg.Image)
	if err != nil {
		return nil, err
	}
	if img == nil {
		name := cfg.Image
		if cfg.UserImage != "" {
			name = cfg.UserImage
		}
		return nil, fmt.Errorf("image %s is not in the image store (pull it first): %w", name, ports.ErrNotFound)
	}
	return img, nil
}

// memory is the VM's memory: the container's limit, else the presets'
// default, else the daemon's.
func (r *vmService) memory(cfg ContainerConfig, presetDefault int64) (int64, error) {
	m, field := cfg.MemoryLimitBytes, "resources.limits.memory"
	if m == 0 && presetDefault != 0 {
		m, field = presetDefault, "the presets' memory"
	}
	switch {
	case m == 0:
		return r.opts.DefaultMemoryBytes, nil
	case m < MinMemoryBytes:
		return 0, &ports.InvalidError{Field: field, Value: fmt.Sprintf("%d bytes", m),
			Reason: "too little memory for a VM", Allowed: fmt.Sprintf("at least %dMi", MinMemoryBytes>>20)}
	default:
		return m, nil
	}
}

func (r *vmService) uuidUser(vmUUID string) *Container {
	return r.containers.find(func(c *Container) bool { return strings.EqualFold(c.Spec.UUID, vmUUID) })
}

// domainName is unique (the ID) and readable (the pod name).
func domainName(id, pod string) string {
	name := "virtlet-" + id[:12] + "-" + pod
	if len(name) > 64 {
		name = name[:64]
	}
	return name
}

func formatOr(format, def string) string {
	if format == "" {
		return def
	}
	return format
}

// StartContainer boots a created VM. Starting a running VM succeeds.
func (r *vmService) StartContainer(ctx context.Context, id string) error {
	if full, ok, _ := r.resolveContainer(id); ok {
		if c, found := r.containers.get(full); found && c.Spec.Incoming != nil && c.State == ContainerCreated {
			// A receiving VM: its guest comes from a live migration.
			if err := r.awaitIncoming(ctx, c); err != nil {
				return err
			}
		}
	}
	c, unlock, err := r.lockContainer(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	return r.startLocked(ctx, c)
}

// startLocked starts created container c's VM (pod lock held).
func (r *vmService) startLocked(ctx context.Context, c *Container) error {
	switch c.State {
	case ContainerRunning:
		return nil
	case ContainerCreated:
	default:
		return fmt.Errorf("container %s is %s; only a created VM can be started: %w", short(c.ID), c.State, ports.ErrFailedPrecondition)
	}
	start := time.Now()
	if err := r.deps.Hypervisor.Start(ctx, c.ID); err != nil {
		return fmt.Errorf("start VM %s: %w", c.Spec.Name, err)
	}
	r.phaseDone(pathPhase(c.Prelaunched, ports.PhaseStart, ports.PhaseResume), start)
	r.failpoint(FPStartStarted)
	running := *c
	running.State = ContainerRunning
	running.StartedAt = r.opts.Now()
	running.Prelaunched = false
	if err := r.containers.put(ctx, &running); err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name, "resumed": c.Prelaunched,
		"millis": time.Since(start).Milliseconds()}).Info("VM started")
	return nil
}

// StopContainer shuts the VM down: ACPI first, forced off after timeout.
// Stopping a VM that is not running succeeds.
func (r *vmService) StopContainer(ctx context.Context, id string, timeout time.Duration) error {
	c, unlock, err := r.lockContainer(ctx, id)
	if err != nil {
		if errors.Is(err, ports.ErrNotFound) {
			return nil
		}
		return err
	}
	defer unlock()
	if c.State != ContainerRunning {
		return nil
	}
	return r.stopLocked(ctx, c, timeout)
}

func (r *vmService) stopLocked(ctx context.Context, c *Container, timeout time.Duration) error {
	st, err := r.deps.Hypervisor.Stop(ctx, c.ID, timeout)
	if err != nil {
		return fmt.Errorf("stop VM %s: %w", c.Spec.Name, err)
	}
	r.failpoint(FPStopStopped)
	exited := *c
	r.applyExit(&exited, st)
	if c.Halted() {
		exited.Message = "the container was stopped while its VM was halted (virtletctl stop)"
	}
	if err := r.containers.put(ctx, &exited); err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name, "exitCode": exited.ExitCode, "reason": exited.Reason}).
		Info("VM stopped")
	return nil
}

// applyExit records a stopped VM's exit status.
func (r *vmService) applyExit(c *Container, st ports.VMStatus) {
	c.State = ContainerExited
	c.ExitCode, c.Reason, c.Message = st.ExitCode, st.Reason, st.Message
	c.FinishedAt = st.FinishedAt
	if c.FinishedAt.IsZero() {
		c.FinishedAt = r.opts.Now()
	}
	if c.Reason == "" {
		c.Reason = ReasonCompleted
		if c.ExitCode != 0 {
			c.Reason = ReasonKilled
		}
	}
}

// ReopenContainerLog makes the VM's console log be written to a new file
// after kubelet rotated the old one.
func (r *vmService) ReopenContainerLog(ctx context.Context, id string) error {
	c, err := r.ContainerStatus(ctx, id)
	if err != nil {
		return err
	}
	if c.State != ContainerRunning {
		return fmt.Errorf("container %s is %s; only a running VM's log can be reopened: %w", short(c.ID), c.State, ports.ErrFailedPrecondition)
	}
	if c.Halted() {
		// Nothing writes the log while the VM is off; its next boot
		// opens the log at its path afresh.
		return nil
	}
	if err := r.deps.Hypervisor.ReopenLog(ctx, c.ID); err != nil {
		return fmt.Errorf("reopen console log of VM %s: %w", c.Spec.Name, err)
	}
	return nil
}

// RemoveContainer removes the VM and everything made for it. Removing an
// unknown container succeeds.
func (r *vmService) RemoveContainer(ctx context.Context, id string) error {
	c, unlock, err := r.lockContainer(ctx, id)
	if err != nil {
		if errors.Is(err, ports.ErrNotFound) {
			return nil
		}
		return err
	}
	defer unlock()
	return r.removeLocked(ctx, c)
}

func (r *vmService) removeLocked(ctx context.Context, c *Container) error {
	r.incoming.cancel(c.ID, errors.New("the receiving container was removed"))
	if c.State == ContainerRunning {
		if err := r.stopLocked(ctx, c, 0); err != nil {
			return err
		}
	}
	if err := r.releaseVM(ctx, c); err != nil {
		return fmt.Errorf("remove VM %s: %w", c.Spec.Name, err)
	}
	r.failpoint(FPRemoveReleased)
	if err := r.containers.delete(ctx, c.ID); err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name}).Info("VM removed")
	r.imgs.collectNamelessImage(ctx, c.Image.ID)
	return nil
}

// lockContainer resolves id, takes its pod's lock, and returns the
// container as seen under the lock.
func (r *vmService) lockContainer(ctx context.Context, id string) (*Container, func(), error) {
	full, ok, err := r.resolveContainer(id)
	if err != nil {
		return nil, nil, err
	}
	c, found := r.containers.get(full)
	if !ok || !found {
		return nil, nil, notFound("container", id)
	}
	unlock, err := r.lockPod(ctx, c.SandboxID)
	if err != nil {
		return nil, nil, err
	}
	c, found = r.containers.get(full)
	if !found || c.State == ContainerCreating {
		unlock()
		return nil, nil, notFound("container", id)
	}
	return c, unlock, nil
}

// ContainerStatus returns a container.
func (r *vmService) ContainerStatus(ctx context.Context, id string) (Container, error) {
	full, ok, err := r.resolveContainer(id)
	if err != nil {
		return Container{}, err
	}
	c, found := r.containers.get(full)
	if !ok || !found || c.State == ContainerCreating {
		return Container{}, notFound("container", id)
	}
	return *c, nil
}

// ContainerFilter selects containers; zero fields match everything.
type ContainerFilter struct {
	ID            string // ID or prefix
	SandboxID     string // ID or prefix
	State         ContainerState
	LabelSelector map[string]string
}

// ListContainers returns the containers matching f, newest first. The
// records are shared immutable snapshots: callers must not modify them.
func (r *vmService) ListContainers(f ContainerFilter) []*Container {
	out := r.containers.list(func(c *Container) bool {
		return c.State != ContainerCreating &&
			(f.ID == "" || strings.HasPrefix(c.ID, f.ID)) &&
			(f.SandboxID == "" || strings.HasPrefix(c.SandboxID, f.SandboxID)) &&
			(f.State == "" || c.State == f.State) &&
			matchLabels(c.Labels, f.LabelSelector)
	})
	slices.SortFunc(out, func(a, b *Container) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out
}

// vmNICs gives the VM one NIC per pod interface, with the interface's MAC
// (so the pod's addresses, DHCP lease and cloud-init network-config all
// match it) on the host bridge the network plugin made for it.
func vmNICs(att *ports.NetworkAttachment) []ports.NIC {
	if att == nil {
		return nil
	}
	nics := make([]ports.NIC, 0, len(att.Interfaces))
	for _, iface := range att.Interfaces {
		nics = append(nics, ports.NIC{Name: iface.Name, MAC: iface.MAC, MTU: iface.MTU, Bridge: iface.Bridge})
	}
	return nics
}
