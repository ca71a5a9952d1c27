package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/adapters/diskimage"
	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/ports"
)

// createOverlay makes the copy-on-write root disk of a VM: a qcow2 file
// whose backing file is the image in the image store (never written, never
// copied), grown to the requested size. The base's format is given
// explicitly, so QEMU never probes it, and only diskimage's own parser
// reads it here.
func createOverlay(ctx context.Context, path string, o ports.DiskOverlay, disk string) (time.Duration, error) {
	info, err := diskimage.Inspect(o.BasePath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, fmt.Errorf("disk %s: image file %s does not exist: %w", disk, o.BasePath, ports.ErrNotFound)
	case err != nil:
		return 0, fmt.Errorf("disk %s: image file %s: %v: %w", disk, o.BasePath, err, ports.ErrInvalidArgument)
	case o.BaseFormat != "" && o.BaseFormat != info.Format:
		return 0, &ports.InvalidError{Field: "disk " + disk + " base format", Value: o.BaseFormat,
			Reason: fmt.Sprintf("the image file is %s", info.Format), Allowed: info.Format}
	case o.SizeBytes > 0 && o.SizeBytes < info.VirtualSize:
		return 0, &ports.InvalidError{Field: "disk " + disk + " size", Value: strconv.FormatInt(o.SizeBytes, 10),
			Reason: fmt.Sprintf("smaller than the image's virtual size %d", info.VirtualSize), Allowed: "at least the image's virtual size"}
	}
	size := max(o.SizeBytes, info.VirtualSize)
	if o.KeepFreeBytes > 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
			return 0, fmt.Errorf("disk %s: free space of %s: %w", disk, filepath.Dir(path), err)
		}
		if free := int64(st.Bavail) * int64(st.Bsize); free < o.KeepFreeBytes {
			return 0, fmt.Errorf("disk %s: the VMs' disks' file system has %d bytes free; the node keeps %d free (keepFreeSpace): %w",
				disk, free, o.KeepFreeBytes, ports.ErrUnavailable)
		}
	}
	start := time.Now()
	// -u: qemu-img (root's) does not open the base, an untrusted image;
	// Inspect has read its header, and the size is given.
	cmd := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-u", "-F", info.Format, "-b", o.BasePath, path, strconv.FormatInt(size, 10))
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(path)
		return 0, fmt.Errorf("disk %s: qemu-img create: %v: %s", disk, err, strings.TrimSpace(string(out)))
	}
	// The guest's writes land here: root's alone (qemu-img leaves it
	// 0644); libvirt hands it to QEMU's user while the VM runs.
	if err := os.Chmod(path, 0o600); err != nil {
		os.Remove(path)
		return 0, fmt.Errorf("disk %s: %w", disk, err)
	}
	return time.Since(start), nil
}

// removeFiles deletes a VM's files; absent files are fine.
func removeFiles(paths ...string) error {
	var errs []error
	for _, p := range paths {
		if p == "" {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// consoleSideFiles lists the files that go with a console log:
// virtlogd's rotated copies of it and its tailer's position file.
func consoleSideFiles(path string) []string {
	matches, _ := filepath.Glob(path + ".[0-9]*")
	if _, err := os.Lstat(positionFile(path)); err == nil {
		matches = append(matches, positionFile(path))
	}
	return matches
}

// removeLeftovers removes the files Define makes for VM id in vmDir
// before it saves the record that names them (overlays, console logs, a
// restored VM's state, the record's temporary file): a plugin killed in between leaves them
// unnamed.
func removeLeftovers(vmDir string, store recordStore, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	if vmDir == "" {
		return nil
	}
	overlays, _ := filepath.Glob(filepath.Join(vmDir, id+"-*.qcow2"))
	console := filepath.Join(vmDir, id+".console")
	files := append(overlays, console, restoreStatePath(vmDir, id), store.path(id)+atomicfile.TempSuffix)
	if err := removeFiles(append(files, consoleSideFiles(console)...)...); err != nil {
		return fmt.Errorf("remove files of VM %s: %w", id, err)
	}
	return nil
}
