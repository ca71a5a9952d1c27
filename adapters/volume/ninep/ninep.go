// Package ninep is the volume plugin of directory volumes (emptyDir,
// hostPath, CSI, local, NFS, iSCSI and Fibre Channel file system volumes): each is shared
// with the VM over virtio-9p.
//
// QEMU runs as its own unprivileged user, and kubelet keeps a pod's
// directories below a directory only root may enter (0750). So the plugin
// bind-mounts each volume into a directory QEMU can traverse
// (<state>/shares/<vm>/<volume>), read-only when the pod mounts it
// read-only, and unmounts it when the VM goes. The bind mount is idmapped
// where the file system allows it (idmap.go): QEMU then uses root's files
// as root would. VirtletChown9pfsMounts gives the volume's files to QEMU's
// user instead, as Virtlet did.
package ninep

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/ports"
)

// Config is the plugin's manifest config.
type Config struct {
	// Owner is libvirt's DAC label (virsh capabilities shows it);
	// VirtletChown9pfsMounts gives a volume's files to it, and idmapped
	// shares map root to it.
	Owner      string `json:"owner,omitempty" jsonschema_description:"the user and group QEMU runs as (user[:group]; without a group, the user's primary one)"`
	AccessMode string `json:"accessMode,omitempty" jsonschema:"enum=squash,enum=mapped" jsonschema_description:"virtio-9p's security model: squash (files keep the host's owners; the guest's chown requests are ignored) or mapped (owners kept in extended attributes)"`
}

// defaultOwner is QEMU's user and group under Debian's libvirt.
const defaultOwner = "libvirt-qemu:libvirt-qemu"

// Volumes is the adapter.
type Volumes struct {
	log      logrus.FieldLogger
	dir      string // the shares' mount points
	uid, gid int
	gids     []int // all of QEMU's user's groups
	mode     string
	userns   *os.File // the idmapping of shares; nil: plain bind mounts
}

// New returns an unconfigured adapter.
func New(log logrus.FieldLogger) *Volumes { return &Volumes{log: log} }

func (v *Volumes) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "ninep", Kind: ports.KindVolume, Handles: []string{ports.VolumeShare}}
}

// DefaultConfig declares the plugin's config (ports.ConfigDefaulter): QEMU's
// user and group are Debian libvirt's.
func (v *Volumes) DefaultConfig() any { return Config{Owner: defaultOwner, AccessMode: "squash"} }

// Configure resolves QEMU's user and makes the shares' directory
// traversable.
func (v *Volumes) Configure(ctx context.Context, pc ports.PluginConfig) error {
	cfg := v.DefaultConfig().(Config)
	if err := pc.Decode(&cfg); err != nil {
		return err
	}
	// The default owner's group, where it does not exist: the user's own.
	if cfg.Owner == defaultOwner {
		if _, err := user.LookupGroup("libvirt-qemu"); err != nil {
			cfg.Owner = "libvirt-qemu"
		}
	}
	if cfg.AccessMode != "squash" && cfg.AccessMode != "mapped" {
		return &ports.InvalidError{Field: "ninep config accessMode", Value: cfg.AccessMode, Allowed: "squash or mapped"}
	}
	uid, gid, err := owner(cfg.Owner)
	if err != nil {
		return &ports.InvalidError{Field: "ninep config owner", Value: cfg.Owner, Reason: err.Error(), Allowed: "a user[:group] of this node"}
	}
	if pc.StateDir == "" {
		return fmt.Errorf("ninep: needs a state directory: %w", ports.ErrInvalidArgument)
	}
	dir := filepath.Join(pc.StateDir, "shares")
	for _, d := range []string{pc.StateDir, dir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	// The shares' directory is a private mount of its own, so that the
	// shares bound below it never propagate to the node's other mounts.
	if !isMountPoint(dir) {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("ninep: bind %s: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("ninep: make %s private: %w", dir, err)
	}
	gids := []int{gid}
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		groups, _ := u.GroupIds()
		for _, g := range groups {
			if n, err := strconv.Atoi(g); err == nil {
				gids = append(gids, n)
			}
		}
	}
	userns, err := newUserNS(uid, gid)
	if err != nil {
		v.log.WithError(err).Warn("shares are plain bind mounts: QEMU's user must be able to read each volume")
	}
	if v.userns != nil {
		v.userns.Close()
	}
	v.dir, v.uid, v.gid, v.gids, v.mode, v.userns = dir, uid, gid, gids, cfg.AccessMode, userns
	return nil
}

// Close unmounts the shares' directory once no share is left in it (tests,
// and the plugin's Shutdown). An unconfigured adapter has nothing to undo.
func (v *Volumes) Close() error {
	if v.dir == "" {
		return nil
	}
	if v.userns != nil {
		v.userns.Close()
		v.userns = nil
	}
	entries, _ := os.ReadDir(v.dir)
	if len(entries) > 0 || !isMountPoint(v.dir) {
		return nil
	}
	return unix.Unmount(v.dir, unix.MNT_DETACH)
}

// Shutdown unmounts the shares' directory when the plugin stops with no
// share left in it (the node's VM pods are gone), so that a stopped
// daemon leaves no mount of its own behind; while shares remain, their
// VMs run on and it stays.
func (v *Volumes) Shutdown(context.Context) {
	if err := v.Close(); err != nil {
		v.log.WithError(err).Warn("unmount the shares' directory")
	}
}

func owner(spec string) (int, int, error) {
	name, group, _ := strings.Cut(spec, ":")
	u, err := user.Lookup(name)
	if err != nil {
		if _, nerr := strconv.Atoi(name); nerr != nil {
			return 0, 0, err
		}
		u = &user.User{Uid: name, Gid: name}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			n, nerr := strconv.Atoi(group)
			if nerr != nil {
				return 0, 0, err
			}
			return uid, n, nil
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	return uid, gid, nil
}

// Validate: shares are not flexvolumes.
func (v *Volumes) Validate(ctx context.Context, req ports.VolumeRequest) (map[string]string, error) {
	return nil, &ports.InvalidError{Field: "volume type", Value: req.Type,
		Reason: "directory shares come from Kubernetes volumes (emptyDir, hostPath, persistent volumes), not flexvolumes"}
}

// Forget has nothing to drop.
func (v *Volumes) Forget(ctx context.Context, req ports.VolumeRequest) error { return nil }

var safeName = regexp.MustCompile(`^[a-zA-Z0-9][-a-zA-Z0-9_.]{0,127}$`)

func (v *Volumes) mountPoint(req ports.VolumeRequest) (string, error) {
	if v.dir == "" {
		return "", fmt.Errorf("ninep: not configured: %w", ports.ErrUnavailable)
	}
	for field, s := range map[string]string{"VM ID": req.VMID, "volume name": req.Name} {
		if !safeName.MatchString(s) {
			return "", &ports.InvalidError{Field: "share " + field, Value: s, Allowed: "letters, digits, '-', '_' and '.'"}
		}
	}
	return filepath.Join(v.dir, req.VMID, req.Name), nil
}

// Prepare bind-mounts the volume's directory where QEMU reaches it.
func (v *Volumes) Prepare(ctx context.Context, req ports.VolumeRequest) (ports.VolumeAttachment, error) {
	mp, err := v.mountPoint(req)
	if err != nil {
		return ports.VolumeAttachment{}, err
	}
	att := ports.VolumeAttachment{Filesystems: []ports.Filesystem{{Source: mp, AccessMode: v.mode, ReadOnly: req.ReadOnly}}}
	field := "volume " + req.Name + " host path"
	if !filepath.IsAbs(req.HostPath) {
		return ports.VolumeAttachment{}, &ports.InvalidError{Field: field, Value: req.HostPath, Allowed: "an absolute path"}
	}
	src, err := filepath.EvalSymlinks(req.HostPath)
	if err != nil {
		return ports.VolumeAttachment{}, &ports.InvalidError{Field: field, Value: req.HostPath, Reason: err.Error(), Allowed: "an existing directory"}
	}
	st, err := os.Stat(src)
	if err != nil {
		return ports.VolumeAttachment{}, err
	}
	if !st.IsDir() {
		return ports.VolumeAttachment{}, &ports.InvalidError{Field: field, Value: req.HostPath,
			Reason: "not a directory: a VM receives directories as 9p shares (files and devices cannot be shared)", Allowed: "a directory"}
	}
	if isMountPoint(mp) {
		return att, nil // prepared already
	}
	// Whom the share is for: the VM's own user, or QEMU's one user.
	uid, gid, gids, userns := v.uid, v.gid, v.gids, v.userns
	if id := req.RunAs; id != nil {
		uid, gid, gids = id.UID, id.GID, []int{id.GID}
		if userns, err = newUserNS(uid, gid); err != nil {
			v.log.WithError(err).WithField("vm", req.VMID).Warn("no user namespace for the VM's user: a plain bind mount")
			userns = nil
		} else {
			defer userns.Close() // the mount keeps the namespace
		}
	}
	if req.Chown {
		n, err := chownTree(src, uid, gid)
		if err != nil {
			return ports.VolumeAttachment{}, fmt.Errorf("volume %s: give %s to QEMU's user (VirtletChown9pfsMounts): %w", req.Name, req.HostPath, err)
		}
		v.log.WithFields(logrus.Fields{"vm": req.VMID, "volume": req.Name, "files": n, "uid": uid, "gid": gid}).Info("share chowned for the VM")
	}
	if err := os.MkdirAll(filepath.Dir(mp), 0o711); err != nil {
		return ports.VolumeAttachment{}, err
	}
	if err := os.Chmod(filepath.Dir(mp), 0o711); err != nil {
		return ports.VolumeAttachment{}, err
	}
	if err := os.Mkdir(mp, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return ports.VolumeAttachment{}, err
	}
	// Chowned files are QEMU's already: an idmapping would hide them.
	idmapped := false
	if userns != nil && !req.Chown {
		if err := bindIDMapped(src, mp, userns, req.ReadOnly); err != nil {
			v.log.WithError(err).WithFields(logrus.Fields{"vm": req.VMID, "volume": req.Name}).Info("no idmapped mount here: a plain bind mount")
		} else {
			idmapped = true
		}
	}
	if !idmapped {
		if can, judged := canRead(src, uid, gids); judged && !can {
			os.Remove(mp)
			return ports.VolumeAttachment{}, &ports.InvalidError{Field: field, Value: req.HostPath,
				Reason:  fmt.Sprintf("QEMU's user (uid %d) may not read it and its file system has no idmapped mounts", uid),
				Allowed: "a directory QEMU's user may read and enter, or the pod annotation VirtletChown9pfsMounts: \"true\""}
		}
		if err := unix.Mount(src, mp, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return ports.VolumeAttachment{}, fmt.Errorf("volume %s: bind %s: %w", req.Name, src, err)
		}
	}
	// Keep the share's mounts to ourselves: nothing propagates to or from
	// the node's mounts once it is made.
	if err := unix.Mount("", mp, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		v.unmount(mp)
		return ports.VolumeAttachment{}, fmt.Errorf("volume %s: make the share private: %w", req.Name, err)
	}
	if req.ReadOnly && !idmapped {
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(-1, mp, unix.AT_RECURSIVE, attr); err != nil {
			v.unmount(mp)
			return ports.VolumeAttachment{}, fmt.Errorf("volume %s: make the share read-only: %w", req.Name, err)
		}
	}
	v.log.WithFields(logrus.Fields{"vm": req.VMID, "volume": req.Name, "source": src, "readOnly": req.ReadOnly, "idmapped": idmapped}).Info("share ready")
	return att, nil
}

// Release unmounts the share; the volume's files stay.
func (v *Volumes) Release(ctx context.Context, req ports.VolumeRequest) error {
	mp, err := v.mountPoint(req)
	if err != nil {
		return err
	}
	if err := v.unmount(mp); err != nil {
		return fmt.Errorf("volume %s: %w", req.Name, err)
	}
	os.Remove(filepath.Dir(mp)) // the VM's directory, once empty
	return nil
}

func (v *Volumes) unmount(mp string) error {
	for isMountPoint(mp) {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount share %s: %w", mp, err)
		}
	}
	if err := os.Remove(mp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove share mount point: %w", err)
	}
	return nil
}

// isMountPoint says whether p is a mount point.
func isMountPoint(p string) bool {
	ok, err := mountinfo.Mounted(p)
	return err == nil && ok
}

// chownTree gives every file below root (not following symlinks, not
// crossing into other file systems) to uid:gid. It walks by directory file
// descriptors: a directory swapped for a symlink while it walks (the share
// may be written by others) fails the walk rather than leading it out.
func chownTree(root string, uid, gid int) (int, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", root, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return 0, err
	}
	n := 0
	var walk func(dirfd int, at string) error
	walk = func(dirfd int, at string) error {
		dir := os.NewFile(uintptr(dirfd), at) // owns dirfd
		defer dir.Close()
		if err := unix.Fchown(dirfd, uid, gid); err != nil {
			return fmt.Errorf("chown %s: %w", at, err)
		}
		n++
		names, err := dir.Readdirnames(-1)
		if err != nil {
			return fmt.Errorf("read %s: %w", at, err)
		}
		for _, name := range names {
			p := filepath.Join(at, name)
			var cst unix.Stat_t
			if err := unix.Fstatat(dirfd, name, &cst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("stat %s: %w", p, err)
			}
			if cst.Dev != st.Dev {
				continue
			}
			if cst.Mode&unix.S_IFMT != unix.S_IFDIR {
				if err := unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return fmt.Errorf("chown %s: %w", p, err)
				}
				n++
				continue
			}
			cfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %s: %w", p, err)
			}
			if err := walk(cfd, p); err != nil {
				return err
			}
		}
		return nil
	}
	return n, walk(fd, root)
}

var _ ports.Volumes = (*Volumes)(nil)
