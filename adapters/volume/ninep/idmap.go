package ninep

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// Idmapped shares. QEMU runs as an unprivileged user, while kubelet's
// volumes (emptyDir, hostPath, ConfigMap and Secret directories) belong to
// root, often with modes only root may use. A share is therefore an
// idmapped bind mount: through it, what root owns on the host appears
// owned by QEMU's user and group, and what QEMU creates is stored as
// root's. The guest then uses its volume as a container's root would,
// the host's files keep their owners, and nothing is chowned. Files of
// other owners appear as the overflow user (readable by mode only).
// File systems without idmapped mounts (tmpfs before Linux 6.3) get a
// plain bind mount.

// newUserNS returns a user namespace whose root is uid:gid on the host:
// the idmapping of the shares. The process made to create it is gone by
// the time it returns; the open file keeps the namespace.
func newUserNS(uid, gid int) (*os.File, error) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		sleep = "/bin/sleep"
	}
	cmd := exec.Command(sleep, "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("create a user namespace for idmapped shares: %w", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	if err != nil {
		return nil, fmt.Errorf("open the idmapped shares' user namespace: %w", err)
	}
	return ns, nil
}

// bindIDMapped mounts src (with its submounts) at dst through the
// idmapping of userns, read-only if asked.
func bindIDMapped(src, dst string, userns *os.File, readOnly bool) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns.Fd())}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		return fmt.Errorf("idmap %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move the idmapped mount of %s to %s: %w", src, dst, err)
	}
	return nil
}

// canRead says whether uid (in the groups gids) may list and enter dir
// by its mode bits; judged is false when an ACL decides instead.
func canRead(dir string, uid int, gids []int) (can, judged bool) {
	if _, err := unix.Getxattr(dir, "system.posix_acl_access", nil); err == nil {
		return false, false
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, false
	}
	const rx = 0o5
	switch {
	case int(st.Uid) == uid:
		return st.Mode>>6&rx == rx, true
	case slices.Contains(gids, int(st.Gid)):
		return st.Mode>>3&rx == rx, true
	}
	return st.Mode&rx == rx, true
}
