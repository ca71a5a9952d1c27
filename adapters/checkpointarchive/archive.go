// Package checkpointarchive writes VM checkpoints as tar archives laid out
// the way checkpointctl reads container checkpoints (its lib/metadata.go:
// config.dump, spec.dump, checkpoint/), so that the ecosystem's tools can
// show them:
//
//	config.dump            the container: ID, name, image, runtime, times
//	spec.dump              an OCI runtime spec holding only annotations: the
//	                       container's and the CRI keys naming its pod
//	checkpoint/memory.save the VM's memory and device state (a libvirt save
//	                       image, which embeds the domain XML)
//	checkpoint/domain.xml  the domain's definition, for people and tools
//	checkpoint/virtlet.json what a restore needs: the VM's spec (no secrets),
//	                       its disks, machine type, accelerator, hypervisor
//	disks/<name>.<format>  the copies of the VM's writable disks (a root
//	                       overlay holds only what the guest changed)
//
// The archive is written whole or not at all (a temporary file renamed),
// mode 0600: it holds the guest's memory, and so whatever secrets the
// guest held.
package checkpointarchive

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/ports"
)

// File names in the archive (checkpointctl's lib/metadata.go).
const (
	ConfigDumpFile   = "config.dump"
	SpecDumpFile     = "spec.dump"
	CheckpointDir    = "checkpoint"
	VirtletMetaFile  = "checkpoint/virtlet.json"
	FormatVersion    = 1
	workDirPattern   = ".virtlet-checkpoint-*"
	archiveFileMode  = 0o600
	archiveDirMode   = 0o700
	maxArchiveMember = 1 << 40 // no sane VM has a larger file; guards the tar header
)

// ContainerConfig is config.dump: checkpointctl's metadata.ContainerConfig
// (a reduced copy of Podman's).
type ContainerConfig struct {
	ID              string    `json:"id"`
	Name            string    `json:"name"`
	RootfsImage     string    `json:"rootfsImage,omitempty"`
	RootfsImageRef  string    `json:"rootfsImageRef,omitempty"`
	RootfsImageName string    `json:"rootfsImageName,omitempty"`
	OCIRuntime      string    `json:"runtime,omitempty"`
	CreatedTime     time.Time `json:"createdTime"`
	CheckpointedAt  time.Time `json:"checkpointedTime"`
	RestoredAt      time.Time `json:"restoredTime"`
	Restored        bool      `json:"restored"`
}

// VirtletMeta is checkpoint/virtlet.json: what a restore needs beyond the
// state file.
type VirtletMeta struct {
	FormatVersion  int                    `json:"formatVersion"`
	Runtime        string                 `json:"runtime"`
	RuntimeVersion string                 `json:"runtimeVersion"`
	CheckpointedAt time.Time              `json:"checkpointedAt"`
	Pod            PodMeta                `json:"pod"`
	Container      ContainerMeta          `json:"container"`
	VM             ports.VMSpec           `json:"vm"`
	StateFile      string                 `json:"stateFile"`
	DefinitionFile string                 `json:"definitionFile"`
	Disks          []ports.CheckpointDisk `json:"disks"`
	Skipped        []ports.CheckpointDisk `json:"skipped,omitempty"`
	PausedMillis   int64                  `json:"pausedMillis"`
	Hypervisor     string                 `json:"hypervisor"`
	Machine        string                 `json:"machine"`
	Accelerator    string                 `json:"accelerator"`
}

// PodMeta is the checkpointed container's pod.
type PodMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	UID         string            `json:"uid"`
	SandboxID   string            `json:"sandboxID"`
	IPs         []string          `json:"ips,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ContainerMeta is the checkpointed container.
type ContainerMeta struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Attempt     uint32            `json:"attempt"`
	Image       string            `json:"image"`
	ImageRef    string            `json:"imageRef,omitempty"`
	ImageID     string            `json:"imageID,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	CreatedAt   time.Time         `json:"createdAt"`
}

// Archiver writes checkpoint archives (ports.CheckpointArchiver) and
// reads them (ports.CheckpointReader).
type Archiver struct {
	runtime, version string
	workDir          string
	log              logrus.FieldLogger
}

// Options configure an archiver.
type Options struct {
	// Runtime and Version name the archives' writer.
	Runtime, Version string
	// WorkDir is where checkpoints are gathered before they are packed,
	// and archives unpacked for a restore (in the daemon's state
	// directory: a VM's memory may not fit a tmpfs, and a crash's leftovers
	// are found there). What an earlier process left there is removed.
	WorkDir string
	Log     logrus.FieldLogger
}

// New returns an archiver.
func New(o Options) *Archiver {
	if o.WorkDir != "" {
		// An archive being written when the daemon died left its
		// temporary file beside its location (kubelet's directory): the
		// file named in the working directory's note goes with it.
		notes, _ := filepath.Glob(filepath.Join(o.WorkDir, workDirPattern+destinationNote))
		for _, n := range notes {
			if tmp, err := os.ReadFile(n); err == nil && removeInterruptedArchive(string(tmp)) {
				o.Log.WithField("file", string(tmp)).Warn("removed an archive an earlier run left half written")
			}
			os.Remove(n)
		}
		left, _ := filepath.Glob(filepath.Join(o.WorkDir, workDirPattern))
		for _, d := range left {
			if err := os.RemoveAll(d); err != nil {
				o.Log.WithError(err).WithField("dir", d).Warn("remove a checkpoint an earlier run left unpacked")
			}
		}
	}
	return &Archiver{runtime: o.Runtime, version: o.Version, workDir: o.WorkDir, log: o.Log}
}

var (
	_ ports.CheckpointArchiver = (*Archiver)(nil)
	_ ports.CheckpointReader   = (*Archiver)(nil)
)

// WriteCheckpoint makes a working directory (in the work directory, else
// beside location), has capture fill it, and packs it into location.
func (a *Archiver) WriteCheckpoint(ctx context.Context, location string, meta ports.CheckpointMeta,
	capture func(ctx context.Context, dir string) (ports.VMCheckpoint, error)) (ports.CheckpointArchive, error) {
	var out ports.CheckpointArchive
	if err := checkLocation(location); err != nil {
		return out, err
	}
	work, err := a.newWorkDir(filepath.Dir(location))
	if err != nil {
		return out, fmt.Errorf("checkpoint to %s: working directory: %w", location, err)
	}
	defer func() {
		if err := os.RemoveAll(work); err != nil {
			a.log.WithError(err).WithField("dir", work).Warn("remove a checkpoint's working directory")
		}
	}()
	if err := os.Chmod(work, archiveDirMode); err != nil {
		return out, fmt.Errorf("checkpoint to %s: %w", location, err)
	}
	cp, err := capture(ctx, work)
	if err != nil {
		return out, err
	}
	files, err := a.metadataFiles(meta, cp)
	if err != nil {
		return out, err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(work, filepath.FromSlash(name)), data, archiveFileMode); err != nil {
			return out, fmt.Errorf("checkpoint to %s: %w", location, err)
		}
	}
	// The archive goes through a temporary file beside its location: a
	// note beside the working directory names it, so that the next
	// daemon removes it should this one die meanwhile.
	if a.workDir != "" {
		note := work + destinationNote
		if err := atomicfile.Write(note, []byte(location+atomicfile.TempSuffix), 0o600); err != nil {
			return out, fmt.Errorf("checkpoint to %s: %w", location, err)
		}
		defer os.Remove(note)
	}
	if err := atomicfile.WriteFunc(location, archiveFileMode, func(w io.Writer) error { return packDir(ctx, w, work) }); err != nil {
		return out, fmt.Errorf("checkpoint to %s: %w", location, err)
	}
	info, err := os.Stat(location)
	if err != nil {
		return out, fmt.Errorf("checkpoint to %s: %w", location, err)
	}
	return ports.CheckpointArchive{Path: location, Bytes: info.Size(), Checkpoint: cp}, nil
}

// newWorkDir makes a fresh working directory, 0700, in the work
// directory, or in fallback without one.
func (a *Archiver) newWorkDir(fallback string) (string, error) {
	parent := fallback
	if a.workDir != "" {
		if err := os.MkdirAll(a.workDir, archiveDirMode); err != nil {
			return "", err
		}
		parent = a.workDir
	}
	return os.MkdirTemp(parent, workDirPattern)
}

// destinationNote is the suffix of the file beside a working directory
// that names the temporary file its archive is written through.
const destinationNote = ".destination"

// removeInterruptedArchive removes tmp, the temporary file an archive was
// being written through, if it is one: an absolute path ending in
// atomicfile.TempSuffix, a regular file, empty or a checkpoint archive's
// beginning (the note may outlive its file, whose path another file may
// have taken since).
func removeInterruptedArchive(tmp string) bool {
	if !filepath.IsAbs(tmp) || filepath.Clean(tmp) != tmp || !strings.HasSuffix(tmp, atomicfile.TempSuffix) {
		return false
	}
	info, err := os.Lstat(tmp)
	if err != nil || !info.Mode().IsRegular() || info.Size() > 0 && !Recognise(tmp) {
		return false
	}
	return os.Remove(tmp) == nil
}

// checkLocation accepts an absolute path whose directory exists and which
// is not a directory itself.
func checkLocation(location string) error {
	if location == "" || !filepath.IsAbs(location) || filepath.Clean(location) != location {
		return &ports.InvalidError{Field: "location", Value: location, Reason: "it is not a clean absolute path",
			Allowed: "the absolute path of the archive to write (kubelet: <root-dir>/checkpoints/checkpoint-<pod>_<namespace>-<container>-<time>.tar)"}
	}
	if info, err := os.Stat(filepath.Dir(location)); err != nil || !info.IsDir() {
		return &ports.InvalidError{Field: "location", Value: location, Reason: "its directory does not exist",
			Allowed: "a path in an existing directory"}
	}
	if info, err := os.Lstat(location); err == nil && !info.Mode().IsRegular() {
		return &ports.InvalidError{Field: "location", Value: location, Reason: "it exists and is not a regular file",
			Allowed: "a new file, or an earlier archive to replace"}
	}
	return nil
}

// metadataFiles are config.dump, spec.dump and checkpoint/virtlet.json.
func (a *Archiver) metadataFiles(m ports.CheckpointMeta, cp ports.VMCheckpoint) (map[string][]byte, error) {
	config := ContainerConfig{ID: m.ContainerID, Name: m.ContainerName, RootfsImage: m.ImageID, RootfsImageRef: m.ImageRef,
		RootfsImageName: m.Image, OCIRuntime: a.runtime, CreatedTime: m.CreatedAt, CheckpointedAt: m.CheckpointedAt}
	annotations := map[string]string{}
	for k, v := range m.Annotations {
		annotations[k] = v
	}
	// The keys containerd's CRI plugin sets, which checkpointctl reads for
	// the pod and the container (it knows no other engine by name but
	// Podman and CRI-O).
	for k, v := range map[string]string{
		"io.kubernetes.cri.container-type":    "container",
		"io.kubernetes.cri.container-name":    m.ContainerName,
		"io.kubernetes.cri.sandbox-id":        m.SandboxID,
		"io.kubernetes.cri.sandbox-name":      m.PodName,
		"io.kubernetes.cri.sandbox-namespace": m.PodNamespace,
		"io.kubernetes.cri.sandbox-uid":       m.PodUID,
		"io.kubernetes.cri.image-name":        m.Image,
		"org.criu.checkpoint.engine.name":     a.runtime,
		"org.criu.checkpoint.engine.version":  a.version,
	} {
		annotations[k] = v
	}
	spec := specs.Spec{Version: specs.Version, Annotations: annotations}
	meta := VirtletMeta{FormatVersion: FormatVersion, Runtime: a.runtime, RuntimeVersion: a.version, CheckpointedAt: m.CheckpointedAt,
		Pod: PodMeta{Name: m.PodName, Namespace: m.PodNamespace, UID: m.PodUID, SandboxID: m.SandboxID, IPs: m.IPs, Annotations: m.PodAnnotations},
		Container: ContainerMeta{ID: m.ContainerID, Name: m.ContainerName, Attempt: m.Attempt, Image: m.Image, ImageRef: m.ImageRef, ImageID: m.ImageID,
			Labels: m.Labels, Annotations: m.Annotations, CreatedAt: m.CreatedAt},
		VM: m.VM.WithoutSecrets(), StateFile: cp.StateFile, DefinitionFile: cp.DefinitionFile, Disks: cp.Disks, Skipped: cp.Skipped,
		PausedMillis: cp.Paused.Milliseconds(), Hypervisor: cp.Hypervisor, Machine: cp.Machine, Accelerator: cp.Accelerator}
	files := map[string][]byte{}
	for name, v := range map[string]any{ConfigDumpFile: config, SpecDumpFile: spec, VirtletMetaFile: meta} {
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("checkpoint metadata %s: %w", name, err)
		}
		files[name] = data
	}
	return files, nil
}

// packDir writes the tree under dir as a tar stream: directories and
// regular files only, names relative to dir.
func packDir(ctx context.Context, w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: filepath.ToSlash(rel) + "/", Mode: archiveDirMode, ModTime: info.ModTime()})
		case info.Mode().IsRegular():
			if info.Size() > maxArchiveMember {
				return fmt.Errorf("%s: %d bytes is more than a checkpoint holds", rel, info.Size())
			}
			return addFile(tw, p, filepath.ToSlash(rel), info)
		default:
			return fmt.Errorf("%s: not a regular file (%s): a checkpoint holds files only", rel, info.Mode().Type())
		}
	})
	return errors.Join(err, tw.Close())
}

func addFile(tw *tar.Writer, p, name string, info fs.FileInfo) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: info.Size(), Mode: archiveFileMode, ModTime: info.ModTime()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}
