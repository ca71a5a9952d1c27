// Package iso writes cloud-init media: ISO 9660 images in pure Go, one per
// VM, in a directory only the plugin can list (0711; the image files are
// 0600 and libvirt hands them to QEMU while the VM runs). The nocloud and
// configdrive packages give it their file layout and volume label.
package iso

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"

	"github.com/kdomanski/iso9660"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/ports"
)

// Layout maps a media request to the files of the image, by path.
type Layout func(req ports.MediaRequest) (map[string][]byte, error)

// Media is a ports.Datasource writing ISO images.
type Media struct {
	Name   string // datasource name: "nocloud" or "configdrive"
	Label  string // ISO volume label: "cidata" or "config-2"
	Layout Layout
	dir    string
}

func (m *Media) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: m.Name, Kind: ports.KindDatasource, Handles: []string{m.Name}}
}

// DefaultConfig declares that the plugin takes no config
// (ports.ConfigDefaulter).
func (m *Media) DefaultConfig() any { return struct{}{} }

// Configure takes the plugin's state directory. The ISO library stages
// the files (secrets included) under $TMPDIR, which the plugin host makes
// a private directory of the plugin process, emptied at every launch; the
// process environment is never changed here (it is the whole process's).
func (m *Media) Configure(ctx context.Context, pc ports.PluginConfig) error {
	if err := pc.Decode(&struct{}{}); err != nil {
		return err
	}
	if pc.StateDir == "" {
		return fmt.Errorf("%s: needs a state directory: %w", m.Name, ports.ErrInvalidArgument)
	}
	// Where earlier versions staged files: what a crash left may be secret.
	if err := os.RemoveAll(filepath.Join(pc.StateDir, "staging")); err != nil {
		return fmt.Errorf("clean old staging directory: %w", err)
	}
	if err := m.SetDir(filepath.Join(pc.StateDir, "media"), pc.StateDir); err != nil {
		return err
	}
	// Half-written images of a process killed while writing them (they
	// may hold secrets); no write is in progress before Configure.
	_, err := atomicfile.RemoveTemps(m.dir)
	return err
}

// SetDir sets where images are written; every directory from parent down
// is made traversable for QEMU (not listable).
func (m *Media) SetDir(dir, parent string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
		if d == parent || d == filepath.Dir(d) {
			break
		}
	}
	m.dir = dir
	return nil
}

var vmID = regexp.MustCompile(`^[0-9a-f]{8,64}$`)

func (m *Media) path(id string) (string, error) {
	if !vmID.MatchString(id) {
		return "", &ports.InvalidError{Field: "VM ID", Value: id, Allowed: "8 to 64 lowercase hex digits"}
	}
	if m.dir == "" {
		return "", fmt.Errorf("%s: not configured: %w", m.Name, ports.ErrUnavailable)
	}
	return filepath.Join(m.dir, id+".iso"), nil
}

// BuildMedia writes the VM's image (replacing an older one) and returns
// the read-only CD-ROM to attach; the caller chooses the bus.
func (m *Media) BuildMedia(ctx context.Context, req ports.MediaRequest) (ports.Disk, error) {
	if req.Datasource != m.Name {
		return ports.Disk{}, &ports.InvalidError{Field: "datasource", Value: req.Datasource, Allowed: m.Name}
	}
	p, err := m.path(req.VMID)
	if err != nil {
		return ports.Disk{}, err
	}
	files, err := m.Layout(req)
	if err != nil {
		return ports.Disk{}, fmt.Errorf("%s media of VM %s: %w", m.Name, req.VMID, err)
	}
	if err := Write(p, m.Label, files); err != nil {
		return ports.Disk{}, fmt.Errorf("%s media of VM %s: %w", m.Name, req.VMID, err)
	}
	return ports.Disk{Name: "cloud-init", Device: ports.DeviceCDROM, ReadOnly: true,
		Source: ports.DiskSource{Type: ports.SourceFile, Path: p, Format: "raw"}}, nil
}

// RemoveMedia deletes the VM's image.
func (m *Media) RemoveMedia(ctx context.Context, id string) error {
	p, err := m.path(id)
	if err != nil {
		return err
	}
	for _, f := range []string{p, p + atomicfile.TempSuffix} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s media of VM %s: %w", m.Name, id, err)
		}
	}
	return nil
}

// MediaAlign is the size every image is padded to a multiple of, with
// zeros after the file system. Media of one datasource then have one size
// (a medium's content is a few KiB), so that the libvirt plugin's pool
// domains can hold a placeholder of that size and a claim writes the
// medium into it instead of hot-plugging a disk (ARCHITECTURE.md, "Boot
// overhead (P1)"); a cold VM's guest sees the same disk.
const MediaAlign = 1 << 20

// Write builds an ISO 9660 image of files at path, padded to a multiple
// of MediaAlign, atomically and durably, mode 0600.
func Write(path, label string, files map[string][]byte) error {
	w, err := iso9660.NewWriter()
	if err != nil {
		return fmt.Errorf("ISO writer: %w", err)
	}
	defer w.Cleanup()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := w.AddFile(bytes.NewReader(files[name]), name); err != nil {
			return fmt.Errorf("add %s: %w", name, err)
		}
	}
	return atomicfile.WriteFunc(path, 0o600, func(f io.Writer) error {
		n := &countingWriter{w: f}
		if err := w.WriteTo(n, label); err != nil {
			return fmt.Errorf("write ISO: %w", err)
		}
		pad := -n.n & (MediaAlign - 1)
		if t, ok := f.(interface{ Truncate(int64) error }); ok && pad > 0 {
			// A hole: nothing more to write or sync.
			if err := t.Truncate(n.n + pad); err != nil {
				return fmt.Errorf("pad ISO: %w", err)
			}
		} else if _, err := f.Write(make([]byte, pad)); err != nil {
			return fmt.Errorf("pad ISO: %w", err)
		}
		return nil
	})
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

var _ ports.Datasource = (*Media)(nil)
