// Command virtlet-example-scratch is an example of a third-party Virtlet
// plugin, written the way an outside author would: it imports only the
// plugin SDK and the ports, and is added to a node with a manifest, without
// rebuilding the daemon.
//
// It provides volumes of type "scratch": an empty sparse raw disk per VM
// and volume, of the size given by the volume's `size` option (bytes, or
// the manifest's config.defaultSize), deleted with the VM.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/virtlet/virtlet/plugins/sdk"
	"github.com/virtlet/virtlet/ports"
)

// config is the manifest's `config`: its type and DefaultConfig's value are
// the schema the daemon checks a manifest against before Configure.
type config struct {
	DefaultSize int64 `json:"defaultSize" jsonschema:"minimum=1" jsonschema_description:"size in bytes of a scratch disk whose volume names none"`
}

type scratch struct {
	dir string
	cfg config
}

var safeName = regexp.MustCompile(`^[a-zA-Z0-9][-a-zA-Z0-9_.]*$`)

func (s *scratch) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "scratch", Kind: ports.KindVolume, Version: "1.0.0", Handles: []string{"scratch"}}
}

// DefaultConfig declares the config (ports.ConfigDefaulter).
func (s *scratch) DefaultConfig() any { return config{DefaultSize: 64 << 20} }

func (s *scratch) Configure(ctx context.Context, pc ports.PluginConfig) error {
	s.cfg = s.DefaultConfig().(config)
	if err := pc.Decode(&s.cfg); err != nil {
		return err
	}
	// QEMU runs as its own user and opens the disks: their directory must
	// be traversable (not listable); the disks themselves stay 0600 and
	// libvirt hands them to QEMU while the VM runs.
	if err := os.Chmod(pc.StateDir, 0o711); err != nil {
		return err
	}
	s.dir = pc.StateDir
	return nil
}

func (s *scratch) path(req ports.VolumeRequest) (string, error) {
	for field, v := range map[string]string{"vmID": req.VMID, "name": req.Name} {
		if !safeName.MatchString(v) {
			return "", &ports.InvalidError{Field: "volume " + field, Value: v, Allowed: "letters, digits, '-', '_' and '.'"}
		}
	}
	return filepath.Join(s.dir, req.VMID+"-"+req.Name+".img"), nil
}

// size checks the volume's options: only size, a number of bytes
// (kubelet's own kubernetes.io/ options pass).
func (s *scratch) size(req ports.VolumeRequest) (int64, error) {
	size := s.cfg.DefaultSize
	for k, v := range req.Options {
		switch {
		case k == "size":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return 0, &ports.InvalidError{Field: "scratch volume " + req.Name + " option size", Value: v, Allowed: "a positive number of bytes"}
			}
			size = n
		case strings.HasPrefix(k, "kubernetes.io/"):
		default:
			return 0, &ports.InvalidError{Field: "scratch volume " + req.Name + " option " + k, Reason: "unknown option", Allowed: "size"}
		}
	}
	return size, nil
}

// Validate checks the options when kubelet mounts the volume (through the
// flexvolume driver and the daemon); nothing is secret.
func (s *scratch) Validate(ctx context.Context, req ports.VolumeRequest) (map[string]string, error) {
	if _, err := s.size(req); err != nil {
		return nil, err
	}
	if !safeName.MatchString(req.Name) {
		return nil, &ports.InvalidError{Field: "volume name", Value: req.Name, Allowed: "letters, digits, '-', '_' and '.'"}
	}
	kept := map[string]string{}
	if v, ok := req.Options["size"]; ok {
		kept["size"] = v
	}
	return kept, nil
}

// Forget has nothing to drop.
func (s *scratch) Forget(ctx context.Context, req ports.VolumeRequest) error { return nil }

func (s *scratch) Prepare(ctx context.Context, req ports.VolumeRequest) (ports.VolumeAttachment, error) {
	p, err := s.path(req)
	if err != nil {
		return ports.VolumeAttachment{}, err
	}
	size, err := s.size(req)
	if err != nil {
		return ports.VolumeAttachment{}, err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return ports.VolumeAttachment{}, fmt.Errorf("create scratch disk: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return ports.VolumeAttachment{}, fmt.Errorf("size scratch disk: %w", err)
	}
	sdk.Log.WithFields(map[string]interface{}{"vm": req.VMID, "volume": req.Name, "size": size}).Info("scratch disk ready")
	// A blank disk: the guest's mount script makes an ext4 file system
	// on it.
	return ports.VolumeAttachment{Disks: []ports.Disk{{
		Name: "vol-" + req.Name, Device: ports.DeviceDisk,
		Source: ports.DiskSource{Type: ports.SourceFile, Path: p, Format: "raw"},
	}}, Format: "ext4"}, nil
}

func (s *scratch) Release(ctx context.Context, req ports.VolumeRequest) error {
	p, err := s.path(req)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove scratch disk: %w", err)
	}
	return nil
}

func main() { sdk.Serve(&scratch{}) }
