package core

import (
	"fmt"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// SandboxState is the lifecycle state of a VM pod.
type SandboxState string

const (
	// SandboxPending: RunPodSandbox is in progress (recorded before any side
	// effect, so that a crash can be reconciled). Hidden from lists.
	SandboxPending SandboxState = "pending"
	// SandboxReady: the pod's network is up; its VM may be created.
	SandboxReady SandboxState = "ready"
	// SandboxNotReady: stopped; only removal remains.
	SandboxNotReady SandboxState = "notready"
)

// Sandbox is a VM pod.
type Sandbox struct {
	ID             string              `json:"id"`
	Name           string              `json:"name"`
	Namespace      string              `json:"namespace"`
	UID            string              `json:"uid"`
	Attempt        uint32              `json:"attempt"`
	Hostname       string              `json:"hostname,omitempty"`
	LogDirectory   string              `json:"logDirectory,omitempty"`
	RuntimeHandler string              `json:"runtimeHandler,omitempty"`
	Labels         map[string]string   `json:"labels,omitempty"`
	Annotations    map[string]string   `json:"annotations,omitempty"`
	DNS            *ports.DNSConfig    `json:"dns,omitempty"`
	PortMappings   []ports.PortMapping `json:"portMappings,omitempty"`
	State          SandboxState        `json:"state"`
	// Revision changes whenever the record does (not persisted); edges may
	// cache derived forms of a record by it.
	Revision  uint64                   `json:"-"`
	CreatedAt time.Time                `json:"createdAt"`
	Network   *ports.NetworkAttachment `json:"network,omitempty"`
}

// IPs returns the pod's addresses, primary first, without prefix lengths.
func (s *Sandbox) IPs() []string {
	if s.Network == nil {
		return nil
	}
	var ips []string
	for _, iface := range s.Network.Interfaces {
		for _, ip := range iface.IPs {
			addr := ip.Address
			for i := 0; i < len(addr); i++ {
				if addr[i] == '/' {
					addr = addr[:i]
					break
				}
			}
			ips = append(ips, addr)
		}
	}
	return ips
}

// ContainerState is the lifecycle state of a VM pod's VM.
type ContainerState string

const (
	// ContainerCreating: CreateContainer is in progress. Hidden from lists.
	ContainerCreating ContainerState = "creating"
	ContainerCreated  ContainerState = "created"
	ContainerRunning  ContainerState = "running"
	ContainerExited   ContainerState = "exited"
	ContainerUnknown  ContainerState = "unknown"
)

// Exit reasons recorded for stopped VMs.
const (
	ReasonCompleted = "Completed" // the guest powered off, or shut down on request (exit code 0)
	ReasonKilled    = "Killed"    // forced off (exit code 137)
	ReasonCrashed   = "Crashed"   // the guest crashed (exit code 1)
	ReasonLost      = "Lost"      // the VM disappeared from the hypervisor (exit code 255)
)

// Container is the VM of a VM pod.
type Container struct {
	ID          string            `json:"id"`
	SandboxID   string            `json:"sandboxID"`
	Name        string            `json:"name"`
	Attempt     uint32            `json:"attempt"`
	Image       ImageRef          `json:"image"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	LogPath     string            `json:"logPath,omitempty"`
	Mounts      []Mount           `json:"mounts,omitempty"`
	// Volumes are the VM's volumes, as its volume plugins prepared them.
	Volumes []VolumeUse  `json:"volumes,omitempty"`
	Spec    ports.VMSpec `json:"spec"`
	// Datasource is the plugin holding the VM's cloud-init media.
	Datasource string `json:"datasource,omitempty"`
	// Prelaunched: the hypervisor claimed the VM from its pool of
	// pre-launched VMs and its first start resumes it (until then).
	Prelaunched bool `json:"prelaunched,omitempty"`

	State      ContainerState `json:"state"`
	Revision   uint64         `json:"-"` // see Sandbox.Revision
	CreatedAt  time.Time      `json:"createdAt"`
	StartedAt  time.Time      `json:"startedAt,omitempty"`
	FinishedAt time.Time      `json:"finishedAt,omitempty"`
	ExitCode   int32          `json:"exitCode,omitempty"`
	Reason     string         `json:"reason,omitempty"`
	Message    string         `json:"message,omitempty"`
	// HaltedAt, while the container runs, is when its VM was halted
	// (virtletctl stop): the VM is off, the container is kept.
	HaltedAt time.Time `json:"haltedAt,omitempty"`
	// BootedAt is when a halted VM was last booted again (StartedAt
	// until then).
	BootedAt time.Time `json:"bootedAt,omitempty"`
	// CPUNanosBefore is the CPU time the VM used in its boots before the
	// last halt: a boot counts from zero, the container's CPU time goes on.
	CPUNanosBefore uint64 `json:"cpuNanosBefore,omitempty"`
}

// ReasonHalted is the reason a running container whose VM is halted
// reports.
const ReasonHalted = "Halted"

// Halted reports whether the container runs with its VM halted.
func (c *Container) Halted() bool {
	return c.State == ContainerRunning && !c.HaltedAt.IsZero()
}

// HaltMessage says, for a halted VM's container status, since when and
// how to boot it.
func (c *Container) HaltMessage() string {
	return fmt.Sprintf("the VM is halted since %s (virtletctl stop); virtletctl start %s boots it",
		c.HaltedAt.UTC().Format(time.RFC3339), c.Spec.PodName)
}

// ImageRef is the image a container was created from.
type ImageRef struct {
	// Spec is the image as kubelet named it in CreateContainer (often the ID).
	Spec string `json:"spec"`
	// UserSpecified is the image as the pod spec names it.
	UserSpecified string `json:"userSpecified,omitempty"`
	// ID is the image's content digest ("sha256:<hex>").
	ID string `json:"id"`
	// Base and BaseName, for a VM restored from a checkpoint image, are
	// the image its root disk overlays: in use as long as the VM is.
	Base     string `json:"base,omitempty"`
	BaseName string `json:"baseName,omitempty"`
}

// Mount is a host path made visible to a VM.
type Mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
	// Image, for an image volume, names the OCI image to mount (not
	// supported for VMs).
	Image string `json:"image,omitempty"`
}

// Image is a VM disk image in the local store.
type Image struct {
	// ID is the sha256 digest of the disk file, "sha256:<hex>".
	ID string `json:"id"`
	// Names are the names it was pulled as, normalised with a tag
	// ("virtlet.cloud/cirros:latest") or a digest.
	Names       []string `json:"names"`
	Size        int64    `json:"size"`
	Format      string   `json:"format,omitempty"`
	VirtualSize int64    `json:"virtualSize,omitempty"` // bytes the guest sees
	Location    string   `json:"location,omitempty"`    // where it was fetched from (no credentials)
	// Registry images (docker://, oci:) are named by tag; URL images ignore
	// tags, as Virtlet did.
	Registry bool `json:"registry,omitempty"`
	// ManifestDigests are, by repository, the digests of the registry
	// manifests its names resolved to: its repo digests.
	ManifestDigests map[string]string `json:"manifestDigests,omitempty"`
	PulledAt        time.Time         `json:"pulledAt"`
}

// HasName reports whether the image is the one n names: by repository and
// tag for registry images, by repository for URL images (tags ignored).
func (i *Image) HasName(n ImageName) bool {
	for _, name := range i.Names {
		p, err := ParseImageName(name)
		if err != nil {
			continue
		}
		if i.Registry && p.Normalized() == n.Normalized() || !i.Registry && p.Key() == n.Key() {
			return true
		}
	}
	return false
}

// PinnedBy reports whether n, a digest-pinned name, names the image
// though it was pulled under another name of the same repository: by the
// manifest's digest for a registry image, the disk's for a URL image. A
// digest alone, under another repository, names nothing: the image may be
// another tenant's, pulled with credentials this name's user lacks.
func (i *Image) PinnedBy(n ImageName) bool {
	if n.Digest == "" {
		return false
	}
	repo := n.Repository()
	if i.Registry {
		return i.ManifestDigests[repo] == n.Digest
	}
	if i.ID != n.Digest {
		return false
	}
	for _, name := range i.Names {
		if p, err := ParseImageName(name); err == nil && p.Repository() == repo {
			return true
		}
	}
	return false
}

// withoutName returns the image's names other than those n names.
func (i *Image) withoutName(n ImageName) []string {
	var out []string
	for _, name := range i.Names {
		single := Image{Names: []string{name}, Registry: i.Registry}
		if !single.HasName(n) {
			out = append(out, name)
		}
	}
	return out
}

// RepoDigests returns the digest-pinned names of the image: by the
// manifest's digest for a registry image, by the disk's for others.
func (i *Image) RepoDigests() []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range i.Names {
		if parsed, err := ParseImageName(n); err == nil {
			digest := i.ID
			if m, ok := i.ManifestDigests[parsed.Repository()]; ok {
				digest = m
			}
			d := parsed.Repository() + "@" + digest
			if !seen[d] {
				seen[d] = true
				out = append(out, d)
			}
		}
	}
	return out
}

// RepoTags returns the tagged names of the image.
func (i *Image) RepoTags() []string {
	var out []string
	for _, n := range i.Names {
		if parsed, err := ParseImageName(n); err == nil && parsed.Digest == "" {
			out = append(out, n)
		}
	}
	return out
}
