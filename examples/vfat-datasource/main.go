// Command virtlet-example-vfat is an example of a third-party Virtlet
// datasource plugin, written the way an outside author would: it imports
// only the plugin SDK and the ports, and is added to a node with a
// manifest, without rebuilding the daemon.
//
// It serves VirtletCloudInitImageType "nocloud-vfat": cloud-init's NoCloud
// seed (meta-data, user-data, network-config) on a FAT file system
// labelled CIDATA instead of an ISO, made with Debian's dosfstools and
// mtools. The daemon hands every datasource the same neutral data; the
// medium is the plugin's own.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/virtlet/virtlet/plugins/sdk"
	"github.com/virtlet/virtlet/ports"
)

// Type is the VirtletCloudInitImageType this plugin handles.
const Type = "nocloud-vfat"

type vfat struct{ dir string }

func (v *vfat) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "vfat", Kind: ports.KindDatasource, Version: "1.0.0", Handles: []string{Type}}
}

// DefaultConfig declares that the plugin takes no config
// (ports.ConfigDefaulter): a manifest with a config key is refused naming it.
func (v *vfat) DefaultConfig() any { return struct{}{} }

// Configure takes the state directory; QEMU must traverse to the images
// (the images themselves stay 0600: libvirt hands them to QEMU).
func (v *vfat) Configure(ctx context.Context, pc ports.PluginConfig) error {
	if err := pc.Decode(&struct{}{}); err != nil {
		return err
	}
	v.dir = filepath.Join(pc.StateDir, "media")
	for _, d := range []string{pc.StateDir, v.dir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	return nil
}

var vmID = regexp.MustCompile(`^[0-9a-f]{8,64}$`)

func (v *vfat) path(id string) (string, error) {
	if !vmID.MatchString(id) {
		return "", &ports.InvalidError{Field: "VM ID", Value: id, Allowed: "8 to 64 lowercase hex digits"}
	}
	return filepath.Join(v.dir, id+".img"), nil
}

// BuildMedia writes the seed files on a fresh 4 MiB FAT image.
func (v *vfat) BuildMedia(ctx context.Context, req ports.MediaRequest) (ports.Disk, error) {
	if req.Datasource != Type {
		return ports.Disk{}, &ports.InvalidError{Field: "datasource", Value: req.Datasource, Allowed: Type}
	}
	img, err := v.path(req.VMID)
	if err != nil {
		return ports.Disk{}, err
	}
	work, err := os.MkdirTemp(v.dir, ".build-")
	if err != nil {
		return ports.Disk{}, err
	}
	defer os.RemoveAll(work)
	userData := req.UserData
	if len(userData) == 0 {
		userData = []byte("#cloud-config\n")
	}
	files := map[string][]byte{"meta-data": req.MetaData, "user-data": userData}
	if len(req.NetworkConfig) > 0 {
		files["network-config"] = req.NetworkConfig
	}
	tmp := filepath.Join(work, "seed.img")
	if err := run(ctx, "mkfs.vfat", "-C", "-n", "CIDATA", tmp, "4096"); err != nil {
		return ports.Disk{}, err
	}
	for name, data := range files {
		src := filepath.Join(work, name)
		if err := os.WriteFile(src, data, 0o600); err != nil {
			return ports.Disk{}, err
		}
		if err := run(ctx, "mcopy", "-i", tmp, src, "::/"+name); err != nil {
			return ports.Disk{}, err
		}
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return ports.Disk{}, err
	}
	if err := os.Rename(tmp, img); err != nil {
		return ports.Disk{}, err
	}
	sdk.Log.WithField("vm", req.VMID).Info("vfat seed written")
	// A disk, not a CD-ROM: FAT images are hard disks to the guest.
	return ports.Disk{Name: "cloud-init", Device: ports.DeviceDisk, ReadOnly: true,
		Source: ports.DiskSource{Type: ports.SourceFile, Path: img, Format: "raw"}}, nil
}

func (v *vfat) RemoveMedia(ctx context.Context, id string) error {
	img, err := v.path(id)
	if err != nil {
		return err
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) error {
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func main() { sdk.Serve(&vfat{}) }
