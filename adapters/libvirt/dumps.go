package libvirt

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"
)

// DefaultAutoDumpDir is libvirt's default auto_dump_path (qemu.conf): where
// libvirtd writes a guest's memory, as root, when the guest's watchdog
// fires with the action "dump" (which the daemon allows only when its
// operator enables it: allowWatchdogDump).
const DefaultAutoDumpDir = "/var/lib/libvirt/qemu/dump"

// dumpName is how libvirtd names a watchdog dump: the domain's short name
// (its id and the first 20 bytes of its name) and the time,
// "<id>-<name[:20]>-<YYYY-MM-DD-HH:MM:SS>". The domains of VMs with a
// watchdog are unique in their first 20 bytes: "virtlet-" and 12 hex
// digits of the container's ID (such a VM never runs in a pool domain,
// whose names share theirs: poolable).
var dumpName = regexp.MustCompile(`^\d+-(.+)-(\d{4}-\d{2}-\d{2}-\d{2}:\d{2}:\d{2})$`)

// shortNameMax is libvirt's VIR_DOMAIN_SHORT_NAME_MAX.
const shortNameMax = 20

// dumpsOf lists the dumps of domain in dir, oldest first.
func dumpsOf(dir, domain string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	type dump struct{ path, time string }
	var dumps []dump
	for _, e := range entries {
		if m := dumpName.FindStringSubmatch(e.Name()); m != nil && m[1] == domain[:min(len(domain), shortNameMax)] && e.Type().IsRegular() {
			dumps = append(dumps, dump{filepath.Join(dir, e.Name()), m[2]})
		}
	}
	// By time: the domain's id changes as it restarts.
	slices.SortFunc(dumps, func(a, b dump) int { return strings.Compare(a.time+a.path, b.time+b.path) })
	var out []string
	for _, d := range dumps {
		out = append(out, d.path)
	}
	return out, nil
}

// pruneDumps removes the dumps of domain in dir but its newest keep: a
// guest whose watchdog keeps firing holds keep dumps of the node's disk at
// most, and none once its VM is removed (keep 0).
func pruneDumps(dir, domain string, keep int) (removed []string, err error) {
	dumps, err := dumpsOf(dir, domain)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, p := range dumps[:max(0, len(dumps)-keep)] {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// dumps prunes the watchdog dumps libvirtd writes to dir (its
// auto_dump_path).
type dumps struct {
	dir string
	log logrus.FieldLogger
}

// prune keeps the newest keep dumps of the VM's domain, and logs what it
// removed.
func (d dumps) prune(vm, domain string, keep int) {
	dir := d.dir
	if dir == "" {
		dir = DefaultAutoDumpDir
	}
	removed, err := pruneDumps(dir, domain, keep)
	log := d.log.WithFields(logrus.Fields{"vm": vm, "removed": removed, "kept": keep})
	switch {
	case err != nil:
		log.WithError(err).Warn("remove the VM's memory dumps")
	case len(removed) > 0:
		log.Info("memory dumps of the VM removed")
	}
}
