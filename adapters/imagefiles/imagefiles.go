// Package imagefiles stores VM image data on the local disk, content
// addressed: <dir>/sha256/<hex>. Downloads go to <dir>/tmp and are renamed
// into place only once their digest is known, so a reader never sees a
// partial image; partials left by a crash are removed at start.
package imagefiles

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/virtlet/virtlet/ports"
)

var digestRE = regexp.MustCompile(`^sha256:([0-9a-f]{64})$`)

// Store is a ports.ImageFiles in a directory.
type Store struct {
	dir string
}

// Open prepares dir and removes partial downloads left from a crash.
//
// The store is private: its directories let others pass through (QEMU,
// as a VM's user, opens its image by name; the disk tools' user checks a
// download) but not list them, and each image is root's alone, mode 0600.
// Whoever runs an image is granted it by an ACL entry (adapters/libvirt
// for a VM's user, diskimage.Tool for a tool's run), so a private image
// pulled with one tenant's credentials is not readable by local users and
// other VMs' users. Files of an older store (0644) are made private.
func Open(dir string) (*Store, error) {
	s := &Store{dir: dir}
	for _, d := range []string{s.dir, s.dataDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create image store %s: %w", d, err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("image store %s: %w", d, err)
		}
	}
	entries, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.tmpDir(), err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(s.tmpDir(), e.Name())); err != nil {
			return nil, fmt.Errorf("remove stale partial download: %w", err)
		}
	}
	images, err := os.ReadDir(s.dataDir())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.dataDir(), err)
	}
	for _, e := range images {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o004 != 0 {
			if err := os.Chmod(filepath.Join(s.dataDir(), e.Name()), info.Mode().Perm()&^0o077); err != nil {
				return nil, fmt.Errorf("make image %s private: %w", e.Name(), err)
			}
		}
	}
	return s, nil
}

func (s *Store) dataDir() string { return filepath.Join(s.dir, "sha256") }
func (s *Store) tmpDir() string  { return filepath.Join(s.dir, "tmp") }

func (s *Store) dataPath(digest string) (string, error) {
	m := digestRE.FindStringSubmatch(digest)
	if m == nil {
		return "", &ports.InvalidError{Field: "digest", Value: digest, Allowed: "sha256:<64 lowercase hex digits>"}
	}
	return filepath.Join(s.dataDir(), m[1]), nil
}

func (s *Store) NewTemp(ctx context.Context) (string, error) {
	f, err := os.CreateTemp(s.tmpDir(), "pull-*")
	if err != nil {
		return "", fmt.Errorf("create download file: %w", err)
	}
	f.Close()
	return f.Name(), nil
}

// ownTemp checks that path is a download file of this store, so that no
// input can make the store move or delete anything else.
func (s *Store) ownTemp(path string) error {
	if filepath.Dir(filepath.Clean(path)) != s.tmpDir() {
		return &ports.InvalidError{Field: "download path", Value: path, Allowed: "a path from NewTemp under " + s.tmpDir()}
	}
	return nil
}

func (s *Store) Commit(ctx context.Context, tmp, digest string) (string, error) {
	if err := s.ownTemp(tmp); err != nil {
		return "", err
	}
	dst, err := s.dataPath(digest)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(dst); err == nil {
		return dst, s.Discard(ctx, tmp)
	}
	if err := os.Chmod(tmp, 0o600); err != nil { // root's; readers are granted it
		return "", fmt.Errorf("commit %s: %w", digest, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("commit %s: %w", digest, err)
	}
	if d, err := os.Open(s.dataDir()); err == nil {
		d.Sync()
		d.Close()
	}
	return dst, nil
}

func (s *Store) Discard(ctx context.Context, tmp string) error {
	if err := s.ownTemp(tmp); err != nil {
		return err
	}
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("discard %s: %w", tmp, err)
	}
	return nil
}

func (s *Store) Path(ctx context.Context, digest string) (string, error) {
	p, err := s.dataPath(digest)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("image data %s: %w", digest, ports.ErrNotFound)
		}
		return "", err
	}
	return p, nil
}

func (s *Store) Remove(ctx context.Context, digest string) error {
	p, err := s.dataPath(digest)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove image data %s: %w", digest, err)
	}
	return nil
}

func (s *Store) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(s.dataDir())
	if err != nil {
		return nil, fmt.Errorf("list image data: %w", err)
	}
	var out []string
	for _, e := range entries {
		if d := "sha256:" + e.Name(); digestRE.MatchString(d) {
			out = append(out, d)
		}
	}
	return out, nil
}

// Usage counts the blocks really allocated (images are often sparse) and
// the inodes of the store.
func (s *Store) Usage(ctx context.Context) (ports.FilesystemUsage, error) {
	u := ports.FilesystemUsage{Timestamp: time.Now(), Mountpoint: s.dir}
	err := filepath.WalkDir(s.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		u.InodesUsed++
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			u.UsedBytes += uint64(st.Blocks) * 512
		} else {
			u.UsedBytes += uint64(info.Size())
		}
		return nil
	})
	if err != nil {
		return u, fmt.Errorf("image store usage: %w", err)
	}
	return u, nil
}

var _ ports.ImageFiles = (*Store)(nil)
