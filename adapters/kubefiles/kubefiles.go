// Package kubefiles reads the files kubelet projects for ConfigMap,
// Secret, projected and downward API volumes from the node's disk.
//
// kubelet's atomic writer keeps the real files in a timestamped directory
// and publishes them through a "..data" symlink: every visible entry is a
// symlink into it. Reading follows the symlinks and skips the entries whose
// names start with "..".
package kubefiles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moby/sys/mountinfo"

	"github.com/virtlet/virtlet/ports"
)

// MaxTotalSize bounds what one volume may carry into cloud-init: the data
// ends up in an ISO image and in the guest's cloud-init cache.
const MaxTotalSize = 64 << 20

// Reader is a ports.ProjectedFiles on the local file system.
type Reader struct{}

// Read returns the volume's files in path order.
func (Reader) Read(ctx context.Context, hostPath string) ([]ports.ProjectedFile, error) {
	if _, err := os.Stat(hostPath); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("volume directory %s: %w", hostPath, ports.ErrNotFound)
		}
		return nil, fmt.Errorf("volume directory %s: %w", hostPath, err)
	}
	var (
		out   []ports.ProjectedFile
		total int64
	)
	var walk func(dir, rel string, depth int) error
	walk = func(dir, rel string, depth int) error {
		if depth > 16 {
			return fmt.Errorf("volume directory %s: nested too deep at %s", hostPath, rel)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("read volume directory %s: %w", dir, err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "..") {
				continue
			}
			p, r := filepath.Join(dir, e.Name()), path.Join(rel, e.Name())
			st, err := os.Stat(p) // follows kubelet's symlinks
			if err != nil {
				return fmt.Errorf("volume file %s: %w", p, err)
			}
			switch {
			case st.IsDir():
				if err := walk(p, r, depth+1); err != nil {
					return err
				}
			case st.Mode().IsRegular():
				if total += st.Size(); total > MaxTotalSize {
					return fmt.Errorf("volume directory %s holds more than %d MiB; too much for cloud-init", hostPath, MaxTotalSize>>20)
				}
				data, err := os.ReadFile(p)
				if err != nil {
					return fmt.Errorf("read volume file %s: %w", p, err)
				}
				out = append(out, ports.ProjectedFile{Path: r, Data: data, Mode: st.Mode().Perm()})
			}
		}
		return nil
	}
	if err := walk(hostPath, "", 0); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// FlexvolumeOptions reads the options the Virtlet flexvolume driver kept
// in a volume's directory.
func (Reader) FlexvolumeOptions(ctx context.Context, dir string) (map[string]string, error) {
	p := filepath.Join(dir, ports.FlexvolumeOptionsFile)
	raw, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		if ok, _ := mountinfo.Mounted(dir); ok {
			return nil, fmt.Errorf("%s is missing on the volume's tmpfs: the flexvolume driver's mount was interrupted; delete the pod so that kubelet sets the volume up again: %w",
				p, ports.ErrNotFound)
		}
		return nil, fmt.Errorf("%s is missing (was the volume set up by the virtlet flexvolume driver?): %w", p, ports.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read flexvolume options: %w", err)
	}
	opts := map[string]string{}
	if err := json.Unmarshal(raw, &opts); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object of strings: %v: %w", p, err, ports.ErrInvalidArgument)
	}
	return opts, nil
}

var (
	_ ports.ProjectedFiles = Reader{}
	_ ports.VolumeDirs     = Reader{}
)
