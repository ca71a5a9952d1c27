package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/core/cloudinit"
	"github.com/virtlet/virtlet/ports"
)

// volumeService plans a VM's volumes from its pod's mounts and
// annotations and has the volume plugins prepare and release them; it
// also answers the flexvolume driver.
type volumeService struct{ *shared }

// Where kubelet keeps a pod's volumes and files on the node
// (<kubelet root>/pods/<pod UID>/...). The kubelet root is not assumed: a
// node may move it.
var (
	// .../pods/<uid>/volumes/<plugin>/<volume>[/...]
	kubeletVolume = regexp.MustCompile(`^(?:.*/)?pods/([^/]+)/volumes/([^/]+)/([^/]+)(/.*)?$`)
	// kubelet's own per-container files: /etc/hosts and the termination
	// message file.
	kubeletOwnFile = regexp.MustCompile(`^(?:.*/)?pods/[^/]+/(etc-hosts|containers/[^/]+/[^/]+)$`)
	// subPath mounts are bind mounts kubelet prepares under volume-subpaths.
	kubeletSubPath = regexp.MustCompile(`^(?:.*/)?pods/[^/]+/volume-subpaths/([^/]+)/`)
	// block volumes: .../pods/<uid>/volumeDevices/<plugin>/<volume>
	kubeletBlockVolume = regexp.MustCompile(`^(?:.*/)?pods/[^/]+/volumeDevices/[^/]+/([^/]+)$`)
)

// Kubernetes volume plugin directories, as kubelet names them.
const (
	FlexvolumeDriverDir = "virtlet~flexvolume_driver" // the Virtlet flexvolume driver
	flexvolumeDriver    = "virtlet/flexvolume_driver"
)

// shareKinds are the kubelet volume directories a VM receives as 9p shares.
var shareKinds = map[string]string{
	"kubernetes.io~empty-dir":    "emptyDir",
	"kubernetes.io~csi":          "CSI persistent volume",
	"kubernetes.io~local-volume": "local persistent volume",
	// The in-tree file system volumes kubelet still mounts itself, as a
	// file system on the node (Virtlet's ubuntu-vm-nfs-pv example).
	"kubernetes.io~nfs":   "NFS volume",
	"kubernetes.io~iscsi": "iSCSI file system volume",
	"kubernetes.io~fc":    "Fibre Channel file system volume",
}

// cloudInitKinds are the kubelet volume directories whose files travel into
// the guest by cloud-init write_files.
var cloudInitKinds = map[string]string{
	"kubernetes.io~configmap":    "configMap",
	"kubernetes.io~secret":       "secret",
	"kubernetes.io~projected":    "projected",
	"kubernetes.io~downward-api": "downwardAPI",
}

// SupportedVolumes says, for error messages, what a VM pod may use.
const SupportedVolumes = "configMap, secret, projected and downwardAPI volumes (files written by cloud-init); " +
	"emptyDir, hostPath directories, CSI, local, NFS, iSCSI and Fibre Channel file system volumes (9p shares); " +
	"Virtlet flexvolumes (driver " + flexvolumeDriver + "); block persistent volumes as volumeDevices; " +
	"a persistent root filesystem on a block volume at devicePath \"/\" or a flexvolume with rootfs: \"true\""

// VolumeUse is one volume of a VM: what the pod asked for, and how it
// reaches the guest. It is kept in the container's record, without
// secrets, so that the volume can be released after a restart.
type VolumeUse struct {
	// Name is the pod's volume name (for hostPath volumes and devices, the
	// base name of the host path).
	Name string `json:"name"`
	// Kind is the Kubernetes volume kind, for messages ("emptyDir",
	// "flexvolume", "block device", ...).
	Kind string `json:"kind"`
	// Type selects the volume plugin.
	Type     string `json:"type"`
	HostPath string `json:"hostPath,omitempty"`
	// Mounts are where the guest mounts a disk or share; DevicePath is
	// where it links a block device.
	Mounts     []GuestMount `json:"mounts,omitempty"`
	DevicePath string       `json:"devicePath,omitempty"`
	// ReadOnly: the volume is read-only on the host side (every mount of
	// it is read-only).
	ReadOnly bool `json:"readOnly,omitempty"`
	// Options are a flexvolume's options as its plugin kept them.
	Options map[string]string `json:"options,omitempty"`
	Chown   bool              `json:"chown,omitempty"`
	// Rootfs marks the volume holding the VM's persistent root: a block
	// device at devicePath "/", or a flexvolume with option rootfs: "true"
	// (its mount path is not mounted in the guest).
	Rootfs bool `json:"rootfs,omitempty"`
	// Serial is the serial of the volume's disk; Tag the mount tag of its
	// share.
	Serial string `json:"serial,omitempty"`
	Tag    string `json:"tag,omitempty"`
}

// GuestMount is one mount of a volume in the guest.
type GuestMount struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Device is a host device kubelet hands a container (block volumes).
type Device struct {
	ContainerPath string
	HostPath      string
	Permissions   string
}

// volumePlan is what a container's mounts and devices amount to.
type volumePlan struct {
	uses []VolumeUse
	// projected are the mounts whose files travel by cloud-init.
	projected []Mount
}

// planVolumes sorts every CRI mount and device of a container: each goes
// into the guest somewhere, is one of kubelet's own files (ignored on
// purpose), or the pod is refused with an error naming the volume.
func (r *volumeService) planVolumes(ctx context.Context, cfg ContainerConfig, opts annotations.VMOptions) (volumePlan, error) {
	var p volumePlan
	byName := map[string]int{}
	add := func(u VolumeUse, mountPath string) error {
		mount := GuestMount{Path: mountPath, ReadOnly: u.ReadOnly}
		if i, ok := byName[u.Name]; ok && p.uses[i].HostPath != u.HostPath && (u.Kind == "hostPath" || p.uses[i].Kind == "hostPath") {
			// A hostPath's name is only its path's base name: two
			// directories may share it.
			base := u.Name
			for n := 2; ok; n++ {
				u.Name = fmt.Sprintf("%s-%d", base, n)
				_, ok = byName[u.Name]
			}
		}
		if i, ok := byName[u.Name]; ok {
			prev := &p.uses[i]
			if prev.Type != u.Type || prev.HostPath != u.HostPath {
				return fmt.Errorf("volume %s: two different volumes resolve to this name (%s at %s, %s at %s): %w",
					u.Name, prev.Kind, prev.HostPath, u.Kind, u.HostPath, ports.ErrInvalidArgument)
			}
			if u.Type != ports.VolumeShare {
				return fmt.Errorf("volume %s (%s) is mounted at both %s and %s; a VM disk can be mounted at one path: %w",
					u.Name, u.Kind, prev.Mounts[0].Path, mountPath, ports.ErrInvalidArgument)
			}
			// One share, several mounts: read-only on the host only if
			// every mount is; each guest mount keeps its own flag.
			prev.Mounts = append(prev.Mounts, mount)
			prev.ReadOnly = prev.ReadOnly && u.ReadOnly
			return nil
		}
		if mountPath != "" {
			u.Mounts = []GuestMount{mount}
		}
		byName[u.Name] = len(p.uses)
		p.uses = append(p.uses, u)
		return nil
	}
	for _, m := range cfg.Mounts {
		use, kind, err := r.classifyMount(ctx, m, opts)
		if err != nil {
			return volumePlan{}, err
		}
		switch kind {
		case mountIgnored:
			continue
		case mountCloudInit:
			p.projected = append(p.projected, m)
			continue
		}
		if err := add(use, m.ContainerPath); err != nil {
			return volumePlan{}, err
		}
	}
	for _, d := range cfg.Devices {
		u, err := blockDeviceUse(d)
		if err != nil {
			return volumePlan{}, err
		}
		if err := add(u, ""); err != nil {
			return volumePlan{}, err
		}
	}
	if err := checkOneRoot(p.uses); err != nil {
		return volumePlan{}, err
	}
	if err := r.checkVolumePlugins(p.uses); err != nil {
		return volumePlan{}, err
	}
	if err := r.checkRootfsTypes(ctx, p.uses); err != nil {
		return volumePlan{}, err
	}
	assignSerialsAndTags(p.uses)
	return p, nil
}

// blockDeviceUse reads a CRI device: a block volume kubelet passes, the
// persistent root filesystem at devicePath "/".
func blockDeviceUse(d Device) (VolumeUse, error) {
	if d.HostPath == "" || !path.IsAbs(d.ContainerPath) {
		return VolumeUse{}, &ports.InvalidError{Field: "device " + d.ContainerPath, Value: d.HostPath,
			Reason: "a device needs a host path and an absolute device path", Allowed: "a block volume as kubelet passes it"}
	}
	bv := kubeletBlockVolume.FindStringSubmatch(path.Clean(d.HostPath))
	if bv == nil {
		return VolumeUse{}, fmt.Errorf("device %s (host %s) is not a block volume: devices of device plugins (or other host devices) cannot be given to a VM (supported: %s): %w",
			d.ContainerPath, d.HostPath, SupportedVolumes, ports.ErrInvalidArgument)
	}
	u := VolumeUse{Name: bv[1], Kind: "block device", Type: ports.VolumeBlock, HostPath: d.HostPath,
		ReadOnly: !strings.Contains(d.Permissions, "w") && d.Permissions != ""}
	if path.Clean(d.ContainerPath) == "/" {
		u.Kind, u.Rootfs = rootfsKind, true
	} else {
		u.DevicePath = path.Clean(d.ContainerPath)
	}
	return u, nil
}

type mountKind int

const (
	mountVolume    mountKind = iota // a disk or share of a volume plugin
	mountCloudInit                  // files written by cloud-init
	mountIgnored                    // kubelet's own file
)

// classifyMount says where one CRI mount goes.
func (r *volumeService) classifyMount(ctx context.Context, m Mount, opts annotations.VMOptions) (VolumeUse, mountKind, error) {
	where := fmt.Sprintf("mount %s", m.ContainerPath)
	switch {
	case m.Image != "":
		return VolumeUse{}, 0, fmt.Errorf("%s: image volumes (%s) are not supported for VM pods (supported: %s): %w",
			where, m.Image, SupportedVolumes, ports.ErrInvalidArgument)
	case m.HostPath == "" || !path.IsAbs(m.HostPath):
		return VolumeUse{}, 0, &ports.InvalidError{Field: where + " host path", Value: m.HostPath, Allowed: "an absolute path"}
	case !path.IsAbs(m.ContainerPath):
		return VolumeUse{}, 0, &ports.InvalidError{Field: "mount container path", Value: m.ContainerPath, Allowed: "an absolute path"}
	}
	hostPath := path.Clean(m.HostPath)
	if kubeletOwnFile.MatchString(hostPath) {
		return VolumeUse{}, mountIgnored, nil
	}
	if sp := kubeletSubPath.FindStringSubmatch(hostPath); sp != nil {
		return VolumeUse{}, 0, fmt.Errorf("%s: volume %s is mounted with subPath, which VM pods do not support (mount the whole volume instead): %w",
			where, sp[1], ports.ErrInvalidArgument)
	}
	vm := kubeletVolume.FindStringSubmatch(hostPath)
	if vm == nil {
		// Not one of kubelet's volume directories: a hostPath volume.
		return VolumeUse{Name: path.Base(hostPath), Kind: "hostPath", Type: ports.VolumeShare, HostPath: hostPath,
			ReadOnly: m.ReadOnly, Chown: opts.Chown9pfsMounts}, mountVolume, nil
	}
	plugin, name, rest := vm[2], vm[3], vm[4]
	if _, ok := cloudInitKinds[plugin]; ok && rest == "" {
		return VolumeUse{}, mountCloudInit, nil
	}
	if kind, ok := shareKinds[plugin]; ok {
		return VolumeUse{Name: name, Kind: kind, Type: ports.VolumeShare, HostPath: hostPath,
			ReadOnly: m.ReadOnly, Chown: opts.Chown9pfsMounts}, mountVolume, nil
	}
	if plugin == FlexvolumeDriverDir && rest == "" {
		if r.deps.VolumeDirs == nil {
			return VolumeUse{}, 0, fmt.Errorf("%s: volume %s is a Virtlet flexvolume, but this runtime cannot read flexvolume directories: %w",
				where, name, ports.ErrFailedPrecondition)
		}
		options, err := r.deps.VolumeDirs.FlexvolumeOptions(ctx, hostPath)
		if err != nil {
			return VolumeUse{}, 0, fmt.Errorf("%s: flexvolume %s: %w", where, name, err)
		}
		typ := options["type"]
		if typ == "" {
			return VolumeUse{}, 0, &ports.InvalidError{Field: "flexvolume " + name + " option type", Reason: "missing",
				Allowed: "one of the installed volume types: " + r.flexvolumeTypes()}
		}
		// The plugin learns the type from the request, as at Validate.
		delete(options, "type")
		u := VolumeUse{Name: name, Kind: "flexvolume", Type: typ, HostPath: hostPath, ReadOnly: m.ReadOnly, Options: options}
		if err := markFlexvolumeRootfs(&u); err != nil {
			return VolumeUse{}, 0, err
		}
		return u, mountVolume, nil
	}
	kind := strings.TrimPrefix(plugin, "kubernetes.io~")
	return VolumeUse{}, 0, fmt.Errorf("%s: volume %s is a %s volume, which VM pods do not support (supported: %s): %w",
		where, name, kind, SupportedVolumes, ports.ErrInvalidArgument)
}

// rootfsKind is the Kind of the volume holding a VM's persistent root.
const rootfsKind = "persistent root filesystem"

// markFlexvolumeRootfs makes a flexvolume with option rootfs: "true" the
// VM's persistent root (whether its type can be one is checked with its
// plugin, checkRootfsTypes). Its mount path is not mounted in the guest:
// the disk is the guest's root.
func markFlexvolumeRootfs(u *VolumeUse) error {
	field := "flexvolume " + u.Name + " option " + ports.RootfsOption
	switch v := u.Options[ports.RootfsOption]; v {
	case "", "false":
		return nil
	case "true":
	default:
		return &ports.InvalidError{Field: field, Value: v, Allowed: `"true" (the volume holds the VM's persistent root filesystem) or "false"`}
	}
	if u.ReadOnly {
		return &ports.InvalidError{Field: field, Value: "true", Reason: "the volume is mounted read-only, and a persistent root filesystem is written by its VM",
			Allowed: "a read-write volumeMount (readOnly: false)"}
	}
	u.Kind, u.Rootfs = rootfsKind, true
	return nil
}

// checkOneRoot refuses a VM of two persistent roots, naming the second.
func checkOneRoot(uses []VolumeUse) error {
	var first *VolumeUse
	for i := range uses {
		u := &uses[i]
		if !u.Rootfs {
			continue
		}
		if first == nil {
			first = u
			continue
		}
		if u.Type == ports.VolumeBlock && first.Type == ports.VolumeBlock {
			return fmt.Errorf("devices: two block volumes ask to be the persistent root filesystem (devicePath \"/\"); a VM has one root: %w", ports.ErrInvalidArgument)
		}
		field := "flexvolume " + u.Name + " option " + ports.RootfsOption
		if u.Type == ports.VolumeBlock {
			field = "device / (block volume " + u.Name + ")"
		}
		return &ports.InvalidError{Field: field, Value: "true",
			Reason:  fmt.Sprintf("volume %s is the VM's persistent root filesystem already (%s), and a VM has one root", first.Name, rootfsSource(first)),
			Allowed: "one volume with rootfs: \"true\" or at devicePath \"/\""}
	}
	return nil
}

// rootVolume names, for messages, the volume holding the root.
func rootVolume(u *VolumeUse) string {
	if u.Type == ports.VolumeBlock {
		return "block volume " + u.Name
	}
	return u.Type + " flexvolume " + u.Name
}

// rootfsSource says, for messages, how a volume came to hold the root.
func rootfsSource(u *VolumeUse) string {
	if u.Type == ports.VolumeBlock {
		return "a block volume at devicePath \"/\""
	}
	return "a " + u.Type + " flexvolume with " + ports.RootfsOption + ": \"true\""
}

// checkRootfsTypes asks the plugin of each flexvolume holding the root
// whether its type can: a plugin that cannot would ignore the request and
// attach a blank disk as the VM's root.
func (r *volumeService) checkRootfsTypes(ctx context.Context, uses []VolumeUse) error {
	for _, u := range uses {
		if !u.Rootfs || u.Type == ports.VolumeBlock {
			continue
		}
		types, err := rootfsTypesOf(ctx, r.deps.Volumes[u.Type])
		if err != nil {
			return fmt.Errorf("flexvolume %s (type %s): ask its plugin whether it can hold a persistent root filesystem: %w", u.Name, u.Type, err)
		}
		if slices.Contains(types, u.Type) {
			continue
		}
		return &ports.InvalidError{Field: "flexvolume " + u.Name + " option " + ports.RootfsOption, Value: "true",
			Reason:  fmt.Sprintf("volume type %s cannot hold a persistent root filesystem", u.Type),
			Allowed: "rootfs: \"true\" on a volume type that can (" + r.rootfsTypes(ctx) + "), or a block volume at devicePath \"/\""}
	}
	return nil
}

// rootfsTypesOf is what a volume plugin says its types can hold the root
// on; nothing when it says nothing.
func rootfsTypesOf(ctx context.Context, vols ports.Volumes) ([]string, error) {
	h, ok := vols.(ports.RootfsHolder)
	if !ok {
		return nil, nil
	}
	return h.RootfsTypes(ctx)
}

// rootfsTypes lists, for messages, the installed flexvolume types that can
// hold a persistent root filesystem.
func (r *volumeService) rootfsTypes(ctx context.Context) string {
	var out []string
	for typ, vols := range r.deps.Volumes {
		if types, err := rootfsTypesOf(ctx, vols); err == nil && slices.Contains(types, typ) {
			out = append(out, typ)
		}
	}
	if len(out) == 0 {
		return "none is installed"
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// checkVolumePlugins makes sure a plugin handles every volume's type.
func (r *volumeService) checkVolumePlugins(uses []VolumeUse) error {
	for _, u := range uses {
		if _, ok := r.deps.Volumes[u.Type]; ok {
			continue
		}
		switch u.Type {
		case ports.VolumeShare, ports.VolumeBlock:
			return fmt.Errorf("volume %s (%s): no volume plugin handling %q is installed (add its plugin manifest): %w",
				u.Name, u.Kind, u.Type, ports.ErrFailedPrecondition)
		default:
			return &ports.InvalidError{Field: "flexvolume " + u.Name + " option type", Value: u.Type,
				Reason: "no installed volume plugin handles it", Allowed: r.flexvolumeTypes()}
		}
	}
	return nil
}

// assignSerialsAndTags gives each disk volume a serial and each share a
// mount tag, both derived from the volume's name, so that a volume keeps
// them across pods (a persistent root or block device is found again by
// its serial).
func assignSerialsAndTags(uses []VolumeUse) {
	seen := map[string]bool{}
	for i := range uses {
		u := &uses[i]
		id := shortID(u.Name, serialRoom)
		for n := 2; seen[id]; n++ {
			id = shortID(fmt.Sprintf("%s-%d", u.Name, n), serialRoom)
		}
		seen[id] = true
		if u.Type == ports.VolumeShare {
			u.Tag = id
		} else {
			u.Serial = "vol-" + id
		}
	}
}

// Disk serials: virtio-blk shows at most 20 characters.
const (
	maxSerial    = 20
	serialRoom   = maxSerial - len("vol-")
	RootSerial   = "virtlet-root"
	CIDataSerial = "virtlet-cidata"
)

// shortID is name when it fits in n characters of [A-Za-z0-9._-], else a
// prefix of it with a hash of the whole.
func shortID(name string, n int) string {
	ok := len(name) <= n
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			ok = false
		}
	}
	if ok {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:4])
	keep := strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			return c
		}
		return '-'
	}, name)
	if len(keep) > n-len(h)-1 {
		keep = keep[:n-len(h)-1]
	}
	return keep + "-" + h
}

// GuestDiskPath is where udev links a disk with this serial in a Linux
// guest: virtio-blk disks under their serial, SCSI disks under QEMU's
// vendor and model followed by the serial.
func GuestDiskPath(bus ports.DiskBus, serial string) string {
	switch bus {
	case ports.BusVirtio:
		return "/dev/disk/by-id/virtio-" + serial
	case ports.BusSCSI:
		return "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_" + serial
	default:
		return "/dev/disk/by-id/ata-QEMU_HARDDISK_" + serial
	}
}

// volumeRequest is the port request of a volume of container c.
func volumeRequest(c *Container, u VolumeUse) ports.VolumeRequest {
	return ports.VolumeRequest{VMID: c.ID, PodUID: c.Spec.PodUID, PodNamespace: c.Spec.PodNamespace, PodName: c.Spec.PodName,
		Name: u.Name, Type: u.Type, Options: u.Options, HostPath: u.HostPath, ReadOnly: u.ReadOnly, Chown: u.Chown, RunAs: c.Spec.RunAs}
}

// rootfs returns the volume holding the persistent root, if any.
func (p volumePlan) rootfs() *VolumeUse {
	for i := range p.uses {
		if p.uses[i].Rootfs {
			return &p.uses[i]
		}
	}
	return nil
}

// guestVolumes tells cloud-init where the guest finds and mounts each
// volume: one entry per mount path or device path.
func guestVolumes(uses []VolumeUse, formats map[string]diskFormat, bus ports.DiskBus) []cloudinit.Volume {
	var out []cloudinit.Volume
	for _, u := range uses {
		if u.Rootfs {
			continue
		}
		base := cloudinit.Volume{Name: u.Name, Tag: u.Tag}
		if u.Serial != "" {
			base.Serial, base.GuestPath = u.Serial, GuestDiskPath(bus, u.Serial)
			base.Format, base.FormatUUID = formats[u.Serial].fsType, formats[u.Serial].uuid
		}
		if u.DevicePath != "" {
			v := base
			v.DevicePath, v.ReadOnly = u.DevicePath, u.ReadOnly
			out = append(out, v)
		}
		for _, m := range u.Mounts {
			v := base
			v.MountPath, v.ReadOnly = m.Path, m.ReadOnly || u.ReadOnly
			out = append(out, v)
		}
	}
	return out
}

// fsTypeName is what a mkfs.<type> command may be named.
var fsTypeName = regexp.MustCompile(`^[a-z][a-z0-9]{0,15}$`)

// diskFormat is the file system a blank disk gets in the guest.
type diskFormat struct{ fsType, uuid string }

// preparedVolumes is what the volume plugins made for a VM.
type preparedVolumes struct {
	root        *ports.Disk // a persistent root, if any
	disks       []ports.Disk
	filesystems []ports.Filesystem
	formats     map[string]diskFormat // by serial: the file system the guest makes on a blank disk
}

// prepareVolumes asks the plugins for every volume's disks and shares. On
// error the caller releases them all (releasing an unprepared volume is
// harmless).
func (r *volumeService) prepareVolumes(ctx context.Context, c *Container, bus ports.DiskBus, rootfs *ports.RootfsRequest) (preparedVolumes, error) {
	out := preparedVolumes{formats: map[string]diskFormat{}}
	for _, u := range c.Volumes {
		req := volumeRequest(c, u)
		if u.Rootfs {
			req.Rootfs = rootfs
		}
		att, err := r.deps.Volumes[u.Type].Prepare(ctx, req)
		if err != nil {
			return preparedVolumes{}, fmt.Errorf("volume %s (%s): %w", u.Name, u.Kind, err)
		}
		switch {
		case u.Type == ports.VolumeShare:
			if len(att.Filesystems) != 1 || len(att.Disks) != 0 {
				return preparedVolumes{}, fmt.Errorf("volume %s (%s): the %s plugin made %d disks and %d shares, want one share",
					u.Name, u.Kind, u.Type, len(att.Disks), len(att.Filesystems))
			}
			fs := att.Filesystems[0]
			fs.Tag, fs.ReadOnly = u.Tag, fs.ReadOnly || u.ReadOnly
			out.filesystems = append(out.filesystems, fs)
		default:
			if len(att.Disks) != 1 || len(att.Filesystems) != 0 {
				return preparedVolumes{}, fmt.Errorf("volume %s (%s): the %s plugin made %d disks and %d shares, want one disk",
					u.Name, u.Kind, u.Type, len(att.Disks), len(att.Filesystems))
			}
			d := att.Disks[0]
			d.Device, d.Bus, d.Overlay = ports.DeviceDisk, bus, nil
			d.ReadOnly = d.ReadOnly || u.ReadOnly
			if u.Rootfs {
				d.Name, d.Serial, d.Boot = "root", RootSerial, true
				out.root = &d
				continue
			}
			d.Name, d.Serial, d.Boot = "vol-"+u.Name, u.Serial, false
			if att.Format != "" {
				if !fsTypeName.MatchString(att.Format) {
					return preparedVolumes{}, fmt.Errorf("volume %s (%s): the %s plugin asks for file system %q, which is no file system type name",
						u.Name, u.Kind, u.Type, att.Format)
				}
				if _, err := uuid.Parse(att.FormatUUID); att.FormatUUID != "" && err != nil {
					return preparedVolumes{}, fmt.Errorf("volume %s (%s): the %s plugin asks for file system UUID %q: %v",
						u.Name, u.Kind, u.Type, att.FormatUUID, err)
				}
				out.formats[u.Serial] = diskFormat{att.Format, att.FormatUUID}
			}
			out.disks = append(out.disks, d)
		}
	}
	return out, nil
}

// releaseVolumes releases every volume of a VM; it tolerates what is gone
// already and goes on after an error, returning the first.
func (r *volumeService) releaseVolumes(ctx context.Context, c *Container) error {
	var errs []error
	for _, u := range c.Volumes {
		vols, ok := r.deps.Volumes[u.Type]
		if !ok {
			errs = append(errs, fmt.Errorf("volume %s (%s): the plugin for type %q that prepared it is no longer installed", u.Name, u.Kind, u.Type))
			continue
		}
		if err := vols.Release(ctx, volumeRequest(c, u)); err != nil {
			errs = append(errs, fmt.Errorf("release volume %s (%s): %w", u.Name, u.Kind, err))
		}
	}
	return errors.Join(errs...)
}

// ValidateVolume checks a flexvolume's options with the plugin of its type
// and returns the options to keep in the volume's directory.
func (r *volumeService) ValidateVolume(ctx context.Context, fv ports.FlexvolumeOptions) (map[string]string, error) {
	req, vols, err := r.flexvolumeRequest(fv)
	if err != nil {
		return nil, err
	}
	kept, err := vols.Validate(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("flexvolume %s (type %s): %w", fv.Volume, req.Type, err)
	}
	out := make(map[string]string, len(kept)+1)
	maps.Copy(out, kept)
	out["type"] = req.Type
	return out, nil
}

// ForgetVolume lets the plugin of a flexvolume's type drop what it kept.
// A type no installed plugin handles has nobody to tell: kubelet's unmount
// must not fail for ever (the pod would never finish terminating).
func (r *volumeService) ForgetVolume(ctx context.Context, fv ports.FlexvolumeOptions) error {
	req, vols, err := r.flexvolumeRequest(fv)
	if errors.Is(err, ports.ErrInvalidArgument) && fv.Options["type"] != "" {
		r.log.WithFields(logrus.Fields{"pod": fv.PodNamespace + "/" + fv.PodName, "volume": fv.Volume, "type": fv.Options["type"]}).
			Warn("unmounting a flexvolume whose type no installed plugin handles; nothing to forget")
		return nil
	}
	if err != nil {
		return err
	}
	if err := vols.Forget(ctx, req); err != nil {
		return fmt.Errorf("flexvolume %s (type %s): %w", fv.Volume, req.Type, err)
	}
	return nil
}

func (r *volumeService) flexvolumeRequest(fv ports.FlexvolumeOptions) (ports.VolumeRequest, ports.Volumes, error) {
	typ := fv.Options["type"]
	if typ == "" {
		return ports.VolumeRequest{}, nil, &ports.InvalidError{Field: "option type", Reason: "missing",
			Allowed: "one of the installed volume types: " + r.flexvolumeTypes()}
	}
	if typ == ports.VolumeShare || typ == ports.VolumeBlock {
		return ports.VolumeRequest{}, nil, &ports.InvalidError{Field: "option type", Value: typ,
			Reason: "this type is for Kubernetes volumes, not flexvolumes", Allowed: r.flexvolumeTypes()}
	}
	vols, ok := r.deps.Volumes[typ]
	if !ok {
		return ports.VolumeRequest{}, nil, &ports.InvalidError{Field: "option type", Value: typ,
			Reason: "no installed volume plugin handles it", Allowed: r.flexvolumeTypes()}
	}
	opts := make(map[string]string, len(fv.Options))
	for k, v := range fv.Options {
		if k != "type" {
			opts[k] = v
		}
	}
	return ports.VolumeRequest{PodUID: fv.PodUID, PodNamespace: fv.PodNamespace, PodName: fv.PodName,
		Name: fv.Volume, Type: typ, Options: opts}, vols, nil
}

func (r *volumeService) flexvolumeTypes() string {
	var types []string
	for t := range r.deps.Volumes {
		if t != ports.VolumeShare && t != ports.VolumeBlock {
			types = append(types, t)
		}
	}
	sort.Strings(types)
	if len(types) == 0 {
		return "(no flexvolume type is installed)"
	}
	return strings.Join(types, ", ")
}
