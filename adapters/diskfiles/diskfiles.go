// Package diskfiles writes files into the root file system of a VM's disk
// before the VM boots (VirtletFilesFromDataSource), with maintained tools
// rather than file system code of our own: qemu-storage-daemon exports a
// qcow2 image as a raw file over FUSE, loop devices map it (or a raw file or
// block device, from an offset) and its partitions, and the kernel mounts
// the file system. The root file system is the first one holding /etc and
// /usr (or /bin). Files are created through openat2(RESOLVE_IN_ROOT), so a
// symlink in the image can never lead a write out of it.
package diskfiles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/ports"
)

// Disk is the disk whose root file system receives the files.
type Disk struct {
	Path   string // image file or block device
	Format string // "qcow2" or "raw"
	// Offset and Size, when Offset is set, restrict a raw disk to a slice.
	Offset, Size int64
}

// Write writes files into the disk's root file system. workDir is a
// private directory for the export and the mount point; it is removed.
func Write(ctx context.Context, disk Disk, files []ports.GuestFile, workDir string) (err error) {
	if err := os.MkdirAll(workDir, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(workDir)
	var undo []func() error
	defer func() {
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](); uerr != nil && err == nil {
				err = uerr
			}
		}
	}()
	raw := disk.Path
	switch disk.Format {
	case "raw":
	case "qcow2":
		exp, stop, err := exportFUSE(ctx, disk.Path, workDir)
		if err != nil {
			return err
		}
		undo = append(undo, stop)
		raw = exp
	default:
		return &ports.InvalidError{Field: "disk format", Value: disk.Format, Allowed: "qcow2 or raw"}
	}
	// Read the partition table through a loop device of the whole disk,
	// then map each candidate straight from the source, so that every loop
	// device left by a crash names a file of the work directory (Cleanup).
	whole, err := attachLoop(ctx, workDir, raw, disk.Offset, disk.Size)
	if err != nil {
		return err
	}
	parts, err := partitions(ctx, whole)
	if derr := detachLoop(whole); err == nil {
		err = derr
	}
	if err != nil {
		return err
	}
	mnt := filepath.Join(workDir, "root")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	var tried []string
	for _, p := range parts {
		size := p.size
		if size == 0 {
			size = disk.Size
		}
		dev, err := attachLoop(ctx, workDir, raw, disk.Offset+p.start, size)
		if err != nil {
			return err
		}
		undo = append(undo, func() error { return detachLoop(dev) })
		found, err := mountIfRoot(ctx, dev, mnt)
		tried = append(tried, p.String(err))
		if !found {
			continue
		}
		werr := writeFiles(mnt, files)
		if uerr := unmount(mnt); werr == nil {
			werr = uerr
		}
		return werr
	}
	return fmt.Errorf("the disk holds no Linux root file system (one with /etc and /usr or /bin): %s: %w",
		strings.Join(tried, "; "), ports.ErrFailedPrecondition)
}

// exportFUSE runs qemu-storage-daemon exporting a qcow2 image (with its
// backing chain) as a writable raw file, until stop is called.
func exportFUSE(ctx context.Context, image, workDir string) (string, func() error, error) {
	exp := filepath.Join(workDir, "disk.raw")
	if err := os.WriteFile(exp, nil, 0o600); err != nil {
		return "", nil, err
	}
	cmd := exec.Command("qemu-storage-daemon",
		"--blockdev", "driver=file,node-name=file,filename="+image,
		"--blockdev", "driver=qcow2,node-name=disk,file=file",
		"--export", "type=fuse,id=exp,node-name=disk,mountpoint="+exp+",writable=on")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start qemu-storage-daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() error {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("qemu-storage-daemon did not stop on SIGTERM")
		}
		return nil
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if mounted(exp) {
			return exp, stop, nil
		}
		select {
		case err := <-exited:
			return "", nil, fmt.Errorf("qemu-storage-daemon exporting %s: %v: %s", image, err, strings.TrimSpace(stderr.String()))
		case <-ctx.Done():
			stop()
			return "", nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("qemu-storage-daemon did not export %s within 15 s: %s", image, strings.TrimSpace(stderr.String()))
		}
	}
}

// Cleanup undoes what an interrupted Write left below workRoot (the
// parent of its work directories): the loop devices each work directory
// lists, those of its exported images, and mounts.
func Cleanup(workRoot string) error {
	var errs []error
	dirs, _ := os.ReadDir(workRoot)
	recorded := map[string]string{} // loop device → its backing file, as Write attached it
	for _, d := range dirs {
		data, _ := os.ReadFile(filepath.Join(workRoot, d.Name(), loopsFile))
		for _, line := range strings.Split(string(data), "\n") {
			if dev, back, ok := strings.Cut(line, "\t"); ok {
				recorded[dev] = back
			}
		}
	}
	// Loop devices first: a loop device keeps its file's mount busy.
	out, err := exec.Command("losetup", "--list", "--json", "--output", "NAME,BACK-FILE").Output()
	if err == nil {
		var list struct {
			Loops []struct {
				Name     string `json:"name"`
				BackFile string `json:"back-file"`
			} `json:"loopdevices"`
		}
		if json.Unmarshal(out, &list) == nil {
			for _, l := range list.Loops {
				back := strings.TrimSpace(l.BackFile)
				if strings.HasPrefix(back, workRoot+"/") || (recorded[l.Name] != "" && recorded[l.Name] == back) {
					if err := detachLoop(l.Name); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
	}
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(workRoot))
	if err != nil {
		errs = append(errs, err)
	}
	sort.Slice(mounts, func(i, j int) bool { return mounts[i].Mountpoint > mounts[j].Mountpoint }) // deepest first
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m.Mountpoint, err))
		}
	}
	if err := os.RemoveAll(workRoot); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// loopsFile, in a work directory, lists the loop devices Write attached
// ("<device>\t<backing file>" lines), for Cleanup after a crash.
const loopsFile = "loops"

// mounted reports whether p is a mount point.
func mounted(p string) bool {
	ok, err := mountinfo.Mounted(p)
	return err == nil && ok
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// attachLoop maps a slice of file to a loop device, and records it in the
// work directory for Cleanup.
func attachLoop(ctx context.Context, workDir, file string, offset, size int64) (string, error) {
	args := []string{"--find", "--show"}
	if offset > 0 {
		args = append(args, "--offset", strconv.FormatInt(offset, 10))
	}
	if size > 0 {
		args = append(args, "--sizelimit", strconv.FormatInt(size, 10))
	}
	dev, err := run(ctx, "losetup", append(args, file)...)
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(filepath.Join(workDir, loopsFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err == nil {
		fmt.Fprintf(f, "%s\t%s\n", dev, file)
		err = f.Sync()
		f.Close()
	}
	if err != nil {
		detachLoop(dev)
		return "", fmt.Errorf("record loop device %s: %w", dev, err)
	}
	return dev, nil
}

func detachLoop(dev string) error {
	_, err := run(context.Background(), "losetup", "--detach", dev)
	return err
}

func unmount(p string) error {
	if err := unix.Unmount(p, 0); err != nil {
		return fmt.Errorf("unmount %s: %w", p, err)
	}
	return nil
}

// part is a candidate file system: a partition, or (size 0) the whole disk.
type part struct {
	start, size int64 // bytes
	num         int
	ptype       string
}

func (p part) String(err error) string {
	what := "the whole disk"
	if p.size > 0 {
		what = fmt.Sprintf("partition %d (type %s)", p.num, p.ptype)
	}
	if err != nil {
		return what + ": " + err.Error()
	}
	return what + ": no /etc"
}

// partitions lists the disk's partitions, Linux ones first, or the whole
// disk when it has no partition table.
func partitions(ctx context.Context, dev string) ([]part, error) {
	out, err := exec.CommandContext(ctx, "sfdisk", "--json", dev).Output()
	if err != nil || len(out) == 0 {
		return []part{{}}, nil // no partition table: a file system on the whole disk
	}
	var table struct {
		PartitionTable struct {
			SectorSize int64 `json:"sectorsize"`
			Partitions []struct {
				Node  string `json:"node"`
				Start int64  `json:"start"`
				Size  int64  `json:"size"`
				Type  string `json:"type"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal(out, &table); err != nil {
		return nil, fmt.Errorf("read the partition table: %w", err)
	}
	sector := table.PartitionTable.SectorSize
	if sector == 0 {
		sector = 512
	}
	var parts []part
	for i, p := range table.PartitionTable.Partitions {
		parts = append(parts, part{start: p.Start * sector, size: p.Size * sector, num: i + 1, ptype: p.Type})
	}
	linux := func(t string) bool {
		t = strings.ToLower(t)
		return t == "83" || t == "0fc63daf-8483-4772-8e79-3d69d8477de4" || strings.HasPrefix(t, "4f68bce3") // MBR Linux, GPT Linux data, GPT x86-64 root
	}
	sort.SliceStable(parts, func(i, j int) bool { return linux(parts[i].ptype) && !linux(parts[j].ptype) })
	if len(parts) == 0 {
		return []part{{}}, nil
	}
	return parts, nil
}

// mountIfRoot mounts dev at mnt and keeps it mounted, read-write, if it
// holds a root file system.
func mountIfRoot(ctx context.Context, dev, mnt string) (bool, error) {
	// The image's file system is the image author's (or, on a persistent
	// root, the previous guest's): only the file systems a root is made
	// of are tried, and nothing on it is a device, set-uid or executable
	// for the host.
	if _, err := run(ctx, "mount", "-t", rootFSTypes, "-o", "ro,"+safeMount, dev, mnt); err != nil {
		return false, errors.New("no " + rootFSTypes + " file system")
	}
	isDir := func(p string) bool {
		st, err := os.Lstat(filepath.Join(mnt, p))
		return err == nil && st.IsDir()
	}
	if !isDir("etc") || !(isDir("usr") || isDir("bin")) {
		return false, unmount(mnt)
	}
	if _, err := run(ctx, "mount", "-o", "remount,rw,"+safeMount, mnt); err != nil {
		unmount(mnt)
		return false, err
	}
	return true, nil
}

const (
	rootFSTypes = "ext4,ext3,ext2,xfs,btrfs"
	safeMount   = "nodev,nosuid,noexec"
)

// writeFiles writes the files below root, resolving every path inside it.
func writeFiles(root string, files []ports.GuestFile) error {
	rootFD, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	for _, f := range files {
		if err := writeFile(rootFD, f); err != nil {
			what := f.Path
			if f.Source != "" {
				what += " (" + f.Source + ")"
			}
			return fmt.Errorf("write %s: %w", what, err)
		}
	}
	if err := unix.Syncfs(rootFD); err != nil {
		return fmt.Errorf("sync the root file system: %w", err)
	}
	return nil
}

const resolveInRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

func writeFile(rootFD int, f ports.GuestFile) error {
	rel := strings.TrimPrefix(path.Clean(f.Path), "/")
	if rel == "" || rel == "." || strings.HasPrefix(rel, "../") {
		return &ports.InvalidError{Field: "file path", Value: f.Path, Allowed: "an absolute path"}
	}
	if err := mkdirAll(rootFD, path.Dir(rel)); err != nil {
		return err
	}
	mode := f.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	// Non-blocking, so that a FIFO never stalls the plugin; whatever is
	// there must be a regular file (a device node could be the host's).
	fd, err := unix.Openat2(rootFD, rel, &unix.OpenHow{
		Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC, Mode: uint64(mode), Resolve: resolveInRoot,
	})
	if err != nil {
		return err
	}
	file := os.NewFile(uintptr(fd), f.Path)
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("the image holds a %s there, not a regular file: %w", fileType(st.Mode()), ports.ErrFailedPrecondition)
	}
	if err := file.Truncate(0); err != nil {
		return err
	}
	if _, err := file.Write(f.Data); err != nil {
		return err
	}
	if err := file.Chown(0, 0); err != nil {
		return err
	}
	return file.Chmod(fs.FileMode(mode))
}

func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeDevice != 0:
		return "device node"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m.IsDir():
		return "directory"
	default:
		return "special file"
	}
}

// mkdirAll makes the directories of rel (relative to the root) that are
// missing, owned by root, mode 0755.
func mkdirAll(rootFD int, rel string) error {
	if rel == "." || rel == "" {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		dir := strings.Join(parts[:i+1], "/")
		fd, err := unix.Openat2(rootFD, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveInRoot})
		if err == nil {
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("directory /%s: %w", dir, err)
		}
		parent := strings.Join(parts[:i], "/")
		if parent == "" {
			parent = "."
		}
		pfd, err := unix.Openat2(rootFD, parent, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveInRoot})
		if err != nil {
			return fmt.Errorf("directory /%s: %w", parent, err)
		}
		err = unix.Mkdirat(pfd, parts[i], 0o755)
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("make directory /%s: %w", dir, err)
		}
	}
	return nil
}
