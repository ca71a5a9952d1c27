package libvirt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

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

// kvmUsableBy makes sure a VM user in group gid can open kvmDev (/dev/kvm)
// read-write, as QEMU must for a KVM domain: libvirt gives a QEMU with a
// static DAC label that label's user and group only, no supplementary
// groups, so a VM with a group of its own is not in the device's group
// (kvm). Then the device is opened to every user (mode 0666), as systemd
// itself sets it upstream: KVM is made to be used by unprivileged users,
// and each VM's own files stay its own.
func kvmUsableBy(log logrus.FieldLogger, kvmDev string, gid int) error {
	info, err := os.Stat(kvmDev)
	if err != nil {
		return fmt.Errorf("KVM device: %w", err)
	}
	mode := info.Mode().Perm()
	if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Gid) == gid && mode&0o060 == 0o060 {
		return nil
	}
	if mode&0o006 == 0o006 {
		return nil
	}
	if err := os.Chmod(kvmDev, mode|0o006); err != nil {
		return fmt.Errorf("let VM users open %s: %w", kvmDev, err)
	}
	log.WithFields(logrus.Fields{"device": kvmDev, "mode": fmt.Sprintf("%o", mode|0o006)}).Info("VM users may open the KVM device")
	return nil
}
