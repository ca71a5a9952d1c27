package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// sandboxService runs, stops and removes pod sandboxes: a VM pod's
// network and its record. A sandbox's VM is vms'.
type sandboxService struct {
	*shared
	vms *vmService
}

// RuntimeHandler is the RuntimeClass handler that marks a pod as a VM pod.
const RuntimeHandler = "virtlet"

// SandboxConfig is what kubelet asks for in RunPodSandbox.
type SandboxConfig struct {
	Name           string
	Namespace      string
	UID            string
	Attempt        uint32
	Hostname       string
	LogDirectory   string
	RuntimeHandler string
	Labels         map[string]string
	Annotations    map[string]string
	DNS            *ports.DNSConfig
	PortMappings   []ports.PortMapping
	// HostNetwork is set for pods with hostNetwork: true.
	HostNetwork bool
}

// ErrNotVMPod is wrapped by the errors refusing pods that are not VM pods.
var ErrNotVMPod = errors.New("not a VM pod")

// ClaimsPod tells whether a pod asks for Virtlet at RunPodSandbox: it carries
// the target-runtime annotation with Virtlet's value, or it runs with the
// virtlet RuntimeClass handler. A pod that does neither is a container pod,
// which a node may forward to a container runtime; a pod that does either is
// Virtlet's, valid or not (RunSandbox refuses an invalid one with the reason).
func ClaimsPod(podAnnotations map[string]string, runtimeHandler string) bool {
	return runtimeHandler == RuntimeHandler || podAnnotations[annotations.TargetRuntime] == annotations.TargetRuntimeValue
}

// checkVMPod applies the VM pod rules (docs/vm-pods.md) that RunPodSandbox can see:
// the pod carries the target-runtime annotation or runs with the virtlet
// RuntimeClass handler, and does not use the host's network.
func checkVMPod(cfg SandboxConfig) error {
	pod := cfg.Namespace + "/" + cfg.Name
	target, hasTarget := cfg.Annotations[annotations.TargetRuntime]
	switch {
	case cfg.RuntimeHandler != "" && cfg.RuntimeHandler != RuntimeHandler:
		return fmt.Errorf("pod %s: %w: runtime handler %q is not %q; Virtlet runs only VM pods: %w",
			pod, ErrNotVMPod, cfg.RuntimeHandler, RuntimeHandler, ports.ErrInvalidArgument)
	case cfg.RuntimeHandler == RuntimeHandler:
	case hasTarget && target == annotations.TargetRuntimeValue:
	case hasTarget:
		return fmt.Errorf("pod %s: %w: annotation %s is %q, not %q: %w",
			pod, ErrNotVMPod, annotations.TargetRuntime, target, annotations.TargetRuntimeValue, ports.ErrInvalidArgument)
	default:
		return fmt.Errorf("pod %s: %w: it has neither the annotation %s: %s nor the runtime handler %q "+
			"(Virtlet runs only VM pods; run container pods with a container runtime): %w",
			pod, ErrNotVMPod, annotations.TargetRuntime, annotations.TargetRuntimeValue, RuntimeHandler, ports.ErrInvalidArgument)
	}
	if cfg.HostNetwork {
		return fmt.Errorf("pod %s: hostNetwork is not supported for VM pods (a VM cannot share the node's network namespace): %w",
			pod, ports.ErrInvalidArgument)
	}
	if cfg.UID == "" || cfg.Name == "" || cfg.Namespace == "" {
		return fmt.Errorf("pod metadata needs name, namespace and uid: %w", ports.ErrInvalidArgument)
	}
	return nil
}

// RunSandbox creates a VM pod (its network; the VM comes with
// CreateContainer) and returns its ID. Running a pod that exists returns its
// ID again.
func (r *sandboxService) RunSandbox(ctx context.Context, cfg SandboxConfig) (string, error) {
	if err := checkVMPod(cfg); err != nil {
		return "", err
	}
	id := SandboxID(cfg.Namespace, cfg.Name, cfg.UID, cfg.Attempt)
	log := r.log.WithFields(logrus.Fields{"sandbox": short(id), "pod": cfg.Namespace + "/" + cfg.Name})
	err := r.detached(ctx, func(ctx context.Context) error {
		unlock, err := r.lockPod(ctx, id)
		if err != nil {
			return err
		}
		defer unlock()
		if sb, ok := r.sandboxes.get(id); ok && sb.State != SandboxPending {
			log.Debug("sandbox exists; returning it")
			return nil
		}
		sb := &Sandbox{
			ID: id, Name: cfg.Name, Namespace: cfg.Namespace, UID: cfg.UID, Attempt: cfg.Attempt,
			Hostname: cfg.Hostname, LogDirectory: cfg.LogDirectory, RuntimeHandler: cfg.RuntimeHandler,
			Labels: cfg.Labels, Annotations: cfg.Annotations, DNS: cfg.DNS, PortMappings: cfg.PortMappings,
			State: SandboxPending, CreatedAt: r.opts.Now(),
		}
		if err := r.sandboxes.put(ctx, sb); err != nil {
			return err
		}
		r.failpoint(FPSandboxRecorded)
		run := &sandboxRun{rt: r, sb: sb, log: log}
		if err, _ := runSteps(ctx, r.shared, runSandboxSteps, run, log); err != nil {
			// A network plugin retries a teardown that failed (logged by
			// the undo); the pending record goes, and kubelet retries.
			if cerr := r.sandboxes.delete(ctx, id); cerr != nil {
				log.WithError(cerr).Error("forget failed sandbox")
			}
			return err
		}
		ready := *sb
		ready.Network = run.att
		ready.State = SandboxReady
		if err := r.sandboxes.put(ctx, &ready); err != nil {
			return err
		}
		log.Info("sandbox ready")
		return nil
	})
	if err != nil {
		return "", err
	}
	return id, nil
}

// sandboxRun is one RunPodSandbox: its pending record and what its steps
// made.
type sandboxRun struct {
	rt  *sandboxService
	sb  *Sandbox
	att *ports.NetworkAttachment
	log logrus.FieldLogger
}

// runSandboxSteps are RunPodSandbox's side effects, after its pending
// record is written (FPSandboxRecorded) and before it says ready.
var runSandboxSteps = []step[sandboxRun]{{
	name: "network", failpoint: FPSandboxNetworked,
	phase: func(s *sandboxRun) ports.VMPhase {
		if s.att == nil {
			return "" // no network plugin: nothing was set up
		}
		return ports.PhaseNetwork
	},
	do: func(ctx context.Context, s *sandboxRun) (err error) {
		s.att, err = s.rt.setupNetwork(ctx, s.sb)
		return err
	},
	undo: func(ctx context.Context, s *sandboxRun) error { return s.rt.teardownNetwork(ctx, s.sb, s.log) },
}}

func (r *sandboxService) setupNetwork(ctx context.Context, sb *Sandbox) (*ports.NetworkAttachment, error) {
	if r.deps.Network == nil {
		return nil, nil
	}
	att, err := r.deps.Network.Setup(ctx, networkRequest(sb))
	if err != nil {
		return nil, fmt.Errorf("set up network of pod %s/%s: %w", sb.Namespace, sb.Name, err)
	}
	if err := att.Validate(); err != nil {
		return nil, fmt.Errorf("network of pod %s/%s: the network plugin's attachment: %w", sb.Namespace, sb.Name, err)
	}
	return &att, nil
}

func (r *sandboxService) teardownNetwork(ctx context.Context, sb *Sandbox, log logrus.FieldLogger) error {
	if r.deps.Network == nil {
		return nil
	}
	if err := r.deps.Network.Teardown(ctx, networkRequest(sb)); err != nil {
		log.WithError(err).Warn("tear down pod network")
		return fmt.Errorf("tear down network of pod %s/%s: %w", sb.Namespace, sb.Name, err)
	}
	return nil
}

func networkRequest(sb *Sandbox) ports.NetworkRequest {
	return ports.NetworkRequest{
		SandboxID: sb.ID, PodName: sb.Name, PodNamespace: sb.Namespace, PodUID: sb.UID,
		DNS: sb.DNS, PortMappings: sb.PortMappings, Annotations: sb.Annotations,
	}
}

// StopSandbox forces the pod's VM off if it still runs (kubelet normally
// stopped it gracefully before) and tears the pod's network down. Stopping
// a stopped or unknown sandbox succeeds.
func (r *sandboxService) StopSandbox(ctx context.Context, id string) error {
	full, ok, err := r.resolveSandbox(id)
	if err != nil || !ok {
		return err
	}
	unlock, err := r.lockPod(ctx, full)
	if err != nil {
		return err
	}
	defer unlock()
	sb, ok := r.sandboxes.get(full)
	if !ok {
		return nil
	}
	log := r.log.WithFields(logrus.Fields{"sandbox": short(full), "pod": sb.Namespace + "/" + sb.Name})
	for _, c := range r.containersOf(full) {
		if c.Spec.Incoming != nil && c.State == ContainerCreated {
			// A migration into the pod ends before its network goes (the
			// guest runs on at its source).
			r.vms.incoming.cancel(c.ID, errors.New("the receiving pod was stopped"))
			if _, err := r.deps.Hypervisor.Stop(ctx, c.ID, 0); err != nil && !errors.Is(err, ports.ErrNotFound) {
				return fmt.Errorf("end the migration into sandbox %s: %w", short(full), err)
			}
		}
		if c.State == ContainerRunning {
			if err := r.vms.stopLocked(ctx, c, 0); err != nil {
				return fmt.Errorf("stop VM of sandbox %s: %w", short(full), err)
			}
		}
	}
	if sb.State == SandboxNotReady {
		return nil
	}
	if err := r.teardownNetwork(ctx, sb, log); err != nil {
		return err
	}
	r.failpoint(FPStopSandboxDown)
	stopped := *sb
	stopped.State = SandboxNotReady
	stopped.Network = nil
	if err := r.sandboxes.put(ctx, &stopped); err != nil {
		return err
	}
	log.Info("sandbox stopped")
	return nil
}

// RemoveSandbox removes the pod's VM (if kubelet did not), its network and
// its records. Removing an unknown sandbox succeeds.
func (r *sandboxService) RemoveSandbox(ctx context.Context, id string) error {
	full, ok, err := r.resolveSandbox(id)
	if err != nil || !ok {
		return err
	}
	unlock, err := r.lockPod(ctx, full)
	if err != nil {
		return err
	}
	defer unlock()
	sb, ok := r.sandboxes.get(full)
	if !ok {
		return nil
	}
	log := r.log.WithFields(logrus.Fields{"sandbox": short(full), "pod": sb.Namespace + "/" + sb.Name})
	for _, c := range r.containersOf(full) {
		if err := r.vms.removeLocked(ctx, c); err != nil {
			return fmt.Errorf("remove VM of sandbox %s: %w", short(full), err)
		}
	}
	r.failpoint(FPRemoveSandboxVMs)
	if sb.State != SandboxNotReady {
		if err := r.teardownNetwork(ctx, sb, log); err != nil {
			return err
		}
	}
	r.failpoint(FPRemoveSandboxDown)
	if err := r.sandboxes.delete(ctx, full); err != nil {
		return err
	}
	log.Info("sandbox removed")
	return nil
}

// SandboxStatus returns a sandbox.
func (r *sandboxService) SandboxStatus(ctx context.Context, id string) (Sandbox, error) {
	full, ok, err := r.resolveSandbox(id)
	if err != nil {
		return Sandbox{}, err
	}
	sb, found := r.sandboxes.get(full)
	if !ok || !found || sb.State == SandboxPending {
		return Sandbox{}, notFound("sandbox", id)
	}
	return *sb, nil
}

// SandboxFilter selects sandboxes; zero fields match everything.
type SandboxFilter struct {
	ID            string // ID or prefix
	State         SandboxState
	LabelSelector map[string]string
}

// ListSandboxes returns the sandboxes matching f, newest first. The
// records are shared immutable snapshots: callers must not modify them.
func (r *sandboxService) ListSandboxes(f SandboxFilter) []*Sandbox {
	out := r.sandboxes.list(func(sb *Sandbox) bool {
		return sb.State != SandboxPending &&
			(f.ID == "" || strings.HasPrefix(sb.ID, f.ID)) &&
			(f.State == "" || sb.State == f.State) &&
			matchLabels(sb.Labels, f.LabelSelector)
	})
	slices.SortFunc(out, func(a, b *Sandbox) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out
}

func matchLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
