package libvirt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"
)

// searchableForVMUsers lets every user search (pass through, not list)
// libvirtd's QEMU state directory and its guest agent channel directories.
//
// libvirtd makes them 0750 for its own QEMU user's group, and puts in them
// a private directory per running domain (its master key) and a directory
// per domain for the guest agent's socket, each owned by the domain's DAC
// label. A QEMU that runs as a VM user of its own (a static DAC label, not
// libvirtd's shared user) is in neither the owner nor the group of the
// parents, so it could not open its own files: "Unable to read
// .../domain-N-name/master-key.aes: Permission denied". The search bit for
// others gives it the path and nothing more: the parents' listings stay
// private and each domain's directory stays its own.
func searchableForVMUsers(log logrus.FieldLogger, stateDir string) error {
	for _, dir := range []string{stateDir, filepath.Join(stateDir, "channel"), filepath.Join(stateDir, "channel", "target")} {
		info, err := os.Stat(dir)
		if errors.Is(err, fs.ErrNotExist) && dir != stateDir {
			continue // libvirtd makes them when it starts; an old one may have none
		}
		if err != nil {
			return fmt.Errorf("libvirtd's QEMU state directory: %w", err)
		}
		mode := info.Mode().Perm()
		if mode&0o001 != 0 {
			continue
		}
		if err := os.Chmod(dir, mode|0o001); err != nil {
			return fmt.Errorf("let VM users search %s: %w", dir, err)
		}
		log.WithFields(logrus.Fields{"dir": dir, "mode": fmt.Sprintf("%o", mode|0o001)}).Info("VM users may pass through libvirtd's directory")
	}
	return nil
}
