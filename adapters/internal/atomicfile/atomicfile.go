// Package atomicfile writes the adapters' records and state files so that
// a crash or a power loss leaves either the old content or the new one,
// never a torn or empty file, and sets aside a file that cannot be read
// back so that one bad file does not stop a plugin from starting.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// TempSuffix names the file a write goes through ("<path>.tmp"); an
// interrupted write leaves it behind, and cleanup code may remove it.
const TempSuffix = ".tmp"

// Write replaces path with data, mode perm: temporary file, fsync, rename,
// fsync of the directory (without the last step a power loss can undo the
// rename, or keep it and lose the data).
func Write(path string, data []byte, perm os.FileMode) error {
	return WriteFunc(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFunc is Write for content that fill streams into w. Callers
// serialise writes of one path.
func WriteFunc(path string, perm os.FileMode, fill func(w io.Writer) error) error {
	tmp := path + TempSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	// An older temporary file keeps its mode: make it the one asked for.
	if err := f.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := fill(f); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// RemoveTemps removes the temporary files that writes into dir left when
// their process died (SIGKILL between the write and the rename): a plugin
// calls it for its directories when it starts, before it writes anew. It
// returns the names removed.
func RemoveTemps(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var removed []string
	for _, e := range entries {
		if e.IsDir() || filepath.Ext(e.Name()) != TempSuffix {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
			return removed, fmt.Errorf("remove interrupted write %s: %w", e.Name(), err)
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}

// SyncDir makes the entries of dir (a rename, a new or removed file)
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// QuarantineMarker is in the name of every file Quarantine set aside.
const QuarantineMarker = ".corrupt-"

// Quarantine renames a file that cannot be read back to
// "<path>.corrupt-<UTC time>", out of the way of loaders (which look for
// their own suffix) and kept for an operator to inspect. It returns the
// new path.
func Quarantine(path string, now time.Time) (string, error) {
	aside := path + QuarantineMarker + now.UTC().Format("20060102T150405.000000000Z")
	if err := os.Rename(path, aside); err != nil {
		return "", fmt.Errorf("set aside %s: %w", path, err)
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return aside, err
	}
	return aside, nil
}
