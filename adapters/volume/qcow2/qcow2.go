// Package qcow2 is the volume plugin of Virtlet's qcow2 flexvolumes:
// ephemeral disks, one qcow2 file per VM and volume, created empty with
// the volume's capacity (default 1024MB, as in Virtlet) and deleted with
// the VM. The guest's mount script makes a file system on the blank disk
// (the flexVolume's fsType, ext4 by default).
package qcow2

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/volume/flexopts"
	"github.com/virtlet/virtlet/ports"
)

// DefaultCapacity is Virtlet's default size of a qcow2 flexvolume.
const DefaultCapacity = "1024MB"

var schema = flexopts.Schema{Type: "qcow2", Optional: []string{"capacity", "uuid"}}

// Config is the plugin's manifest config.
type Config struct {
	Dir string `json:"dir,omitempty" jsonschema_description:"directory of the disks, which QEMU must be able to traverse to (empty: disks in the plugin's state directory)"`
}

// Volumes is the qcow2 volume adapter.
type Volumes struct {
	log logrus.FieldLogger
	dir string
}

// New returns an unconfigured adapter.
func New(log logrus.FieldLogger) *Volumes { return &Volumes{log: log} }

func (v *Volumes) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "qcow2", Kind: ports.KindVolume, Handles: []string{"qcow2"}}
}

// DefaultConfig declares the plugin's config (ports.ConfigDefaulter).
func (v *Volumes) DefaultConfig() any { return Config{} }

// Configure makes the disk directory, traversable by QEMU's user.
func (v *Volumes) Configure(ctx context.Context, pc ports.PluginConfig) error {
	var cfg Config
	if err := pc.Decode(&cfg); err != nil {
		return err
	}
	if cfg.Dir == "" {
		if pc.StateDir == "" {
			return fmt.Errorf("qcow2: needs a state directory or config dir: %w", ports.ErrInvalidArgument)
		}
		cfg.Dir = filepath.Join(pc.StateDir, "disks")
	}
	for _, d := range []string{pc.StateDir, cfg.Dir} {
		if d == "" {
			continue
		}
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	v.dir = cfg.Dir
	return nil
}

// options are a volume's checked options.
type options struct {
	size   int64
	uuid   string
	fsType string
}

func parse(name string, opts map[string]string) (options, error) {
	if err := schema.Check(name, opts); err != nil {
		return options{}, err
	}
	o := options{}
	c := opts["capacity"]
	if c == "" {
		c = DefaultCapacity
	}
	size, err := flexopts.Capacity(c)
	if err != nil {
		return options{}, schema.Invalid(name, "capacity", c, err.Error(), flexopts.CapacityAllowed)
	}
	o.size = size
	if u := opts["uuid"]; u != "" {
		id, err := uuid.Parse(u)
		if err != nil {
			return options{}, schema.Invalid(name, "uuid", u, "not a UUID", "a UUID, given to the file system made on the disk")
		}
		o.uuid = id.String()
	}
	if o.fsType, err = schema.FSType(name, opts, "ext4"); err != nil {
		return options{}, err
	}
	return o, nil
}

// Validate checks the options; nothing is secret.
func (v *Volumes) Validate(ctx context.Context, req ports.VolumeRequest) (map[string]string, error) {
	if _, err := parse(req.Name, req.Options); err != nil {
		return nil, err
	}
	return schema.Own(req.Options), nil
}

// Forget has nothing to drop.
func (v *Volumes) Forget(ctx context.Context, req ports.VolumeRequest) error { return nil }

var safeName = regexp.MustCompile(`^[a-zA-Z0-9][-a-zA-Z0-9_.]{0,127}$`)

func (v *Volumes) path(req ports.VolumeRequest) (string, error) {
	if v.dir == "" {
		return "", fmt.Errorf("qcow2: not configured: %w", ports.ErrUnavailable)
	}
	for field, s := range map[string]string{"VM ID": req.VMID, "volume name": req.Name} {
		if !safeName.MatchString(s) {
			return "", &ports.InvalidError{Field: "qcow2 " + field, Value: s, Allowed: "letters, digits, '-', '_' and '.'"}
		}
	}
	return filepath.Join(v.dir, req.VMID+"-"+req.Name+".qcow2"), nil
}

// Prepare creates the VM's empty disk, once.
func (v *Volumes) Prepare(ctx context.Context, req ports.VolumeRequest) (ports.VolumeAttachment, error) {
	o, err := parse(req.Name, req.Options)
	if err != nil {
		return ports.VolumeAttachment{}, err
	}
	p, err := v.path(req)
	if err != nil {
		return ports.VolumeAttachment{}, err
	}
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		tmp := p + ".tmp"
		out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", tmp, strconv.FormatInt(o.size, 10)).CombinedOutput()
		if err != nil {
			os.Remove(tmp)
			return ports.VolumeAttachment{}, fmt.Errorf("qemu-img create: %v: %s", err, strings.TrimSpace(string(out)))
		}
		// The guest's data: root's alone (qemu-img leaves it 0644);
		// libvirt hands it to QEMU's user while the VM runs.
		if err := os.Chmod(tmp, 0o600); err != nil {
			os.Remove(tmp)
			return ports.VolumeAttachment{}, err
		}
		if err := os.Rename(tmp, p); err != nil {
			os.Remove(tmp)
			return ports.VolumeAttachment{}, err
		}
		v.log.WithFields(logrus.Fields{"vm": req.VMID, "volume": req.Name, "bytes": o.size}).Info("qcow2 disk created")
	} else if err != nil {
		return ports.VolumeAttachment{}, err
	}
	return ports.VolumeAttachment{
		Disks:  []ports.Disk{{Name: "vol-" + req.Name, Device: ports.DeviceDisk, Source: ports.DiskSource{Type: ports.SourceFile, Path: p, Format: "qcow2"}}},
		Format: o.fsType, FormatUUID: o.uuid,
	}, nil
}

// Release deletes the disk.
func (v *Volumes) Release(ctx context.Context, req ports.VolumeRequest) error {
	p, err := v.path(req)
	if err != nil {
		return err
	}
	for _, f := range []string{p, p + ".tmp"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove qcow2 disk: %w", err)
		}
	}
	return nil
}

var _ ports.Volumes = (*Volumes)(nil)
