package checkpointarchive

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/virtlet/virtlet/ports"
)

// Reading archives, which come from anywhere (an image a pod names): only
// the members a VM checkpoint has, regular files and their directories,
// are read; the metadata is bounded; nothing is followed or overwritten.

// maxMetaBytes bounds virtlet.json, config.dump and spec.dump.
const maxMetaBytes = 1 << 20

// diskMember is a disk copy's name in an archive.
var diskMember = regexp.MustCompile(`^disks/([a-z0-9][a-z0-9-]{0,62})\.(qcow2|raw)$`)

// member says whether name may be in a checkpoint archive, and whether it
// is a directory.
func member(name string) (ok, dir bool) {
	switch name {
	case CheckpointDir + "/", "disks/":
		return true, true
	case ConfigDumpFile, SpecDumpFile, VirtletMetaFile, "checkpoint/memory.save", "checkpoint/domain.xml":
		return true, false
	}
	return diskMember.MatchString(name), false
}

// Recognise tells whether the file at path is a checkpoint archive: a tar
// whose first member is one a checkpoint has. It reads one header.
func Recognise(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	h, err := tar.NewReader(io.LimitReader(f, 1024)).Next()
	if err != nil {
		return false
	}
	ok, _ := member(h.Name)
	return ok
}

// ReadCheckpoint reads the archive's metadata without unpacking it.
func (a *Archiver) ReadCheckpoint(ctx context.Context, archive string) (ports.CheckpointMeta, ports.VMCheckpoint, error) {
	var meta VirtletMeta
	found := false
	err := walkArchive(ctx, archive, func(h *tar.Header, r io.Reader) error {
		if h.Name != VirtletMetaFile {
			return nil
		}
		data, err := io.ReadAll(io.LimitReader(r, maxMetaBytes+1))
		if err != nil {
			return err
		}
		if len(data) > maxMetaBytes {
			return fmt.Errorf("%s is larger than %d bytes", VirtletMetaFile, maxMetaBytes)
		}
		if err := json.Unmarshal(data, &meta); err != nil {
			return fmt.Errorf("%s: %w", VirtletMetaFile, err)
		}
		found = true
		return nil
	})
	if err == nil && !found {
		err = fmt.Errorf("it has no %s: it is not a checkpoint of a VM", VirtletMetaFile)
	}
	if err == nil {
		err = checkMeta(meta)
	}
	if err != nil {
		return ports.CheckpointMeta{}, ports.VMCheckpoint{}, fmt.Errorf("checkpoint archive %s: %v: %w", filepath.Base(archive), err, ports.ErrInvalidArgument)
	}
	m := ports.CheckpointMeta{ContainerID: meta.Container.ID, ContainerName: meta.Container.Name, Attempt: meta.Container.Attempt,
		SandboxID: meta.Pod.SandboxID, PodName: meta.Pod.Name, PodNamespace: meta.Pod.Namespace, PodUID: meta.Pod.UID,
		Image: meta.Container.Image, ImageRef: meta.Container.ImageRef, ImageID: meta.Container.ImageID,
		Labels: meta.Container.Labels, Annotations: meta.Container.Annotations, PodAnnotations: meta.Pod.Annotations, IPs: meta.Pod.IPs,
		CreatedAt: meta.Container.CreatedAt, CheckpointedAt: meta.CheckpointedAt, Runtime: meta.Runtime, RuntimeVersion: meta.RuntimeVersion, VM: meta.VM}
	cp := ports.VMCheckpoint{StateFile: meta.StateFile, DefinitionFile: meta.DefinitionFile, Disks: meta.Disks, Skipped: meta.Skipped,
		Hypervisor: meta.Hypervisor, Machine: meta.Machine, Accelerator: meta.Accelerator}
	return m, cp, nil
}

// checkMeta refuses metadata that names files a checkpoint does not have.
func checkMeta(m VirtletMeta) error {
	switch {
	case m.FormatVersion != FormatVersion:
		return fmt.Errorf("format version %d (this runtime reads %d)", m.FormatVersion, FormatVersion)
	case m.StateFile != "checkpoint/memory.save":
		return fmt.Errorf("state file %q", m.StateFile)
	}
	for _, d := range m.Disks {
		sub := diskMember.FindStringSubmatch(d.File)
		if sub == nil || sub[1] != d.Name || sub[2] != d.Format {
			return fmt.Errorf("disk %q is in %q", d.Name, d.File)
		}
	}
	return nil
}

// UnpackCheckpoint unpacks the state and the disk copies of the archive
// into a fresh directory under the archiver's work directory and calls
// use with them; the directory goes when use returns.
func (a *Archiver) UnpackCheckpoint(ctx context.Context, archive string, use func(ctx context.Context, r ports.VMRestore) error) error {
	_, cp, err := a.ReadCheckpoint(ctx, archive)
	if err != nil {
		return err
	}
	if a.workDir == "" {
		return fmt.Errorf("restore from %s: the daemon has no directory to unpack checkpoints in: %w", filepath.Base(archive), ports.ErrUnimplemented)
	}
	dir, err := a.newWorkDir("")
	if err != nil {
		return fmt.Errorf("restore from %s: %w", filepath.Base(archive), err)
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			a.log.WithError(err).WithField("dir", dir).Warn("remove an unpacked checkpoint")
		}
	}()
	// Only what a restore uses is unpacked: the state and the disks the
	// metadata lists. A member's data is in the archive (no sparse member
	// is read), so what is written is at most the archive's size, which
	// the node bounds as an image's.
	wanted := map[string]bool{cp.StateFile: true}
	for _, d := range cp.Disks {
		wanted[d.File] = true
	}
	err = walkArchive(ctx, archive, func(h *tar.Header, r io.Reader) error {
		if !wanted[h.Name] {
			return nil
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(p), archiveDirMode); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, archiveFileMode)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		return errors.Join(err, f.Close())
	})
	if err != nil {
		return fmt.Errorf("restore from %s: unpack: %w", filepath.Base(archive), err)
	}
	restore := ports.VMRestore{StateFile: filepath.Join(dir, filepath.FromSlash(cp.StateFile)), Disks: map[string]string{}}
	for _, d := range cp.Disks {
		restore.Disks[d.Name] = filepath.Join(dir, filepath.FromSlash(d.File))
	}
	for _, p := range append([]string{restore.StateFile}, mapValues(restore.Disks)...) {
		if info, err := os.Lstat(p); err != nil || !info.Mode().IsRegular() {
			return fmt.Errorf("restore from %s: %s is missing from the archive: %w", filepath.Base(archive), strings.TrimPrefix(p, dir+"/"), ports.ErrInvalidArgument)
		}
	}
	return use(ctx, restore)
}

// sparse tells whether a header describes a sparse file (GNU's type, or
// PAX's GNU.sparse records on a regular file), whose holes would unpack
// to data the archive does not hold.
func sparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// walkArchive calls f with each member of the archive, refusing any that
// a checkpoint does not have.
func walkArchive(ctx context.Context, archive string, f func(h *tar.Header, r io.Reader) error) error {
	file, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer file.Close()
	tr := tar.NewReader(file)
	seen := map[string]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		ok, dir := member(h.Name)
		switch {
		case !ok:
			return fmt.Errorf("member %q is not part of a VM checkpoint", h.Name)
		case dir && h.Typeflag != tar.TypeDir, !dir && h.Typeflag != tar.TypeReg:
			return fmt.Errorf("member %q is of type %q, not a %s", h.Name, h.Typeflag, map[bool]string{true: "directory", false: "regular file"}[dir])
		case seen[h.Name]:
			return fmt.Errorf("member %q is in the archive twice", h.Name)
		case h.Size < 0 || h.Size > maxArchiveMember:
			return fmt.Errorf("member %q has size %d", h.Name, h.Size)
		case sparse(h):
			// A sparse member unpacks to more than the archive holds.
			return fmt.Errorf("member %q is a sparse file", h.Name)
		}
		seen[h.Name] = true
		if err := f(h, tr); err != nil {
			return err
		}
	}
}
