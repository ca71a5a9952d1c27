package core

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// Restores (CRI-O's way: there is no restore RPC; CreateContainer restores
// when the container's image is a checkpoint archive). The new pod's spec
// makes the VM, as for any container; the checkpoint gives it its state,
// its root disk and its identity (domain name, UUID, NIC MACs: a running
// guest's cannot change). What the two disagree on is refused by name, as
// is what a checkpoint cannot carry; nothing is half-restored.

// restorePlan is what a restore takes from the checkpoint.
type restorePlan struct {
	image   *Image // the checkpoint image
	archive string // its file
	meta    ports.CheckpointMeta
	cp      ports.VMCheckpoint
}

// planRestore reads the checkpoint the container's image is, and makes the
// base image of its root disk the one the VM's spec is made over.
func (r *vmService) planRestore(ctx context.Context, cr *creation) error {
	reader, ok := r.deps.Checkpoints.(ports.CheckpointReader)
	if !ok {
		return fmt.Errorf("image %s is a VM checkpoint, and this daemon cannot restore checkpoints: %w", cr.cfg.UserImage, ports.ErrUnimplemented)
	}
	meta, cp, err := reader.ReadCheckpoint(ctx, cr.imagePath)
	if err != nil {
		return fmt.Errorf("image %s: %w", cr.cfg.UserImage, err)
	}
	plan := &restorePlan{image: cr.img, archive: cr.imagePath, meta: meta, cp: cp}
	for _, d := range cp.Disks {
		if d.Name != "root" {
			return fmt.Errorf("restore from %s: the checkpoint holds the VM's volume disk %s: restoring volumes is not implemented yet (only the root disk is): %w",
				cr.cfg.UserImage, d.Name, ports.ErrUnimplemented)
		}
	}
	if !slices.ContainsFunc(cp.Disks, func(d ports.CheckpointDisk) bool { return d.Name == "root" }) {
		return fmt.Errorf("restore from %s: the checkpoint holds no root disk: %w", cr.cfg.UserImage, ports.ErrInvalidArgument)
	}
	// The root disk's copy holds what the guest changed over its image:
	// that very image (by content) must be under it. The archive names it,
	// and the archive is anyone's: the image is pulled by its name, as any
	// pod's without credentials, every time, and must have that digest. An
	// image merely present on the node is never used: it may be another
	// tenant's, pulled with credentials this pod does not have.
	if !fullDigest.MatchString(meta.ImageID) || meta.Image == "" {
		return fmt.Errorf("restore from %s: the checkpoint names its root disk's image as %q (%q): want a name and its sha256 digest: %w",
			cr.cfg.UserImage, meta.Image, meta.ImageID, ports.ErrInvalidArgument)
	}
	if _, err := ParseImageName(meta.Image); err != nil {
		return fmt.Errorf("restore from %s: the checkpoint's root disk image: %w", cr.cfg.UserImage, err)
	}
	r.log.WithFields(logrus.Fields{"image": meta.Image, "id": meta.ImageID}).Info("restore: pulling the image the checkpoint's root disk overlays")
	pulledID, err := r.imgs.PullImage(ctx, meta.Image, nil)
	if err != nil {
		return fmt.Errorf("restore from %s: pull %s, the image the checkpoint's root disk overlays (without credentials: a restore cannot be over a private image yet): %w",
			cr.cfg.UserImage, meta.Image, err)
	}
	base, ok := r.images.get(pulledID)
	switch {
	case pulledID != meta.ImageID || !ok:
		return fmt.Errorf("restore from %s: the checkpoint's root disk overlays image %s, and %s is now %s: the guest's disk cannot be put back over other data: %w",
			cr.cfg.UserImage, meta.ImageID, meta.Image, pulledID, ports.ErrFailedPrecondition)
	case base.Format == ports.ImageFormatCheckpoint:
		return fmt.Errorf("restore from %s: its root disk names another checkpoint as its image: %w", cr.cfg.UserImage, ports.ErrInvalidArgument)
	}
	basePath, err := r.deps.ImageFiles.Path(ctx, base.ID)
	if err != nil {
		return fmt.Errorf("restore from %s: image %s: %w", cr.cfg.UserImage, base.ID, err)
	}
	cr.restore, cr.img, cr.imagePath = plan, base, basePath
	return nil
}

// checkRestore refuses a restore whose new VM differs from the
// checkpointed one where a running guest cannot follow, naming the field
// and both values.
func checkRestore(image string, spec ports.VMSpec, from ports.VMSpec) error {
	type field struct {
		name      string
		pod, cp   any
		otherwise string
	}
	mib := func(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }
	fields := []field{
		{"resources.limits.memory (the VM's memory)", mib(spec.MemoryBytes), mib(from.MemoryBytes), ""},
		{"annotation " + annotations.MaxMemory, mib(spec.MaxMemoryBytes), mib(from.MaxMemoryBytes), ""},
		{"annotation " + annotations.VCPUCount + " (the VM's vCPUs)", spec.VCPUs, from.VCPUs, ""},
		{"annotation " + annotations.MaxVCPUCount, spec.MaxVCPUs, from.MaxVCPUs, ""},
		{"annotation " + annotations.MachineType, machineName(spec.Machine), machineName(from.Machine), ""},
		{"annotation " + annotations.Firmware, firmwareName(spec.Firmware), firmwareName(from.Firmware), ""},
		{"annotation " + annotations.SecureBoot, spec.SecureBoot, from.SecureBoot, ""},
		{"annotation " + annotations.CPUModel, spec.CPU, from.CPU, ""},
		{"annotation " + annotations.HyperV, spec.HyperV, from.HyperV, ""},
		{"the pod's network interfaces", len(spec.NICs), len(from.NICs), ""},
	}
	for _, f := range fields {
		if !reflect.DeepEqual(f.pod, f.cp) {
			return &ports.InvalidError{Field: f.name, Value: fmt.Sprint(f.pod),
				Reason:  fmt.Sprintf("the VM restored from %s was checkpointed with %v; a running guest keeps its virtual hardware", image, f.cp),
				Allowed: fmt.Sprint(f.cp)}
		}
	}
	switch {
	case spec.HugepageSizeBytes > 0 || from.HugepageSizeBytes > 0:
		return restoreRefusal(image, "hugepages", "a VM backed by hugepages is not restored (the node's hugepages are reserved per pod, and the saved memory is not laid out for them)")
	case len(spec.CPUSet) > 0 || len(from.CPUSet) > 0:
		return restoreRefusal(image, "resources cpuset_cpus (pinned CPUs)", "a VM on pinned CPUs is not restored: the checkpoint's pinning names another node's CPUs")
	case len(spec.Filesystems) > 0 || len(from.Filesystems) > 0:
		return restoreRefusal(image, "9p share", "a VM that shares a host directory (9p) is neither checkpointed nor restored")
	case spec.Firmware == ports.FirmwareUEFI:
		return restoreRefusal(image, "annotation "+annotations.Firmware+": uefi", "a checkpoint does not hold a VM's UEFI variable store yet")
	}
	return nil
}

func machineName(m string) string {
	if m == "" {
		return "pc"
	}
	return m
}

func firmwareName(f string) string {
	if f == "" {
		return "bios"
	}
	return f
}

func restoreRefusal(image, what, why string) error {
	return fmt.Errorf("restore from %s: %s: %s: %w", image, what, why, ports.ErrFailedPrecondition)
}

// checkRestoredDisks refuses a VM whose disks (root, volumes, cloud-init
// media) are not the checkpointed VM's, by name.
func checkRestoredDisks(image string, spec ports.VMSpec, cp ports.VMCheckpoint) error {
	var want, got []string
	for _, d := range cp.Disks {
		want = append(want, d.Name)
	}
	for _, d := range cp.Skipped {
		want = append(want, d.Name)
	}
	for _, d := range spec.Disks {
		got = append(got, d.Name)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		return fmt.Errorf("restore from %s: the pod gives the VM the disks %s, the checkpointed VM had %s: a running guest keeps its disks: %w",
			image, strings.Join(got, ", "), strings.Join(want, ", "), ports.ErrFailedPrecondition)
	}
	return nil
}

// adoptMACs has the pod's network serve the checkpointed VM's NIC MACs,
// and gives them to the spec's NICs.
func (r *vmService) adoptMACs(ctx context.Context, cr *creation, macs []string, what string) error {
	if len(macs) == 0 {
		return nil
	}
	adopter, ok := r.deps.Network.(ports.MACAdopter)
	if !ok {
		return fmt.Errorf("%s: the network plugin cannot give the pod's interfaces the VM's MACs: %w", what, ports.ErrUnimplemented)
	}
	sb := cr.sb
	att, err := adopter.AdoptMACs(ctx, networkRequest(sb), macs)
	if err != nil {
		return fmt.Errorf("%s: give the pod's interfaces the VM's MACs: %w", what, err)
	}
	updated := *sb
	updated.Network = &att
	if err := r.sandboxes.put(ctx, &updated); err != nil {
		return err
	}
	cr.sb = &updated
	for i := range cr.spec.NICs {
		cr.spec.NICs[i].MAC = macs[i]
	}
	return nil
}

// defineRestored defines the VM of a restore: the pod's network takes the
// checkpointed NICs' MACs, the checkpoint is unpacked, and the hypervisor
// takes its state and root disk over.
func (r *vmService) defineRestored(ctx context.Context, cr *creation) error {
	image := cr.cfg.UserImage
	if err := checkRestoredDisks(image, cr.spec, cr.restore.cp); err != nil {
		return err
	}
	var macs []string
	for _, n := range cr.restore.meta.VM.NICs {
		macs = append(macs, n.MAC)
	}
	if err := r.adoptMACs(ctx, cr, macs, "restore from "+image); err != nil {
		return err
	}
	before := cr.sb
	reader := r.deps.Checkpoints.(ports.CheckpointReader) // planRestore checked
	err := reader.UnpackCheckpoint(ctx, cr.restore.archive, func(ctx context.Context, from ports.VMRestore) error {
		spec := cr.spec
		spec.Restore = &from
		if err := r.deps.Hypervisor.Define(ctx, spec); err != nil {
			return fmt.Errorf("restore VM %s from %s: %w", cr.spec.Name, image, err)
		}
		return nil
	})
	if err != nil {
		// Nothing half-restored: the pod's network serves its own MACs again.
		if undo := r.unadoptMACs(context.WithoutCancel(ctx), before, cr.sb); undo != nil {
			r.log.WithError(undo).WithField("pod", before.Namespace+"/"+before.Name).Warn("restore: give the pod's interfaces their own MACs back")
		}
		cr.sb = before
		return err
	}
	vm, err := r.definedAs(ctx, &cr.spec)
	cr.vm = vm
	return err
}

// unadoptMACs gives a pod's interfaces back the MACs they had before
// adoptMACs (before), when it changed them (now).
func (r *vmService) unadoptMACs(ctx context.Context, before, now *Sandbox) error {
	if now == before || before.Network == nil {
		return nil
	}
	adopter, ok := r.deps.Network.(ports.MACAdopter)
	if !ok {
		return nil
	}
	var macs []string
	for _, iface := range before.Network.Interfaces {
		macs = append(macs, iface.MAC)
	}
	if _, err := adopter.AdoptMACs(ctx, networkRequest(before), macs); err != nil {
		return err
	}
	return r.sandboxes.put(ctx, before)
}
