// VMs restored from checkpoints: Define takes the checkpoint's state and
// root disk over; Start resumes the guest from the state (libvirt's
// restore, with the domain's own definition for this node: its disks,
// bridges and console here, the checkpointed VM's virtual hardware).

package libvirt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/ports"
)

// restoredIdentity is what a restored VM keeps of the checkpointed one:
// libvirt restores a state only into a domain of the same name and UUID,
// and a running guest's NICs keep their MACs.
type restoredIdentity struct {
	name, uuid string
	macs       []string
}

// libvirt's save image header (src/qemu/qemu_saveimage.h): the magic,
// then uint32s in the writer's byte order: version, the XML's length,
// was_running, the compression format, the cookie's offset.
const (
	saveMagic      = "LibvirtQemudSave"
	saveHeaderLen  = 16 + 4*19
	saveVersion    = 2
	saveFormatRaw  = 0
	maxSaveXMLSize = 1 << 20
)

// checkSaveHeader refuses a state file whose header would have libvirtd
// (root) do more than read it: a compressed image makes it run a
// decompressor on the data, a huge XML length allocate that much.
func checkSaveHeader(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := make([]byte, saveHeaderLen)
	if _, err := io.ReadFull(f, h); err != nil {
		return fmt.Errorf("the checkpoint's state: its header: %v: %w", err, ports.ErrInvalidArgument)
	}
	le := binary.LittleEndian
	version, xmlLen, format := le.Uint32(h[16:20]), le.Uint32(h[20:24]), le.Uint32(h[28:32])
	switch {
	case string(h[:16]) != saveMagic:
		return fmt.Errorf("the checkpoint's state is not a complete libvirt save image (magic %q): %w", h[:16], ports.ErrInvalidArgument)
	case version != saveVersion:
		return fmt.Errorf("the checkpoint's state is a libvirt save image of version %d (want %d): %w", version, saveVersion, ports.ErrInvalidArgument)
	case format != saveFormatRaw:
		return fmt.Errorf("the checkpoint's state is compressed (format %d): only raw save images are restored (libvirtd would run a decompressor on it): %w", format, ports.ErrInvalidArgument)
	case xmlLen == 0 || xmlLen > maxSaveXMLSize:
		return fmt.Errorf("the checkpoint's state has a domain XML of %d bytes: %w", xmlLen, ports.ErrInvalidArgument)
	}
	return nil
}

// readRestoredIdentity reads the identity from the state file's header
// (libvirtd parses it, once checkSaveHeader has passed; the file is not
// otherwise trusted).
func readRestoredIdentity(conn *libvirt.Connect, stateFile string) (restoredIdentity, error) {
	var id restoredIdentity
	if err := checkSaveHeader(stateFile); err != nil {
		return id, err
	}
	x, err := conn.DomainSaveImageGetXMLDesc(stateFile, 0)
	if err != nil {
		return id, libvirtError("read the checkpoint's state", err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(x); err != nil {
		return id, fmt.Errorf("the checkpoint's state: its domain XML: %v: %w", err, ports.ErrInvalidArgument)
	}
	id.name, id.uuid = d.Name, d.UUID
	if d.Devices != nil {
		for _, nic := range d.Devices.Interfaces {
			if nic.MAC != nil {
				id.macs = append(id.macs, strings.ToLower(nic.MAC.Address))
			}
		}
	}
	if id.name == "" || id.uuid == "" {
		return id, fmt.Errorf("the checkpoint's state names no domain: %w", ports.ErrInvalidArgument)
	}
	return id, nil
}

// prepareRestore checks a restore's state against the spec and the node,
// and gives the spec the checkpointed domain's name and UUID.
func prepareRestore(conn *libvirt.Connect, spec *ports.VMSpec) (restoredIdentity, error) {
	id, err := readRestoredIdentity(conn, spec.Restore.StateFile)
	if err != nil {
		return id, fmt.Errorf("VM %s: %w", spec.Name, err)
	}
	var specMACs []string
	for _, n := range spec.NICs {
		specMACs = append(specMACs, strings.ToLower(n.MAC))
	}
	if strings.Join(specMACs, ",") != strings.Join(id.macs, ",") {
		return id, fmt.Errorf("VM %s: its NICs have the MACs %v, the checkpointed guest's %v: %w", spec.Name, specMACs, id.macs, ports.ErrInvalidArgument)
	}
	for _, look := range []func() (*libvirt.Domain, error){
		func() (*libvirt.Domain, error) { return conn.LookupDomainByName(id.name) },
		func() (*libvirt.Domain, error) { return conn.LookupDomainByUUIDString(id.uuid) },
	} {
		if dom, err := look(); err == nil {
			dom.Free()
			return id, fmt.Errorf("VM %s: the checkpointed VM's domain %s (UUID %s) exists on this node (the VM itself, or another restore of its checkpoint): libvirt restores a state only into its own domain: %w",
				spec.Name, id.name, id.uuid, ports.ErrAlreadyExists)
		}
	}
	spec.Name, spec.UUID = id.name, id.uuid
	return id, nil
}

// restoredName is the shape of a domain name a restore accepts from a
// save image: one of Virtlet's (a VM's or a pool domain's).
var restoredName = regexp.MustCompile(`^` + NamePrefix + `[a-z0-9][a-z0-9.-]{0,55}$`)

// reserveRestore holds a restored domain's name and UUID for this Define,
// refusing them while another VM of this plugin has them, or shares the
// name's first 20 bytes (libvirt's short name, which names a domain's
// dumps); release gives them back.
func reserveRestore(h *Hypervisor, spec ports.VMSpec) (release func(), err error) {
	if !restoredName.MatchString(spec.Name) {
		return nil, fmt.Errorf("VM %s: the checkpoint names its domain %q, not a Virtlet domain name: %w", spec.ID, spec.Name, ports.ErrInvalidArgument)
	}
	short := spec.Name[:min(len(spec.Name), shortNameMax)]
	uuid := strings.ToLower(spec.UUID)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.restoring[uuid] {
		return nil, fmt.Errorf("VM %s: the checkpointed domain %s is being restored for another pod on this node: %w", spec.ID, spec.Name, ports.ErrAlreadyExists)
	}
	for _, r := range h.records {
		if strings.EqualFold(r.Spec.UUID, uuid) || r.Spec.Name[:min(len(r.Spec.Name), shortNameMax)] == short {
			return nil, fmt.Errorf("VM %s: the checkpointed domain %s (UUID %s) is, or is named like, the domain of this node's VM %s: %w",
				spec.ID, spec.Name, spec.UUID, r.Spec.Name, ports.ErrAlreadyExists)
		}
	}
	if h.restoring == nil {
		h.restoring = map[string]bool{}
	}
	h.restoring[uuid] = true
	return func() {
		h.mu.Lock()
		delete(h.restoring, uuid)
		h.mu.Unlock()
	}, nil
}

// adoptDisk makes a checkpoint's copy of an overlay disk the VM's disk at
// path, over the base the spec names: the copy is checked (a qcow2 image
// that names nothing but a backing file), moved, and its backing file
// replaced without being opened (the name in the copy is another node's,
// or anything its writer chose).
func adoptDisk(ctx context.Context, from, path string, o ports.DiskOverlay, disk string) error {
	if _, err := diskimage.InspectOverlay(from); err != nil {
		return fmt.Errorf("disk %s: the checkpoint's copy: %v: %w", disk, err, ports.ErrInvalidArgument)
	}
	base, err := diskimage.Inspect(o.BasePath)
	if err != nil {
		return fmt.Errorf("disk %s: image file %s: %v: %w", disk, o.BasePath, err, ports.ErrInvalidArgument)
	}
	if err := moveFile(from, path); err != nil {
		return fmt.Errorf("disk %s: %w", disk, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		os.Remove(path)
		return fmt.Errorf("disk %s: %w", disk, err)
	}
	tool := diskimage.Tool{UID: diskimage.LibvirtToolUID}
	if _, stderr, err := tool.Run(ctx, map[string]uint16{path: 6}, "qemu-img", "rebase", "-u", "-f", "qcow2", "-F", base.Format, "-b", o.BasePath, path); err != nil {
		os.Remove(path)
		return fmt.Errorf("disk %s: put the checkpoint's copy over %s: %v: %s", disk, o.BasePath, err, strings.TrimSpace(string(stderr)))
	}
	return nil
}

// moveFile renames from to to, or copies it across file systems.
func moveFile(from, to string) error {
	err := os.Rename(from, to)
	if err == nil || !errors.Is(err, syscall.EXDEV) {
		return err
	}
	if _, err := copyDisk(context.Background(), from, to); err != nil {
		return err
	}
	return os.Remove(from)
}

// restoreStatePath is where Define keeps a restored VM's state until its
// first start.
func restoreStatePath(vmDir, id string) string { return filepath.Join(vmDir, id+".restore") }

// restoreDomain resumes a restored VM's guest from its state, into the
// domain as it is defined on this node, running.
func restoreDomain(h *Hypervisor, dom *libvirt.Domain, r *record) error {
	conn, err := h.conn.current()
	if err != nil {
		return err
	}
	x, err := dom.GetXMLDesc(libvirt.DOMAIN_XML_INACTIVE | libvirt.DOMAIN_XML_SECURE)
	if err != nil {
		return libvirtError("domain XML of "+r.Spec.Name, err)
	}
	if err := conn.DomainRestoreFlags(r.RestoreState, x, libvirt.DOMAIN_SAVE_RUNNING); err != nil {
		return libvirtError("restore domain "+r.Spec.Name+" from its checkpoint", err)
	}
	return nil
}

// flapLinks takes the restored guest's NICs down and up again: a guest
// whose DHCP client starts over when its link comes back (systemd-networkd,
// NetworkManager, the tests' tiny guest) asks for the new pod's address;
// its old one is refused (NAK).
func flapLinks(h *Hypervisor, id string) {
	_, dom, err := h.lookup(id)
	if err != nil {
		return
	}
	defer dom.Free()
	x, err := dom.GetXMLDesc(0)
	if err != nil {
		return
	}
	var d libvirtxml.Domain
	if d.Unmarshal(x) != nil || d.Devices == nil {
		return
	}
	log := h.log.WithField("vm", id)
	for _, state := range []string{"down", "up"} {
		for _, nic := range d.Devices.Interfaces {
			nic.Link = &libvirtxml.DomainInterfaceLink{State: state}
			nx, err := nic.Marshal()
			if err == nil {
				err = dom.UpdateDeviceFlags(nx, libvirt.DOMAIN_DEVICE_MODIFY_LIVE)
			}
			if err != nil {
				log.WithError(err).Warn("restore: set the guest's link " + state)
			}
		}
		if state == "down" {
			time.Sleep(linkDownFor)
		}
	}
	log.WithFields(logrus.Fields{"nics": len(d.Devices.Interfaces), "downMillis": linkDownFor.Milliseconds()}).Info("restore: the guest's links went down and up again")
}

// linkDownFor is how long a restored guest's links stay down: long enough
// for a guest that polls its carrier to see it.
const linkDownFor = 1500 * time.Millisecond
