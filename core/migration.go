package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// Live migration of a VM pod's VM to another node (virtletctl migrate;
// docs/migration.md). The receiving pod, made by virtletctl on the target
// node with VirtletMigrateFrom naming the VM, defines an incoming VM with
// the migrating domain's identity and waits in StartContainer. The
// sending daemon, asked through the source pod's exec (MigrateVM), offers
// the VM to the receiving daemon (ports.MigrationPeers), which checks the
// offer against the receiving pod's annotation (ReceiveMigration) and
// answers with its endpoint; the sending hypervisor then moves the guest.
// The outcome ends the receiving StartContainer's wait: the guest runs
// there, or the receiving container fails and the guest runs on here.

// incomingTimeout bounds how long a receiving VM's StartContainer waits
// for its migration's outcome.
const incomingTimeout = 10 * time.Minute

// offerRetry is how often a sending daemon offers again while the
// receiving pod's VM is not defined yet, and offerPatience how long.
const (
	offerRetry    = time.Second
	offerPatience = 5 * time.Minute
)

// incomingWaits are the receiving VMs' migrations, by container ID.
type incomingWaits struct {
	mu sync.Mutex
	m  map[string]*incomingWait
}

type incomingWait struct {
	done    chan struct{}
	once    sync.Once
	err     error
	offered bool
}

// end reports the migration's outcome, once.
func (iw *incomingWait) end(err error) {
	iw.once.Do(func() {
		iw.err = err
		close(iw.done)
	})
}

func (w *incomingWaits) get(id string) *incomingWait {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]*incomingWait{}
	}
	iw := w.m[id]
	if iw == nil {
		iw = &incomingWait{done: make(chan struct{})}
		w.m[id] = iw
	}
	return iw
}

func (w *incomingWaits) forget(id string) {
	w.mu.Lock()
	delete(w.m, id)
	w.mu.Unlock()
}

// cancel ends the wait of receiving container id, if it waits: its pod
// is stopping.
func (w *incomingWaits) cancel(id string, why error) {
	w.mu.Lock()
	iw := w.m[id]
	w.mu.Unlock()
	if iw != nil {
		iw.end(why)
	}
}

// MigrationSource describes container id's running VM for a receiving
// pod's VirtletMigrateFrom (the node is the caller's to add).
func (r *accessService) MigrationSource(ctx context.Context, id string) (annotations.MigrationSource, error) {
	var out annotations.MigrationSource
	migrator, ok := r.deps.Hypervisor.(ports.VMMigrator)
	if !ok {
		return out, fmt.Errorf("live migration: the hypervisor plugin cannot migrate VMs: %w", ports.ErrUnimplemented)
	}
	c, err := r.vms.ContainerStatus(ctx, id)
	if err != nil {
		return out, err
	}
	if err := checkMigratable(&c); err != nil {
		return out, err
	}
	in, err := migrator.MigrationIdentity(ctx, c.ID)
	if err != nil {
		return out, fmt.Errorf("live migration of pod %s/%s: %w", c.Spec.PodNamespace, c.Spec.PodName, err)
	}
	out = annotations.MigrationSource{Pod: c.Spec.PodNamespace + "/" + c.Spec.PodName, UID: c.Spec.PodUID, Domain: in.Name, UUID: in.UUID}
	for _, n := range c.Spec.NICs {
		out.MACs = append(out.MACs, strings.ToLower(n.MAC))
	}
	return out, nil
}

// checkMigratable refuses a container whose VM does not run, or runs in
// a shape a migration does not move.
func checkMigratable(c *Container) error {
	pod := c.Spec.PodNamespace + "/" + c.Spec.PodName
	switch {
	case c.State != ContainerRunning:
		return fmt.Errorf("live migration: the VM of pod %s is %s, not running: %w", pod, c.State, ports.ErrFailedPrecondition)
	case c.Halted():
		return haltedError("live migration", c)
	case c.Spec.Incoming != nil && c.StartedAt.IsZero():
		return fmt.Errorf("live migration: the VM of pod %s is still arriving: %w", pod, ports.ErrFailedPrecondition)
	}
	return checkIncomingSpec("live migration of pod "+pod, c.Spec)
}

// checkIncomingSpec refuses, by name, what a live migration does not
// move: the root overlay is copied, the cloud-init medium comes with the
// receiving pod, and network disks (Ceph RBD, a Ceph root among them) are
// shared storage the receiving pod attaches itself; any other disk is
// the node's alone.
func checkIncomingSpec(what string, spec ports.VMSpec) error {
	refuse := func(field, why string) error {
		return fmt.Errorf("%s: %s: %s: %w", what, field, why, ports.ErrFailedPrecondition)
	}
	switch {
	case len(spec.Filesystems) > 0:
		return refuse("9p share "+spec.Filesystems[0].Tag, "a VM that shares a host directory is not live-migrated (QEMU cannot move a mounted 9p file system)")
	case spec.HugepageSizeBytes > 0:
		return refuse("hugepages", "a VM backed by hugepages is not live-migrated yet")
	case len(spec.CPUSet) > 0:
		return refuse("resources cpuset_cpus (pinned CPUs)", "a VM on pinned CPUs is not live-migrated: the pinning names this node's CPUs")
	case spec.Firmware == ports.FirmwareUEFI:
		return refuse("annotation "+annotations.Firmware+": uefi", "a VM's UEFI variable store is not moved yet")
	}
	for _, d := range spec.Disks {
		switch {
		case d.Serial == CIDataSerial, d.Source.Type == ports.SourceNetwork:
		case d.Name == "root" && d.Overlay == nil:
			return refuse("the persistent root volume", "its disk is this node's (a host block device): only a root overlay is copied, or a root on shared storage (Ceph) attached")
		case d.Name != "root":
			return refuse("volume disk "+d.Name, "a volume on this node's disks is not live-migrated (Ceph RBD volumes are)")
		}
	}
	return nil
}

// planIncoming makes a receiving pod's VM the migrating one: its identity,
// its NICs' MACs, and nothing a migration does not move.
func planIncoming(cr *creation) error {
	m := cr.opts.MigrateFrom
	field := "annotation " + annotations.MigrateFrom
	if cr.restore != nil {
		return &ports.InvalidError{Field: field, Reason: "the pod's image is a checkpoint: a VM is restored or migrated, not both"}
	}
	if len(m.MACs) != len(cr.spec.NICs) {
		return &ports.InvalidError{Field: field, Value: strings.Join(m.MACs, ","),
			Reason: fmt.Sprintf("it names %d NIC MACs and the pod gives the VM %d network interfaces: a running guest keeps its NICs", len(m.MACs), len(cr.spec.NICs))}
	}
	if err := checkIncomingSpec("pod "+cr.sb.Namespace+"/"+cr.sb.Name+" receiving the VM of "+m.Pod, cr.spec); err != nil {
		return err
	}
	cr.spec.Incoming = &ports.VMIncoming{Name: m.Domain, UUID: m.UUID}
	return nil
}

// defineIncoming defines a receiving pod's VM: the pod's network serves
// the migrating NICs' MACs, and the hypervisor prepares an empty overlay
// over the same image under the migrating domain's name.
func (r *vmService) defineIncoming(ctx context.Context, cr *creation) error {
	m := cr.opts.MigrateFrom
	// The volumes' disks are in the spec now.
	if err := checkIncomingSpec("pod "+cr.sb.Namespace+"/"+cr.sb.Name+" receiving the VM of "+m.Pod, cr.spec); err != nil {
		return err
	}
	before := cr.sb
	if err := r.adoptMACs(ctx, cr, m.MACs, "live migration from "+m.Pod); err != nil {
		return err
	}
	if err := r.deps.Hypervisor.Define(ctx, cr.spec); err != nil {
		if undo := r.unadoptMACs(context.WithoutCancel(ctx), before, cr.sb); undo != nil {
			r.log.WithError(undo).WithField("pod", before.Namespace+"/"+before.Name).Warn("live migration: give the pod's interfaces their own MACs back")
		}
		cr.sb = before
		return fmt.Errorf("define VM %s to receive the VM of %s: %w", cr.spec.Name, m.Pod, err)
	}
	vm, err := r.definedAs(ctx, &cr.spec)
	cr.vm = vm
	return err
}

// awaitIncoming waits, in StartContainer and without the pod's lock (so
// that the pod can be stopped meanwhile, which ends the wait), until the
// migration of receiving container c has ended.
func (r *vmService) awaitIncoming(ctx context.Context, c *Container) error {
	iw := r.incoming.get(c.ID)
	ctx, cancel := context.WithTimeout(ctx, incomingTimeout)
	defer cancel()
	select {
	case <-iw.done:
		r.incoming.forget(c.ID)
		if iw.err != nil {
			return fmt.Errorf("the live migration into VM %s failed (the VM runs on at its source): %w", c.Spec.Name, iw.err)
		}
		return nil
	case <-ctx.Done():
		// The migration goes on: its outcome starts the container
		// (takeArrived) or leaves it created.
		return fmt.Errorf("VM %s waits for a live migration that has not ended yet: %w", c.Spec.Name, ports.ErrUnavailable)
	}
}

// ReceiveMigration answers an offer from fromNode's daemon: the receiving
// pod's VM must be defined and waiting, and its VirtletMigrateFrom must
// name that node, the offered VM and its pod. done reports the outcome.
func (r *vmService) ReceiveMigration(ctx context.Context, fromNode string, offer ports.MigrationOffer) (ports.IncomingMigration, error) {
	var in ports.IncomingMigration
	migrator, ok := r.deps.Hypervisor.(ports.VMMigrator)
	if !ok {
		return in, fmt.Errorf("live migration: the hypervisor plugin cannot receive VMs: %w", ports.ErrUnimplemented)
	}
	var c *Container
	for _, sb := range r.sandboxes.list(func(s *Sandbox) bool { return s.UID == offer.ReceivingPodUID && s.State == SandboxReady }) {
		for _, cc := range r.containersOf(sb.ID) {
			if cc.Spec.Incoming != nil && cc.State == ContainerCreated {
				c = cc
			}
		}
		if c == nil {
			continue
		}
		opts, err := annotations.Parse(sb.Annotations)
		m := opts.MigrateFrom
		switch {
		case err != nil || m == nil:
			return in, fmt.Errorf("pod %s/%s names no VM to receive: %w", sb.Namespace, sb.Name, ports.ErrFailedPrecondition)
		case m.Node != fromNode || m.Pod != offer.SourcePod || m.UID != offer.SourcePodUID ||
			m.Domain != offer.VM.Name || !strings.EqualFold(m.UUID, offer.VM.UUID):
			return in, fmt.Errorf("pod %s/%s receives the VM %s of pod %s on node %s, not the VM %s of pod %s on node %s: %w",
				sb.Namespace, sb.Name, m.Domain, m.Pod, m.Node, offer.VM.Name, offer.SourcePod, fromNode, ports.ErrFailedPrecondition)
		}
		break
	}
	if c == nil {
		return in, fmt.Errorf("no VM of pod UID %s waits for a live migration on this node (yet): %w", offer.ReceivingPodUID, ports.ErrNotFound)
	}
	iw := r.incoming.get(c.ID)
	r.incoming.mu.Lock()
	if iw.offered {
		r.incoming.mu.Unlock()
		return in, fmt.Errorf("VM %s receives a live migration already: %w", c.Spec.Name, ports.ErrAlreadyExists)
	}
	iw.offered = true
	r.incoming.mu.Unlock()
	ep, err := migrator.IncomingEndpoint(ctx, c.ID)
	if err != nil {
		r.incoming.mu.Lock()
		iw.offered = false
		r.incoming.mu.Unlock()
		return in, fmt.Errorf("prepare VM %s for its live migration: %w", c.Spec.Name, err)
	}
	log := r.log.WithFields(logrus.Fields{"container": short(c.ID), "vm": c.Spec.Name, "from": offer.SourcePod, "node": fromNode})
	log.Info("live migration offered and accepted")
	id := c.ID
	return ports.IncomingMigration{
		Endpoint: ep, Domain: c.Spec.Incoming.Name,
		Check: func(ctx context.Context, domainXML string) (string, error) {
			return migrator.CheckArrival(ctx, id, domainXML)
		},
		Done: func(err error) {
			if err != nil {
				log.WithError(err).Warn("live migration failed")
				iw.end(err)
				return
			}
			iw.end(nil)
			// The guest is here: the container takes it even if its
			// StartContainer gave up waiting (kubelet's request timeout),
			// so that it is never left without a pod.
			go r.takeArrived(id, log)
		},
	}, nil
}

// takeArrived starts receiving container id with the guest that arrived,
// unless its StartContainer did already.
func (r *vmService) takeArrived(id string, log logrus.FieldLogger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, unlock, err := r.lockContainer(ctx, id)
	if err != nil {
		log.WithError(err).Warn("live migration: take the arrived guest")
		return
	}
	defer unlock()
	if c.State != ContainerCreated {
		return
	}
	if err := r.startLocked(ctx, c); err != nil {
		log.WithError(err).Warn("live migration: take the arrived guest")
		return
	}
	log.Info("live migration: the arrived guest is the container's")
}

// MigrateVM live-migrates container id's VM to the pod receivingPodUID on
// to's node. It holds the pod's lock throughout; on success the container
// has exited with reason Migrated.
func (r *accessService) MigrateVM(ctx context.Context, id string, to ports.MigrationPeer, receivingPodUID string) (ports.MigrationStats, error) {
	var st ports.MigrationStats
	migrator, ok := r.deps.Hypervisor.(ports.VMMigrator)
	if !ok {
		return st, fmt.Errorf("live migration: the hypervisor plugin cannot migrate VMs: %w", ports.ErrUnimplemented)
	}
	if r.deps.Migration == nil {
		return st, fmt.Errorf("live migration: this node's daemon has no migration endpoint (its config's migrationAddress): %w", ports.ErrUnimplemented)
	}
	c, unlock, err := r.vms.lockContainer(ctx, id)
	if err != nil {
		return st, err
	}
	defer unlock()
	if err := checkMigratable(c); err != nil {
		return st, err
	}
	pod := c.Spec.PodNamespace + "/" + c.Spec.PodName
	in, err := migrator.MigrationIdentity(ctx, c.ID)
	if err != nil {
		return st, fmt.Errorf("live migration of pod %s: %w", pod, err)
	}
	offer := ports.MigrationOffer{ReceivingPodUID: receivingPodUID, SourcePod: pod, SourcePodUID: c.Spec.PodUID, VM: in}
	log := r.log.WithFields(logrus.Fields{"pod": pod, "container": short(c.ID), "to": to.Node, "receivingPod": receivingPodUID})
	offerCtx, cancel := context.WithTimeout(ctx, offerPatience)
	defer cancel()
	var session ports.MigrationSession
	for {
		session, err = r.deps.Migration.Offer(offerCtx, to, offer, c.Spec.RunAs)
		if err == nil || !errors.Is(err, ports.ErrNotFound) {
			break
		}
		select {
		case <-offerCtx.Done():
			return st, fmt.Errorf("live migration of pod %s: node %s: %w", pod, to.Node, err)
		case <-time.After(offerRetry):
		}
	}
	if err != nil {
		return st, fmt.Errorf("live migration of pod %s: node %s: %w", pod, to.Node, err)
	}
	st, err = migrator.MigrateVM(ctx, c.ID, session.Endpoint())
	if err != nil {
		// An answer lost after the switchover (a timeout, an abort that
		// came too late) is no failure: libvirt says where the guest is.
		if s, serr := r.deps.Hypervisor.Status(context.WithoutCancel(ctx), c.ID); serr == nil && s.State == ports.VMStopped && s.Reason == ports.ReasonMigrated {
			log.WithError(err).Warn("live migration: the call failed after the guest had moved")
			err = nil
		}
	}
	session.Finish(err)
	if err != nil {
		return st, fmt.Errorf("live migration of pod %s to node %s: %w", pod, to.Node, err)
	}
	if s, serr := r.deps.Hypervisor.Status(context.WithoutCancel(ctx), c.ID); serr == nil && s.State == ports.VMStopped {
		exited := *c
		r.vms.applyExit(&exited, s)
		exited.Message = fmt.Sprintf("the guest moved to node %s by live migration (downtime %s)", to.Node, st.Downtime)
		if err := r.containers.put(context.WithoutCancel(ctx), &exited); err != nil {
			log.WithError(err).Warn("live migration: record the container's exit")
		}
	}
	if r.deps.Observer != nil {
		if o, ok := r.deps.Observer.(ports.MigrationObserver); ok {
			o.Migration(st)
		}
	}
	log.WithFields(logrus.Fields{"millis": st.Total.Milliseconds(), "downtimeMillis": st.Downtime.Milliseconds()}).Info("live migration done")
	return st, nil
}

// migratedAway reports whether a pod's VM has left by live migration: the
// pod is done, and no new container of it boots another VM.
func (r *vmService) migratedAway(sb *Sandbox) bool {
	return slices.ContainsFunc(r.containersOf(sb.ID), func(c *Container) bool {
		return c.State == ContainerExited && c.Reason == ports.ReasonMigrated
	})
}
