// Package raw is the volume plugin of host block devices: Virtlet's raw
// flexvolumes (a device under /dev that the operator's globs allow), the
// block devices kubelet hands a container for block PersistentVolumes
// (volumeDevices), and the persistent root file system on such a device
// (devicePath "/"). It never deletes or formats a device's data.
package raw

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/adapters/volume/flexopts"
	"github.com/virtlet/virtlet/ports"
)

// Config is the plugin's manifest config.
type Config struct {
	AllowedPaths []string `json:"allowedPaths,omitempty" jsonschema_description:"globs (filepath.Match) under /dev/ that a raw flexvolume's path must match, such as /dev/mapper/vg0-*; empty: no raw flexvolume is allowed"`
}

var schema = flexopts.Schema{Type: "raw", Required: []string{"path"}}

// Volumes is the adapter.
type Volumes struct {
	log logrus.FieldLogger
	cfg Config
	// devRoot is where device nodes live ("/dev"; tests may not change it).
	devRoot string
}

// New returns an adapter allowing no raw flexvolume until configured.
func New(log logrus.FieldLogger) *Volumes { return &Volumes{log: log, devRoot: "/dev"} }

func (v *Volumes) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "raw", Kind: ports.KindVolume, Handles: []string{"raw", ports.VolumeBlock}}
}

// DefaultConfig declares the plugin's config (ports.ConfigDefaulter).
func (v *Volumes) DefaultConfig() any { return Config{} }

// Configure reads the allowed globs.
func (v *Volumes) Configure(ctx context.Context, pc ports.PluginConfig) error {
	var cfg Config
	if err := pc.Decode(&cfg); err != nil {
		return err
	}
	for i, g := range cfg.AllowedPaths {
		if _, err := filepath.Match(g, "/dev/x"); err != nil || !strings.HasPrefix(g, "/dev/") {
			return &ports.InvalidError{Field: fmt.Sprintf("raw config allowedPaths[%d]", i), Value: g, Allowed: "a glob of paths under /dev/"}
		}
	}
	v.cfg = cfg
	return nil
}

// Validate checks a raw flexvolume's path against the operator's globs.
func (v *Volumes) Validate(ctx context.Context, req ports.VolumeRequest) (map[string]string, error) {
	if req.Type != "raw" {
		return nil, &ports.InvalidError{Field: "volume type", Value: req.Type, Allowed: "raw (block volumes are not flexvolumes)"}
	}
	if _, err := v.rawDevice(req); err != nil {
		return nil, err
	}
	return schema.Own(req.Options), nil
}

// Forget has nothing to drop.
func (v *Volumes) Forget(ctx context.Context, req ports.VolumeRequest) error { return nil }

// rawDevice checks a raw flexvolume and returns its device.
func (v *Volumes) rawDevice(req ports.VolumeRequest) (string, error) {
	if err := schema.Check(req.Name, req.Options); err != nil {
		return "", err
	}
	p := req.Options["path"]
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || !strings.HasPrefix(p, v.devRoot+"/") {
		return "", schema.Invalid(req.Name, "path", p, "not a clean path under "+v.devRoot, "a block device under "+v.devRoot)
	}
	if !v.allowed(p) {
		return "", schema.Invalid(req.Name, "path", p, "the node's operator does not allow this device for raw volumes",
			v.allowedList())
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", schema.Invalid(req.Name, "path", p, err.Error(), "an existing block device")
	}
	if !strings.HasPrefix(real, v.devRoot+"/") {
		return "", schema.Invalid(req.Name, "path", p, "it leads to "+real+", outside "+v.devRoot, "a block device under "+v.devRoot)
	}
	if err := isBlock(real); err != nil {
		return "", schema.Invalid(req.Name, "path", p, err.Error(), "a block device")
	}
	return p, nil
}

func (v *Volumes) allowed(p string) bool {
	for _, g := range v.cfg.AllowedPaths {
		if ok, _ := filepath.Match(g, p); ok {
			return true
		}
	}
	return false
}

func (v *Volumes) allowedList() string {
	if len(v.cfg.AllowedPaths) == 0 {
		return "none: the raw plugin's manifest config allowedPaths lists no device globs"
	}
	return "paths matching " + strings.Join(v.cfg.AllowedPaths, ", ")
}

func isBlock(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0 {
		return fmt.Errorf("%s is not a block device", p)
	}
	return nil
}

// Prepare attaches the device as a raw disk; a persistent root also gets
// its image (once) and boots from behind its header.
func (v *Volumes) Prepare(ctx context.Context, req ports.VolumeRequest) (ports.VolumeAttachment, error) {
	var dev string
	switch req.Type {
	case "raw":
		p, err := v.rawDevice(req)
		if err != nil {
			return ports.VolumeAttachment{}, err
		}
		dev = p
	case ports.VolumeBlock:
		p, err := canonicalDevice(req.HostPath)
		if err != nil {
			return ports.VolumeAttachment{}, &ports.InvalidError{Field: "block volume " + req.Name, Value: req.HostPath,
				Reason: err.Error(), Allowed: "the block device kubelet maps for the volume"}
		}
		dev = p
	default:
		return ports.VolumeAttachment{}, &ports.InvalidError{Field: "volume type", Value: req.Type, Allowed: "raw or " + ports.VolumeBlock}
	}
	disk := ports.Disk{Name: "vol-" + req.Name, Device: ports.DeviceDisk, ReadOnly: req.ReadOnly,
		Source: ports.DiskSource{Type: ports.SourceBlock, Path: dev, Format: "raw"}}
	if req.Rootfs != nil {
		if req.Type != ports.VolumeBlock {
			return ports.VolumeAttachment{}, fmt.Errorf("a persistent root file system must be a block volume: %w", ports.ErrInvalidArgument)
		}
		if req.ReadOnly {
			return ports.VolumeAttachment{}, &ports.InvalidError{Field: "block volume " + req.Name, Reason: "a persistent root file system cannot be read-only"}
		}
		offset, size, err := prepareRootfs(ctx, dev, req.Name, *req.Rootfs, v.log.WithField("vm", req.VMID))
		if err != nil {
			return ports.VolumeAttachment{}, err
		}
		disk.Source.Offset, disk.Source.Size = offset, size
	}
	return ports.VolumeAttachment{Disks: []ports.Disk{disk}}, nil
}

// Release keeps the device and its data: there is nothing to undo.
func (v *Volumes) Release(ctx context.Context, req ports.VolumeRequest) error { return nil }

// canonicalDevice resolves the path kubelet gives for a block volume (a
// symlink or a bind-mounted device node under its pod directory) to the
// node's /dev entry of the same device, so that the domain names a stable
// device.
func canonicalDevice(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("no device path")
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	if err := isBlock(real); err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(real, &st); err != nil {
		return "", err
	}
	if strings.HasPrefix(real, "/dev/") {
		return real, nil
	}
	major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev)
	uevent, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", major, minor))
	if err == nil {
		for _, line := range strings.Split(string(uevent), "\n") {
			if name, ok := strings.CutPrefix(line, "DEVNAME="); ok {
				cand := "/dev/" + name
				var cst unix.Stat_t
				if unix.Stat(cand, &cst) == nil && cst.Rdev == st.Rdev && cst.Mode&syscall.S_IFMT == syscall.S_IFBLK {
					return cand, nil
				}
			}
		}
	}
	return real, nil // no /dev entry found: the node kubelet made will do
}

var _ ports.Volumes = (*Volumes)(nil)
