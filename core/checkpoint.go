package core

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// Checkpoints (CRI CheckpointContainer; kubelet's checkpoint API): a
// running VM's memory and device state and its writable disks, with the
// pod's and container's metadata, in one archive at the place kubelet
// names. The VM is paused only while its state is written, and runs on.

// CheckpointContainer writes a checkpoint of container id's running VM to
// location within timeout (0: the runtime's operation timeout). It holds
// the pod's lock meanwhile: no other operation on the pod runs during a
// checkpoint.
func (r *accessService) CheckpointContainer(ctx context.Context, id, location string, timeout time.Duration) (ports.CheckpointArchive, error) {
	var out ports.CheckpointArchive
	checkpointer, ok := r.deps.Hypervisor.(ports.VMCheckpointer)
	if !ok {
		return out, fmt.Errorf("checkpoint: the hypervisor plugin cannot checkpoint VMs: %w", ports.ErrUnimplemented)
	}
	if r.deps.Checkpoints == nil {
		return out, fmt.Errorf("checkpoint: the daemon has no checkpoint archiver: %w", ports.ErrUnimplemented)
	}
	if location == "" {
		return out, &ports.InvalidError{Field: "location", Reason: "it is empty", Allowed: "the absolute path of the archive to write"}
	}
	if timeout <= 0 {
		timeout = r.opts.OperationTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, unlock, err := r.vms.lockContainer(ctx, id)
	if err != nil {
		return out, err
	}
	defer unlock()
	if c.State != ContainerRunning {
		return out, fmt.Errorf("checkpoint: the VM %s of pod %s/%s is %s, not running: %w",
			c.Spec.Name, c.Spec.PodNamespace, c.Spec.PodName, c.State, ports.ErrFailedPrecondition)
	}
	if c.Halted() {
		return out, haltedError("checkpoint", c)
	}
	meta := r.checkpointMeta(c)
	log := r.log.WithFields(logrus.Fields{"pod": c.Spec.PodNamespace + "/" + c.Spec.PodName, "container": short(c.ID), "location": location})
	begin := r.opts.Now()
	out, err = r.deps.Checkpoints.WriteCheckpoint(ctx, location, meta, func(ctx context.Context, dir string) (ports.VMCheckpoint, error) {
		return checkpointer.CheckpointVM(ctx, c.ID, dir)
	})
	if err != nil {
		log.WithError(err).Warn("checkpoint failed")
		return out, fmt.Errorf("checkpoint of pod %s/%s: %w", c.Spec.PodNamespace, c.Spec.PodName, err)
	}
	log.WithFields(logrus.Fields{"bytes": out.Bytes, "pausedMillis": out.Checkpoint.Paused.Milliseconds(),
		"millis": r.opts.Now().Sub(begin).Milliseconds()}).Info("checkpoint written")
	return out, nil
}

// checkpointMeta describes c and its pod for the archive.
func (r *accessService) checkpointMeta(c *Container) ports.CheckpointMeta {
	m := ports.CheckpointMeta{ContainerID: c.ID, ContainerName: c.Name, Attempt: c.Attempt, SandboxID: c.SandboxID,
		PodName: c.Spec.PodName, PodNamespace: c.Spec.PodNamespace, PodUID: c.Spec.PodUID,
		Image: c.Image.UserSpecified, ImageID: c.Image.ID, Labels: c.Labels, Annotations: c.Annotations,
		CreatedAt: c.CreatedAt, CheckpointedAt: r.opts.Now().UTC(), VM: c.Spec.WithoutSecrets()}
	if c.Image.Base != "" { // a restored VM: its disk overlays the base
		m.Image, m.ImageID = c.Image.BaseName, c.Image.Base
	}
	if img, ok := r.images.get(m.ImageID); ok {
		// A restore pulls the image by this name: the one the container
		// was created by unless that was the ID (a CRI client may create
		// by ID), else the first the image was pulled as.
		if _, err := ParseImageName(m.Image); err != nil && len(img.Names) > 0 {
			m.Image = img.Names[0]
		}
		repos := make([]string, 0, len(img.ManifestDigests))
		for repo := range img.ManifestDigests {
			repos = append(repos, repo)
		}
		sort.Strings(repos)
		if len(repos) > 0 {
			m.ImageRef = repos[0] + "@" + img.ManifestDigests[repos[0]]
		}
	}
	if sb, ok := r.sandboxes.get(c.SandboxID); ok {
		m.PodAnnotations = sb.Annotations
		m.IPs = sb.IPs()
	}
	return m
}
