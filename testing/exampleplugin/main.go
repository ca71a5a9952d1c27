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

	"github.com/virtlet/virtlet/plugins/sdk"
	"github.com/virtlet/virtlet/ports"
)

type config struct {
	DefaultSize int64 `json:"defaultSize"`
}

type scratch struct {
	dir string
	cfg config
}

var safeName = regexp.MustCompile(`^[a-zA-Z0-9][-a-zA-Z0-9_.]*$`)

func (s *scratch) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "scratch", Kind: ports.KindVolume, Version: "1.0.0", Handles: []string{"scratch"}}
}

func (s *scratch) Configure(ctx context.Context, pc ports.PluginConfig) error {
	s.cfg = config{DefaultSize: 64 << 20}
	if err := pc.Decode(&s.cfg); err != nil {
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

func (s *scratch) Prepare(ctx context.Context, req ports.VolumeRequest) (ports.VolumeAttachment, error) {
	p, err := s.path(req)
	if err != nil {
		return ports.VolumeAttachment{}, err
	}
	size := s.cfg.DefaultSize
	if v, ok := req.Options["size"]; ok {
		if size, err = strconv.ParseInt(v, 10, 64); err != nil || size <= 0 {
			return ports.VolumeAttachment{}, &ports.InvalidError{Field: "volume " + req.Name + " option size", Value: v, Allowed: "a positive number of bytes"}
		}
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
	return ports.VolumeAttachment{Disks: []ports.Disk{{
		Name: "vol-" + req.Name, Device: ports.DeviceDisk, Bus: ports.BusVirtio,
		Source: ports.DiskSource{Type: ports.SourceFile, Path: p, Format: "raw"},
	}}}, nil
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
