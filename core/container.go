package core

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/core/cloudinit"
	"github.com/virtlet/virtlet/ports"
)

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
func (r *Runtime) CreateContainer(ctx context.Context, sandboxID string, cfg ContainerConfig) (string, error) {
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

func (r *Runtime) createLocked(ctx context.Context, sandboxID string, cfg ContainerConfig) (string, error) {
	sb, ok := r.sandbox(sandboxID)
	if !ok {
		return "", notFound("sandbox", sandboxID)
	}
	pod := sb.Namespace + "/" + sb.Name
	if sb.State != SandboxReady {
		return "", fmt.Errorf("pod %s: sandbox %s is %s, not ready: %w", pod, short(sb.ID), sb.State, ports.ErrFailedPrecondition)
	}
	for _, c := range r.containersOf(sandboxID) {
		switch {
		case c.Name == cfg.Name && c.Attempt == cfg.Attempt && c.State != ContainerCreating:
			return c.ID, nil
		case c.Name != cfg.Name:
			return "", fmt.Errorf("pod %s: a VM pod has exactly one container, and it already has %q; refusing container %q: %w",
				pod, c.Name, cfg.Name, ports.ErrInvalidArgument)
		case c.State == ContainerCreated || c.State == ContainerRunning:
			return "", fmt.Errorf("pod %s: the VM of container %q (attempt %d) is still %s: %w",
				pod, c.Name, c.Attempt, c.State, ports.ErrFailedPrecondition)
		}
	}
	// The operator's presets under the pod's own annotations.
	applied, err := r.opts.Presets.Apply(sb.Labels, sb.Annotations, cfg.MemoryLimitBytes)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	ann := applied.Annotations
	opts, err := annotations.Parse(ann)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	img, err := r.imageForContainer(cfg)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	imagePath, err := r.deps.ImageFiles.Path(ctx, img.ID)
	if errors.Is(err, ports.ErrNotFound) {
		return "", fmt.Errorf("pod %s: the data file of image %s (%s) is missing from the image store; remove the image and pull it again: %w",
			pod, img.ID, strings.Join(img.Names, ", "), ports.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("pod %s: image %s: %w", pod, img.ID, err)
	}
	memory, err := r.memory(cfg, applied.MemoryBytes)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	hugepages, err := hugepageSize(cfg.HugepageLimits, memory)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	if err := checkMaxMemory(opts.MaxMemoryBytes, memory, hugepages, ann[annotations.MaxMemory]); err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	vcpus, err := bootVCPUs(opts, cfg.CPUQuota, cfg.CPUPeriod)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	cpuSet, err := ParseCPUList(cfg.CPUSet)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, &ports.InvalidError{Field: "resources cpuset_cpus", Value: cfg.CPUSet,
			Allowed: "a CPU list such as 1,3-5", Reason: err.Error()})
	}
	plan, err := r.planVolumes(ctx, cfg, opts)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	root := plan.rootfs()
	switch {
	case root != nil && opts.RootVolumeSize > 0:
		return "", fmt.Errorf("pod %s: %w", pod, &ports.InvalidError{
			Field: "annotation " + annotations.RootVolumeSize, Value: ann[annotations.RootVolumeSize],
			Reason:  fmt.Sprintf("the VM's root is the persistent root filesystem on block volume %s, whose size is the device's", root.Name),
			Allowed: "no " + annotations.RootVolumeSize + " with a persistent root filesystem"})
	case root == nil && opts.RootfsReinit:
		return "", fmt.Errorf("pod %s: %w", pod, &ports.InvalidError{
			Field: "annotation " + annotations.PersistentRootfsReinit, Value: ann[annotations.PersistentRootfsReinit],
			Reason:  "the pod has no persistent root filesystem",
			Allowed: "only with a block volume at devicePath \"/\""})
	case r.opts.MaxVirtualBytes > 0 && opts.RootVolumeSize > r.opts.MaxVirtualBytes:
		return "", fmt.Errorf("pod %s: %w", pod, &ports.InvalidError{
			Field: "annotation " + annotations.RootVolumeSize, Value: ann[annotations.RootVolumeSize],
			Reason:  fmt.Sprintf("more than the %d bytes the node allows a disk (maxVirtualSize)", r.opts.MaxVirtualBytes),
			Allowed: fmt.Sprintf("at most %d bytes", r.opts.MaxVirtualBytes)})
	case opts.Watchdog != nil && opts.Watchdog.Action == "dump" && !r.opts.AllowWatchdogDump:
		return "", fmt.Errorf("pod %s: %w", pod, &ports.InvalidError{
			Field: "annotation " + annotations.WatchdogAction, Value: "dump",
			Reason:  "this node's operator has not enabled memory dumps (the daemon's allowWatchdogDump): a dump writes the guest's memory to the node's disk",
			Allowed: "reset, poweroff or shutdown"})
	case opts.RootVolumeSize > 0 && opts.RootVolumeSize < img.VirtualSize:
		return "", fmt.Errorf("pod %s: %w", pod, &ports.InvalidError{
			Field: "annotation " + annotations.RootVolumeSize, Value: ann[annotations.RootVolumeSize],
			Reason:  fmt.Sprintf("smaller than the image's virtual size (%d bytes)", img.VirtualSize),
			Allowed: "a size of at least the image's virtual size (the root disk can grow, not shrink)"})
	}

	ds, err := r.datasource(opts)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	rootFiles, err := r.filesFromDataSource(ctx, sb, opts)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	ciInput, err := r.cloudInitInput(ctx, sb, opts, cfg, plan.projected)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	// A persistent root keeps the network configuration of its first pod;
	// later pods get theirs by DHCP (seed 004).
	ciInput.PersistentRoot = root != nil

	id := newContainerID()
	spec := ports.VMSpec{
		ID: id, Name: domainName(id, sb.Name), UUID: opts.SystemUUID,
		SandboxID: sb.ID, PodName: sb.Name, PodNamespace: sb.Namespace, PodUID: sb.UID,
		VCPUs: vcpus, MaxVCPUs: opts.MaxVCPUCount, MinVCPUs: opts.VCPUCount, MemoryBytes: memory, MaxMemoryBytes: max(opts.MaxMemoryBytes, memory), HugepageSizeBytes: hugepages,
		CPU: ports.CPUSpec{Model: opts.CPUModel, Setting: opts.CPUSetting}, Machine: opts.MachineType, Firmware: opts.Firmware, SecureBoot: opts.SecureBoot, HyperV: opts.HyperV, Clock: opts.Clock, Watchdog: opts.Watchdog, CPUSet: cpuSet,
		Disks: []ports.Disk{{
			Name: "root", Device: ports.DeviceDisk, Bus: opts.DiskDriver, Boot: true, Serial: RootSerial,
			Source: ports.DiskSource{Type: ports.SourceFile, Format: "qcow2"},
			Overlay: &ports.DiskOverlay{BasePath: imagePath, BaseFormat: formatOr(img.Format, "qcow2"), SizeBytes: opts.RootVolumeSize,
				KeepFreeBytes: r.opts.KeepFreeBytes},
		}},
	}
	spec.NICs = vmNICs(sb.Network)
	// The VM's own user, held by this creation until its record holds it.
	runAs, releaseUser, err := r.takeVMUser()
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	defer releaseUser()
	spec.RunAs = runAs
	if other := r.uuidUser(spec.UUID); spec.UUID != "" && other != nil {
		return "", fmt.Errorf("pod %s: annotation %s: UUID %s is used by the VM of pod %s/%s; SMBIOS UUIDs must be unique on a node: %w",
			pod, annotations.SystemUUID, spec.UUID, other.Spec.PodNamespace, other.Spec.PodName, ports.ErrFailedPrecondition)
	}
	if sb.LogDirectory != "" && cfg.LogPath != "" {
		spec.ConsoleLogPath = filepath.Join(sb.LogDirectory, cfg.LogPath)
	}
	c := &Container{
		ID: id, SandboxID: sb.ID, Name: cfg.Name, Attempt: cfg.Attempt,
		Image:  ImageRef{Spec: cfg.Image, UserSpecified: cfg.UserImage, ID: img.ID},
		Labels: cfg.Labels, Annotations: cfg.Annotations, LogPath: cfg.LogPath, Mounts: cfg.Mounts, Volumes: plan.uses,
		Spec: spec, Datasource: opts.CloudInitImageType, State: ContainerCreating, CreatedAt: r.opts.Now(),
	}
	log := r.log.WithFields(logrus.Fields{"pod": pod, "container": short(id), "vm": spec.Name})
	// Record the intent before anything is made: after a crash the
	// reconciler finds a "creating" record and undoes what was done.
	if err := r.commit(ctx, write{container: c}); err != nil {
		return "", err
	}
	r.failpoint(FPCreateRecorded)
	fail := func(err error) (string, error) {
		r.undoCreate(ctx, c, log)
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	var rootfs *ports.RootfsRequest
	if root != nil {
		rootfs = &ports.RootfsRequest{ImagePath: imagePath, ImageFormat: formatOr(img.Format, "qcow2"), ImageDigest: img.ID,
			ImageName: cfg.UserImage, ImageVirtualSize: img.VirtualSize, Reinitialize: opts.RootfsReinit}
	}
	start := time.Now()
	vols, err := r.prepareVolumes(ctx, c, opts.DiskDriver, rootfs)
	if err != nil {
		return fail(err)
	}
	r.phaseDone(ports.PhaseVolumes, start)
	r.failpoint(FPCreateVolumes)
	if vols.root != nil {
		spec.Disks[0] = *vols.root
	}
	spec.Disks = append(spec.Disks, vols.disks...)
	spec.Filesystems = vols.filesystems
	ciInput.Volumes = guestVolumes(plan.uses, vols.formats, opts.DiskDriver)
	start = time.Now()
	ci, err := cloudinit.Build(ciInput)
	if err != nil {
		return fail(err)
	}
	media, err := ds.BuildMedia(ctx, ports.MediaRequest{VMID: id, Datasource: opts.CloudInitImageType,
		MetaData: ci.MetaData, UserData: ci.UserData, NetworkConfig: ci.NetworkConfig, Network: ci.Network})
	if err != nil {
		return fail(fmt.Errorf("build %s cloud-init media: %w", opts.CloudInitImageType, err))
	}
	r.phaseDone(ports.PhaseCloudInit, start)
	r.failpoint(FPCreateMedia)
	media.Serial = CIDataSerial
	spec.Disks = append(spec.Disks, cloudInitDisk(media, opts.DiskDriver))
	if err := checkDiskCount(spec.Disks); err != nil {
		return fail(err)
	}
	start = time.Now()
	if err := r.deps.Hypervisor.Define(ctx, spec); err != nil {
		return fail(fmt.Errorf("define VM %s: %w", spec.Name, err))
	}
	vm, err := r.definedAs(ctx, &spec)
	if err != nil {
		return fail(err)
	}
	r.phaseDone(pathPhase(vm.Prelaunched, ports.PhaseDefine, ports.PhaseClaim), start)
	r.failpoint(FPCreateDefined)
	if len(rootFiles) > 0 {
		start = time.Now()
		if err := r.deps.Hypervisor.WriteFiles(ctx, id, rootFiles); err != nil {
			return fail(fmt.Errorf("annotation %s: write the files of %s into the root file system: %w",
				annotations.FilesFromDataSource, opts.FilesFromDataSource, err))
		}
		r.phaseDone(ports.PhaseWriteFiles, start)
		// Writing a pre-launched VM's root disk ends its paused process.
		if vm, err = r.definedAs(ctx, &spec); err != nil {
			return fail(err)
		}
	}
	created := *c
	created.Spec = spec.WithoutSecrets()
	created.State = ContainerCreated
	created.Prelaunched = vm.Prelaunched
	if err := r.commit(ctx, write{container: &created}); err != nil {
		r.undoCreate(ctx, c, log)
		return "", err
	}
	log.WithFields(logrus.Fields{"vcpus": spec.VCPUs, "memory": spec.MemoryBytes, "image": img.ID, "volumes": len(plan.uses),
		"presets": strings.Join(applied.Presets, ","), "domain": spec.Name, "prelaunched": vm.Prelaunched}).Info("VM defined")
	return id, nil
}

// definedAs asks the hypervisor how it defined a VM and takes the name
// and UUID it gave the VM into the spec: a VM claimed from a pool of
// pre-launched VMs keeps the pool's, and a spec without a UUID gets the
// hypervisor's.
func (r *Runtime) definedAs(ctx context.Context, spec *ports.VMSpec) (ports.VMStatus, error) {
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

// undoCreate removes what a failed CreateContainer made.
func (r *Runtime) undoCreate(ctx context.Context, c *Container, log logrus.FieldLogger) {
	if err := r.releaseVM(ctx, c); err != nil {
		// The record stays "creating"; retryUndos tries again shortly
		// (and the next resync would).
		log.WithError(err).Error("undo VM creation; will retry")
		select {
		case r.undos <- c.ID:
		default: // a full queue: the next resync undoes it
		}
		return
	}
	if err := r.commit(ctx, write{containerID: c.ID}); err != nil {
		log.WithError(err).Error("forget failed container")
	}
}

// releaseVM undefines a VM, releases its volumes and deletes its
// cloud-init media; each step tolerates what is already gone.
func (r *Runtime) releaseVM(ctx context.Context, c *Container) error {
	if err := r.deps.Hypervisor.Undefine(ctx, c.ID); err != nil && !errors.Is(err, ports.ErrNotFound) {
		return err
	}
	if err := r.releaseVolumes(ctx, c); err != nil {
		return err
	}
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
func (r *Runtime) imageForContainer(cfg ContainerConfig) (*Image, error) {
	if cfg.UserImage != "" {
		if _, err := ParseImageName(cfg.UserImage); err != nil {
			return nil, err
		}
	}
	img, err := r.resolveImage(cfg.Image)
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
func (r *Runtime) memory(cfg ContainerConfig, presetDefault int64) (int64, error) {
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

func (r *Runtime) uuidUser(vmUUID string) *Container {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, c := range r.containers {
		if strings.EqualFold(c.Spec.UUID, vmUUID) {
			return c
		}
	}
	return nil
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
func (r *Runtime) StartContainer(ctx context.Context, id string) error {
	c, unlock, err := r.lockContainer(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
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
	if err := r.commit(ctx, write{container: &running}); err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name, "resumed": c.Prelaunched,
		"millis": time.Since(start).Milliseconds()}).Info("VM started")
	return nil
}

// StopContainer shuts the VM down: ACPI first, forced off after timeout.
// Stopping a VM that is not running succeeds.
func (r *Runtime) StopContainer(ctx context.Context, id string, timeout time.Duration) error {
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

func (r *Runtime) stopLocked(ctx context.Context, c *Container, timeout time.Duration) error {
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
	if err := r.commit(ctx, write{container: &exited}); err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name, "exitCode": exited.ExitCode, "reason": exited.Reason}).
		Info("VM stopped")
	return nil
}

// applyExit records a stopped VM's exit status.
func (r *Runtime) applyExit(c *Container, st ports.VMStatus) {
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
func (r *Runtime) ReopenContainerLog(ctx context.Context, id string) error {
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
func (r *Runtime) RemoveContainer(ctx context.Context, id string) error {
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

func (r *Runtime) removeLocked(ctx context.Context, c *Container) error {
	if c.State == ContainerRunning {
		if err := r.stopLocked(ctx, c, 0); err != nil {
			return err
		}
	}
	if err := r.releaseVM(ctx, c); err != nil {
		return fmt.Errorf("remove VM %s: %w", c.Spec.Name, err)
	}
	r.failpoint(FPRemoveReleased)
	if err := r.commit(ctx, write{containerID: c.ID}); err != nil {
		return err
	}
	r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name}).Info("VM removed")
	r.collectNamelessImage(ctx, c.Image.ID)
	return nil
}

// collectNamelessImage deletes an image whose names all moved to newer
// content once its last VM is gone (it was kept only as that VM's base).
func (r *Runtime) collectNamelessImage(ctx context.Context, id string) {
	r.imgMu.Lock()
	defer r.imgMu.Unlock()
	r.mu.RLock()
	img, ok := r.images[id]
	unused := ok && len(img.Names) == 0 && !r.imageInUseLocked(id)
	r.mu.RUnlock()
	if !unused {
		return
	}
	if err := r.commit(ctx, write{imageID: id}); err != nil {
		r.log.WithError(err).WithField("id", id).Warn("forget nameless image")
		return
	}
	if err := r.deps.ImageFiles.Remove(ctx, id); err != nil {
		r.log.WithError(err).WithField("id", id).Warn("remove data of nameless image")
		return
	}
	r.log.WithField("id", id).Info("removed an image whose names moved on, with its last VM")
}

// lockContainer resolves id, takes its pod's lock, and returns the
// container as seen under the lock.
func (r *Runtime) lockContainer(ctx context.Context, id string) (*Container, func(), error) {
	full, ok, err := r.resolveContainer(id)
	if err != nil {
		return nil, nil, err
	}
	c, found := r.container(full)
	if !ok || !found {
		return nil, nil, notFound("container", id)
	}
	unlock, err := r.lockPod(ctx, c.SandboxID)
	if err != nil {
		return nil, nil, err
	}
	c, found = r.container(full)
	if !found || c.State == ContainerCreating {
		unlock()
		return nil, nil, notFound("container", id)
	}
	return c, unlock, nil
}

// ContainerStatus returns a container.
func (r *Runtime) ContainerStatus(ctx context.Context, id string) (Container, error) {
	full, ok, err := r.resolveContainer(id)
	if err != nil {
		return Container{}, err
	}
	c, found := r.container(full)
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
func (r *Runtime) ListContainers(f ContainerFilter) []*Container {
	r.mu.RLock()
	out := make([]*Container, 0, len(r.containers))
	for _, c := range r.containers {
		if c.State == ContainerCreating ||
			(f.ID != "" && !strings.HasPrefix(c.ID, f.ID)) ||
			(f.SandboxID != "" && !strings.HasPrefix(c.SandboxID, f.SandboxID)) ||
			(f.State != "" && c.State != f.State) ||
			!matchLabels(c.Labels, f.LabelSelector) {
			continue
		}
		out = append(out, c)
	}
	r.mu.RUnlock()
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
