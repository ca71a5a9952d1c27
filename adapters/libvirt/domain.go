package libvirt

import (
	"encoding/xml"
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// Ownership marks. A domain is Virtlet's when its name has NamePrefix and
// its metadata holds a <virtlet:vm> element in MetadataNS; nothing else on a
// shared libvirtd is ever touched.
const (
	NamePrefix  = "virtlet-"
	MetadataNS  = "https://virtlet.cloud/xmlns/domain/v1"
	metadataKey = "virtlet"
)

// AgentChannel is the virtio-serial port qemu-guest-agent listens on.
const AgentChannel = "org.qemu.guest_agent.0"

// balloonPeriod is how often (seconds) guests report memory statistics.
const balloonPeriod = 5

// vmMetadata is the <virtlet:vm> element of our domains.
type vmMetadata struct {
	XMLName   xml.Name `xml:"vm"`
	ID        string   `xml:"id,attr"`
	Sandbox   string   `xml:"sandbox,attr,omitempty"`
	Pod       string   `xml:"pod,attr,omitempty"`
	CreatedBy string   `xml:"createdBy,attr"`
	// Owner is the plugin instance that made the domain (a hash of its
	// state directory): another daemon on the same libvirtd leaves it
	// alone. Domains made before owners were recorded have none.
	Owner string `xml:"owner,attr,omitempty"`
}

// domainInput is everything a domain definition needs beyond the VM spec.
type domainInput struct {
	Spec ports.VMSpec
	// The accelerator: its DomainType ("kvm" or "qemu", TCG) and, under
	// TCG, its TBCacheMiB (the translation cache; 0: sized per VM).
	accelerator
	DiskPaths  map[string]string // files the plugin made for disks (overlays, a pool domain's medium placeholder), by disk name
	ConsoleLog string            // raw serial log written by virtlogd
	// Secrets are the UUIDs of the libvirt secrets holding network disks'
	// keys, by disk name: the domain names the secret, never the key.
	Secrets map[string]string
	// HostCPUs are the host's online CPUs, for pinning (Spec.CPUSet).
	HostCPUs []int
	// Pool, when set, renders the pool domain of the spec's shape, paused
	// until a VM of that shape claims it: it has its root disk, but the
	// devices a pod brings (other disks, NICs) are left out and their PCI
	// slots free, a SCSI CD-ROM is an empty tray; the metadata marks it as
	// the pool's.
	Pool *poolMetadata
	// Owner is recorded in a VM domain's metadata (vmMetadata.Owner).
	Owner string
}

// domainXML renders the libvirt domain of a VM. It is deterministic, so
// golden files can hold it.
func domainXML(in domainInput) (string, error) {
	d, err := buildDomain(in)
	if err != nil {
		return "", err
	}
	return d.Marshal()
}

// newVMMetadata is the metadata of VM s's domain, made by plugin instance
// owner.
func newVMMetadata(s ports.VMSpec, owner string) vmMetadata {
	return vmMetadata{ID: s.ID, Sandbox: s.SandboxID, Pod: s.PodNamespace + "/" + s.PodName, CreatedBy: "virtlet", Owner: owner}
}

// metadataXML is a domain's <virtlet:…> element: the VM's, or the pool's
// for a pool domain.
func metadataXML(in domainInput) (string, error) {
	var v interface{} = newVMMetadata(in.Spec, in.Owner)
	if in.Pool != nil {
		v = in.Pool
	}
	raw, err := xml.Marshal(v)
	if err != nil {
		return "", err
	}
	// <vm id=…></vm> → <virtlet:vm xmlns:virtlet="…" id=…/>
	name := strings.TrimPrefix(strings.Fields(string(raw))[0], "<")
	out := strings.Replace(string(raw), "<"+name+" ", fmt.Sprintf(`<%s:%s xmlns:%s="%s" `, metadataKey, name, metadataKey, MetadataNS), 1)
	return strings.Replace(out, "></"+name+">", "/>", 1), nil
}

// configurator sets one concern of a domain from the VM's spec. The
// converter is the table of them (domainConcerns); each has golden tests
// of its own (domain_test.go, TestConcernGolden) besides those of whole
// domains.
type configurator func(d *libvirtxml.Domain, in domainInput, slots pciSlots) error

// domainConcerns are the domain's concerns, in the order they are set
// (hyperV's clock timer needs the clock).
var domainConcerns = []struct {
	name string
	set  configurator
}{
	{"compute", setCompute},
	{"memory", setMemory},
	{"clock", setClock},
	{"firmware", setFirmware},
	{"devices", setDevices},
	{"storage", setStorage},
	{"network", setNetwork},
	{"console", setConsole},
}

// buildDomain builds the libvirt domain of a VM (or, with in.Pool, of
// the pool domain of its shape).
func buildDomain(in domainInput) (*libvirtxml.Domain, error) {
	s := in.Spec
	if !strings.HasPrefix(s.Name, NamePrefix) {
		return nil, &ports.InvalidError{Field: "VM name", Value: s.Name, Allowed: "a name starting with " + NamePrefix}
	}
	metaXML, err := metadataXML(in)
	if err != nil {
		return nil, err
	}
	d := &libvirtxml.Domain{
		Type: in.DomainType, Name: s.Name, UUID: s.UUID,
		Metadata:   &libvirtxml.DomainMetadata{XML: metaXML},
		OnPoweroff: "destroy", OnReboot: "restart", OnCrash: "destroy",
		SecLabel: []libvirtxml.DomainSecLabel{dacLabel(s.RunAs)},
		Devices:  &libvirtxml.DomainDeviceList{},
	}
	slots := layoutPCI(s)
	for _, c := range domainConcerns {
		if err := c.set(d, in, slots); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func uintp(v uint) *uint { return &v }

// dacLabel confines the VM's QEMU with libvirt's DAC driver, which owns
// the VM's disks to it only while it runs: the VM's own user and group
// when it has them (one VM's QEMU then cannot open another's disks), else
// qemu.conf's one user (dynamic). Asked for by the domain itself, so that
// a host whose qemu.conf sets security_default_confined = 0 does not run
// it unconfined.
func dacLabel(runAs *ports.ProcessIdentity) libvirtxml.DomainSecLabel {
	if runAs == nil {
		return libvirtxml.DomainSecLabel{Type: "dynamic", Model: "dac", Relabel: "yes"}
	}
	return libvirtxml.DomainSecLabel{Type: "static", Model: "dac", Relabel: "yes", Label: fmt.Sprintf("+%d:+%d", runAs.UID, runAs.GID)}
}
