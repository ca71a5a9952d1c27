package core

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/core/cloudinit"
	"github.com/virtlet/virtlet/core/presets"
	"github.com/virtlet/virtlet/ports"
)

// creation is one CreateContainer: what its checks decided (the plan) and
// what its steps made. The undo steps read only c, the record, so that the
// reconciler can undo a creation a crash interrupted from its record.
type creation struct {
	rt        *vmService
	sb        *Sandbox
	cfg       ContainerConfig
	applied   presets.Applied
	opts      annotations.VMOptions
	img       *Image
	imagePath string
	volumes   volumePlan
	ds        ports.Datasource
	rootFiles []ports.GuestFile
	ciInput   cloudinit.Input
	rootfs    *ports.RootfsRequest
	restore   *restorePlan // the container's image is a checkpoint

	spec ports.VMSpec
	c    *Container
	vols preparedVolumes
	vm   ports.VMStatus
}

// createSteps are CreateContainer's side effects, after its record of
// intent is written (FPCreateRecorded) and before the record says created.
var createSteps = []step[creation]{{
	name: "volumes", failpoint: FPCreateVolumes, phase: fixedPhase[creation](ports.PhaseVolumes),
	do: func(ctx context.Context, cr *creation) error { return cr.rt.prepareVolumesOf(ctx, cr) },
	undo: func(ctx context.Context, cr *creation) error {
		return cr.rt.vols.releaseVolumes(ctx, cr.c)
	},
}, {
	name: "cloud-init media", failpoint: FPCreateMedia, phase: fixedPhase[creation](ports.PhaseCloudInit),
	do:   func(ctx context.Context, cr *creation) error { return cr.rt.buildMedia(ctx, cr) },
	undo: func(ctx context.Context, cr *creation) error { return cr.rt.removeMedia(ctx, cr.c) },
}, {
	name: "define", failpoint: FPCreateDefined,
	phase: func(cr *creation) ports.VMPhase {
		return pathPhase(cr.vm.Prelaunched, ports.PhaseDefine, ports.PhaseClaim)
	},
	do: func(ctx context.Context, cr *creation) error { return cr.rt.define(ctx, cr) },
	undo: func(ctx context.Context, cr *creation) error {
		if err := cr.rt.deps.Hypervisor.Undefine(ctx, cr.c.ID); err != nil && !errors.Is(err, ports.ErrNotFound) {
			return err
		}
		return nil
	},
}, {
	name: "write files", phase: fixedPhase[creation](ports.PhaseWriteFiles),
	// A restored VM's root disk holds them since its first creation.
	// So does a migrating one's, whose disk the migration copies.
	skip: func(cr *creation) bool { return len(cr.rootFiles) == 0 || cr.restore != nil || cr.spec.Incoming != nil },
	do:   func(ctx context.Context, cr *creation) error { return cr.rt.writeRootFiles(ctx, cr) },
	// The files are in the VM's root disk, which the define's undo removes.
}}

func (r *vmService) createLocked(ctx context.Context, sandboxID string, cfg ContainerConfig) (string, error) {
	sb, ok := r.sandboxes.get(sandboxID)
	if !ok {
		return "", notFound("sandbox", sandboxID)
	}
	pod := sb.Namespace + "/" + sb.Name
	if sb.State != SandboxReady {
		return "", fmt.Errorf("pod %s: sandbox %s is %s, not ready: %w", pod, short(sb.ID), sb.State, ports.ErrFailedPrecondition)
	}
	if id, err := r.existingContainer(sb, cfg); id != "" || err != nil {
		return id, err
	}
	cr, err := r.planCreation(ctx, sb, cfg)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	// The VM's own user, held by this creation until its record holds it.
	runAs, releaseUser, err := r.takeVMUser()
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	defer releaseUser()
	cr.spec.RunAs = runAs
	if other := r.uuidUser(cr.spec.UUID); cr.spec.UUID != "" && other != nil {
		return "", fmt.Errorf("pod %s: annotation %s: UUID %s is used by the VM of pod %s/%s; SMBIOS UUIDs must be unique on a node: %w",
			pod, annotations.SystemUUID, cr.spec.UUID, other.Spec.PodNamespace, other.Spec.PodName, ports.ErrFailedPrecondition)
	}
	id := cr.spec.ID
	image := ImageRef{Spec: cfg.Image, UserSpecified: cfg.UserImage, ID: cr.img.ID}
	if cr.restore != nil {
		image.ID, image.Base, image.BaseName = cr.restore.image.ID, cr.img.ID, cr.restore.meta.Image
	}
	cr.c = &Container{
		ID: id, SandboxID: sb.ID, Name: cfg.Name, Attempt: cfg.Attempt,
		Image:  image,
		Labels: cfg.Labels, Annotations: cfg.Annotations, LogPath: cfg.LogPath, Mounts: cfg.Mounts, Volumes: cr.volumes.uses,
		Spec: cr.spec, Datasource: cr.opts.CloudInitImageType, State: ContainerCreating, CreatedAt: r.opts.Now(),
	}
	log := r.log.WithFields(logrus.Fields{"pod": pod, "container": short(id), "vm": cr.spec.Name})
	// Record the intent before anything is made: after a crash the
	// reconciler finds a "creating" record and undoes what was done.
	if err := r.containers.put(ctx, cr.c); err != nil {
		return "", err
	}
	r.failpoint(FPCreateRecorded)
	if err, undoErr := runSteps(ctx, r.shared, createSteps, cr, log); err != nil {
		r.forgetCreation(ctx, cr.c, undoErr, log)
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	created := *cr.c
	created.Spec = cr.spec.WithoutSecrets()
	created.State = ContainerCreated
	created.Prelaunched = cr.vm.Prelaunched
	if err := r.containers.put(ctx, &created); err != nil {
		r.undoCreate(ctx, cr.c, log)
		return "", err
	}
	log.WithFields(logrus.Fields{"vcpus": cr.spec.VCPUs, "memory": cr.spec.MemoryBytes, "image": cr.img.ID, "volumes": len(cr.volumes.uses),
		"presets": strings.Join(cr.applied.Presets, ","), "domain": cr.spec.Name, "prelaunched": cr.vm.Prelaunched}).Info("VM defined")
	return id, nil
}

// existingContainer answers a CreateContainer the pod's records already
// answer: the same name and attempt again returns its ID; another
// container, or a new attempt while the VM still exists, is refused.
func (r *vmService) existingContainer(sb *Sandbox, cfg ContainerConfig) (string, error) {
	pod := sb.Namespace + "/" + sb.Name
	if r.migratedAway(sb) {
		return "", fmt.Errorf("pod %s: its VM moved to another node by live migration: the pod is done (virtletctl migrate deletes it): %w", pod, ports.ErrFailedPrecondition)
	}
	for _, c := range r.containersOf(sb.ID) {
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
	return "", nil
}

// planCreation reads and checks everything a VM is made from (presets,
// annotations, image, resources, volumes, cloud-init sources) and makes
// its spec; it changes nothing.
func (r *vmService) planCreation(ctx context.Context, sb *Sandbox, cfg ContainerConfig) (*creation, error) {
	cr := &creation{rt: r, sb: sb, cfg: cfg}
	var err error
	// The operator's presets under the pod's own annotations.
	if cr.applied, err = r.opts.Presets.Apply(sb.Labels, sb.Annotations, cfg.MemoryLimitBytes); err != nil {
		return nil, err
	}
	if cr.opts, err = annotations.Parse(cr.applied.Annotations); err != nil {
		return nil, err
	}
	if cr.img, err = r.imageForContainer(cfg); err != nil {
		return nil, err
	}
	cr.imagePath, err = r.deps.ImageFiles.Path(ctx, cr.img.ID)
	if errors.Is(err, ports.ErrNotFound) {
		return nil, fmt.Errorf("the data file of image %s (%s) is missing from the image store; remove the image and pull it again: %w",
			cr.img.ID, strings.Join(cr.img.Names, ", "), ports.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", cr.img.ID, err)
	}
	if cr.img.Format == ports.ImageFormatCheckpoint {
		if err := r.planRestore(ctx, cr); err != nil {
			return nil, err
		}
	}
	if cr.spec, err = r.vmSpec(sb, cfg, cr.opts, cr.applied, cr.img, cr.imagePath); err != nil {
		return nil, err
	}
	if cr.restore != nil {
		if err := checkRestore(cfg.UserImage, cr.spec, cr.restore.meta.VM); err != nil {
			return nil, err
		}
	}
	if cr.volumes, err = r.vols.planVolumes(ctx, cfg, cr.opts); err != nil {
		return nil, err
	}
	if cr.opts.MigrateFrom != nil {
		if err := planIncoming(cr); err != nil {
			return nil, err
		}
	}
	if err := r.checkCreation(cr); err != nil {
		return nil, err
	}
	if cr.restore != nil && cr.volumes.rootfs() != nil {
		return nil, restoreRefusal(cfg.UserImage, "persistent root filesystem "+rootVolume(cr.volumes.rootfs()),
			"a VM is restored over the checkpoint's root disk; a VM whose root is a volume is not checkpointed")
	}
	if cr.ds, err = r.ci.datasource(cr.opts); err != nil {
		return nil, err
	}
	if cr.rootFiles, err = r.ci.filesFromDataSource(ctx, sb, cr.opts); err != nil {
		return nil, err
	}
	if cr.ciInput, err = r.ci.cloudInitInput(ctx, sb, cr.opts, cfg, cr.volumes.projected); err != nil {
		return nil, err
	}
	// A persistent root keeps the network configuration of its first pod;
	// later pods get theirs by DHCP (Virtlet's persistent rootfs docs).
	root := cr.volumes.rootfs()
	cr.ciInput.PersistentRoot = root != nil
	if root != nil {
		cr.rootfs = &ports.RootfsRequest{ImagePath: cr.imagePath, ImageFormat: formatOr(cr.img.Format, "qcow2"), ImageDigest: cr.img.ID,
			ImageName: cfg.UserImage, ImageVirtualSize: cr.img.VirtualSize, Reinitialize: cr.opts.RootfsReinit}
	}
	return cr, nil
}

// vmSpec makes the spec of a container's VM from its resources and
// annotations: compute, memory, firmware, its root disk over the image, its
// NICs and console log.
func (r *vmService) vmSpec(sb *Sandbox, cfg ContainerConfig, opts annotations.VMOptions, applied presets.Applied, img *Image, imagePath string) (ports.VMSpec, error) {
	ann := applied.Annotations
	memory, err := r.memory(cfg, applied.MemoryBytes)
	if err != nil {
		return ports.VMSpec{}, err
	}
	hugepages, err := hugepageSize(cfg.HugepageLimits, memory)
	if err != nil {
		return ports.VMSpec{}, err
	}
	if err := checkMaxMemory(opts.MaxMemoryBytes, memory, hugepages, ann[annotations.MaxMemory]); err != nil {
		return ports.VMSpec{}, err
	}
	vcpus, err := bootVCPUs(opts, cfg.CPUQuota, cfg.CPUPeriod)
	if err != nil {
		return ports.VMSpec{}, err
	}
	cpuSet, err := ParseCPUList(cfg.CPUSet)
	if err != nil {
		return ports.VMSpec{}, &ports.InvalidError{Field: "resources cpuset_cpus", Value: cfg.CPUSet,
			Allowed: "a CPU list such as 1,3-5", Reason: err.Error()}
	}
	id := newContainerID()
	spec := ports.VMSpec{
		ID: id, Name: domainName(id, sb.Name), UUID: opts.SystemUUID,
		SandboxID: sb.ID, PodName: sb.Name, PodNamespace: sb.Namespace, PodUID: sb.UID,
		VCPUs: vcpus, MaxVCPUs: opts.MaxVCPUCount, MinVCPUs: opts.VCPUCount, MemoryBytes: memory, MaxMemoryBytes: max(opts.MaxMemoryBytes, memory), HugepageSizeBytes: hugepages,
		CPU: ports.CPUSpec{Model: opts.CPUModel, Setting: opts.CPUSetting}, Machine: opts.MachineType, Firmware: opts.Firmware, SecureBoot: opts.SecureBoot, HyperV: opts.HyperV, Clock: opts.Clock, Watchdog: opts.Watchdog, CPUSet: cpuSet,
		NoMemorySharing: opts.NoMemorySharing || r.opts.NoMemorySharing,
		CPULimits:       cpuLimits(cfg.CPUShares, cfg.CPUPeriod, cfg.CPUQuota),
		Disks: []ports.Disk{{
			Name: "root", Device: ports.DeviceDisk, Bus: opts.DiskDriver, Boot: true, Serial: RootSerial,
			Source: ports.DiskSource{Type: ports.SourceFile, Format: "qcow2"},
			Overlay: &ports.DiskOverlay{BasePath: imagePath, BaseFormat: formatOr(img.Format, "qcow2"), SizeBytes: opts.RootVolumeSize,
				KeepFreeBytes: r.opts.KeepFreeBytes},
		}},
	}
	spec.NICs = vmNICs(sb.Network)
	if sb.LogDirectory != "" && cfg.LogPath != "" {
		spec.ConsoleLogPath = filepath.Join(sb.LogDirectory, cfg.LogPath)
	}
	return spec, nil
}

// checkCreation refuses the combinations of annotations, volumes, image
// and node settings that cannot make a VM.
func (r *vmService) checkCreation(cr *creation) error {
	opts, ann := cr.opts, cr.applied.Annotations
	root := cr.volumes.rootfs()
	switch {
	case root != nil && opts.RootVolumeSize > 0:
		return &ports.InvalidError{
			Field: "annotation " + annotations.RootVolumeSize, Value: ann[annotations.RootVolumeSize],
			Reason:  fmt.Sprintf("the VM's root is the persistent root filesystem on %s, whose size is the volume's", rootVolume(root)),
			Allowed: "no " + annotations.RootVolumeSize + " with a persistent root filesystem"}
	case root == nil && opts.RootfsReinit:
		return &ports.InvalidError{
			Field: "annotation " + annotations.PersistentRootfsReinit, Value: ann[annotations.PersistentRootfsReinit],
			Reason:  "the pod has no persistent root filesystem",
			Allowed: "only with a block volume at devicePath \"/\" or a flexvolume with rootfs: \"true\""}
	case r.opts.MaxVirtualBytes > 0 && opts.RootVolumeSize > r.opts.MaxVirtualBytes:
		return &ports.InvalidError{
			Field: "annotation " + annotations.RootVolumeSize, Value: ann[annotations.RootVolumeSize],
			Reason:  fmt.Sprintf("more than the %d bytes the node allows a disk (maxVirtualSize)", r.opts.MaxVirtualBytes),
			Allowed: fmt.Sprintf("at most %d bytes", r.opts.MaxVirtualBytes)}
	case opts.Watchdog != nil && opts.Watchdog.Action == "dump" && !r.opts.AllowWatchdogDump:
		return &ports.InvalidError{
			Field: "annotation " + annotations.WatchdogAction, Value: "dump",
			Reason:  "this node's operator has not enabled memory dumps (the daemon's allowWatchdogDump): a dump writes the guest's memory to the node's disk",
			Allowed: "reset, poweroff or shutdown"}
	case opts.RootVolumeSize > 0 && opts.RootVolumeSize < cr.img.VirtualSize:
		return &ports.InvalidError{
			Field: "annotation " + annotations.RootVolumeSize, Value: ann[annotations.RootVolumeSize],
			Reason:  fmt.Sprintf("smaller than the image's virtual size (%d bytes)", cr.img.VirtualSize),
			Allowed: "a size of at least the image's virtual size (the root disk can grow, not shrink)"}
	}
	return nil
}

// prepareVolumesOf has the volume plugins prepare the VM's volumes and
// puts their disks and shares into its spec.
func (r *vmService) prepareVolumesOf(ctx context.Context, cr *creation) error {
	vols, err := r.vols.prepareVolumes(ctx, cr.c, cr.opts.DiskDriver, cr.rootfs)
	if err != nil {
		return err
	}
	cr.vols = vols
	if vols.root != nil {
		cr.spec.Disks[0] = *vols.root
	}
	cr.spec.Disks = append(cr.spec.Disks, vols.disks...)
	cr.spec.Filesystems = vols.filesystems
	cr.ciInput.Volumes = guestVolumes(cr.volumes.uses, vols.formats, cr.opts.DiskDriver)
	return nil
}

// buildMedia has the datasource plugin make the VM's cloud-init medium
// and adds it to the spec's disks.
func (r *vmService) buildMedia(ctx context.Context, cr *creation) error {
	ci, err := cloudinit.Build(cr.ciInput)
	if err != nil {
		return err
	}
	media, err := cr.ds.BuildMedia(ctx, ports.MediaRequest{VMID: cr.spec.ID, Datasource: cr.opts.CloudInitImageType,
		MetaData: ci.MetaData, UserData: ci.UserData, NetworkConfig: ci.NetworkConfig, Network: ci.Network})
	if err != nil {
		return fmt.Errorf("build %s cloud-init media: %w", cr.opts.CloudInitImageType, err)
	}
	media.Serial = CIDataSerial
	cr.spec.Disks = append(cr.spec.Disks, cloudInitDisk(media, cr.opts.DiskDriver))
	return checkDiskCount(cr.spec.Disks)
}

// define has the hypervisor define the VM; a restored one over the
// checkpoint's state and root disk, unpacked for the while.
func (r *vmService) define(ctx context.Context, cr *creation) error {
	if cr.restore != nil {
		return r.defineRestored(ctx, cr)
	}
	if cr.spec.Incoming != nil {
		return r.defineIncoming(ctx, cr)
	}
	if err := r.deps.Hypervisor.Define(ctx, cr.spec); err != nil {
		return fmt.Errorf("define VM %s: %w", cr.spec.Name, err)
	}
	vm, err := r.definedAs(ctx, &cr.spec)
	cr.vm = vm
	return err
}

// writeRootFiles writes VirtletFilesFromDataSource's files into the VM's
// root file system.
func (r *vmService) writeRootFiles(ctx context.Context, cr *creation) error {
	if err := r.deps.Hypervisor.WriteFiles(ctx, cr.spec.ID, cr.rootFiles); err != nil {
		return fmt.Errorf("annotation %s: write the files of %s into the root file system: %w",
			annotations.FilesFromDataSource, cr.opts.FilesFromDataSource, err)
	}
	// Writing a pre-launched VM's root disk ends its paused process.
	vm, err := r.definedAs(ctx, &cr.spec)
	cr.vm = vm
	return err
}
