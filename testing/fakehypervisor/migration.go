package fakehypervisor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/virtlet/virtlet/ports"
)

// Live migration (ports.VMMigrator), for the core's unit tests: a VM
// defined with spec.Incoming waits; MigrateVM ends a running VM with
// reason Migrated.

func (h *Hypervisor) MigrationIdentity(ctx context.Context, id string) (ports.VMIncoming, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.vms[id]
	if !ok {
		return ports.VMIncoming{}, fmt.Errorf("fake migration identity %s: %w", id, ports.ErrNotFound)
	}
	if v.Status.State != ports.VMRunning {
		return ports.VMIncoming{}, fmt.Errorf("fake migration identity %s: not running: %w", id, ports.ErrFailedPrecondition)
	}
	return ports.VMIncoming{Name: v.Spec.Name, UUID: "00000000-0000-4000-8000-" + (id + "000000000000")[:12]}, nil
}

func (h *Hypervisor) IncomingEndpoint(ctx context.Context, id string) (ports.MigrationEndpoint, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("IncomingEndpoint"); err != nil {
		return ports.MigrationEndpoint{}, err
	}
	v, ok := h.vms[id]
	if !ok || v.Spec.Incoming == nil {
		return ports.MigrationEndpoint{}, fmt.Errorf("fake incoming endpoint %s: no VM waits for a migration: %w", id, ports.ErrFailedPrecondition)
	}
	return ports.MigrationEndpoint{DomainXML: "<domain><name>" + v.Spec.Incoming.Name + "</name></domain>",
		ControlSocket: "/run/fake/libvirt-sock", MemorySocket: ports.MigrationRunDir + "/fake/memory.sock", DisksSocket: ports.MigrationRunDir + "/fake/disks.sock"}, nil
}

func (h *Hypervisor) MigrateVM(ctx context.Context, id string, to ports.MigrationEndpoint) (ports.MigrationStats, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.fail("MigrateVM"); err != nil {
		return ports.MigrationStats{}, err
	}
	v, ok := h.vms[id]
	if !ok || v.Status.State != ports.VMRunning {
		return ports.MigrationStats{}, fmt.Errorf("fake migrate %s: not running: %w", id, ports.ErrFailedPrecondition)
	}
	if _, err := h.exitLocked(v, 0, ports.ReasonMigrated, "the guest moved to another node"); err != nil {
		return ports.MigrationStats{}, err
	}
	return ports.MigrationStats{Total: time.Second, Downtime: 50 * time.Millisecond, MemoryBytes: 64 << 20}, nil
}

// CheckArrival refuses a definition naming another domain.
func (h *Hypervisor) CheckArrival(ctx context.Context, id, domainXML string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.vms[id]
	if !ok || v.Spec.Incoming == nil {
		return "", fmt.Errorf("fake check arrival %s: no VM waits for a migration: %w", id, ports.ErrFailedPrecondition)
	}
	if !strings.Contains(domainXML, "<name>"+v.Spec.Incoming.Name+"</name>") {
		return "", fmt.Errorf("fake check arrival %s: another domain: %w", id, ports.ErrFailedPrecondition)
	}
	return domainXML, nil
}

var _ ports.VMMigrator = (*Hypervisor)(nil)
