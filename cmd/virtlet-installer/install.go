package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	log "github.com/sirupsen/logrus"
)

// installer holds where things are; every path but hostRoot and stage is
// the host's (not below hostRoot).
type installer struct {
	hostRoot, prefix, stage          string
	kubeletConfig, kubeletKubeconfig string
	systemctl                        []string
	// chroot: systemctl runs with hostRoot as its / (false in unit tests,
	// whose stand-in is not below their host root).
	chroot  bool
	version string
}

// record is what an install did, saved after every step, so that an
// uninstall (or the undo of a failed or interrupted install) reverts
// exactly that.
type record struct {
	Version string `json:"version"`
	// Complete: every step done; kubelet runs on the daemon.
	Complete bool `json:"complete"`
	// Dirs are the directories the install made, parents first.
	Dirs []string `json:"dirs"`
	// Files are the files and links it wrote, each with the copy of the
	// file it replaced ("" when there was none).
	Files []placed `json:"files"`
	// ServiceEnabled: virtlet.service enabled and started.
	ServiceEnabled bool `json:"serviceEnabled"`
	// DaemonDirs are the daemon's own state and run directories and its
	// socket, which did not exist before the install: removed once it has
	// stopped.
	DaemonDirs []string `json:"daemonDirs"`
	// KubeletConfigBackup is the copy of kubelet's configuration file
	// as it was, once the install has changed it.
	KubeletConfigBackup string `json:"kubeletConfigBackup,omitempty"`
}

type placed struct {
	Path   string `json:"path"`
	Backup string `json:"backup,omitempty"`
}

// Paths of the installed node (before prefix).
const (
	unitName         = "virtlet.service"
	daemonSocket     = "/run/virtlet.sock"
	adminSocket      = "/run/virtlet/admin.sock"
	daemonConfig     = "etc/virtlet/virtlet.yaml"
	defaultPluginDir = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec"
	flexDriver       = "virtlet~flexvolume_driver/flexvolume_driver"
)

// The stage's parts the installer does not copy as they are: kubelet's
// drop-in (the installer edits kubelet's configuration file instead: the
// flag it sets is deprecated) and the flexvolume driver (installed in
// the volumePluginDir kubelet's configuration names).
var notCopied = []string{"etc/systemd/system/kubelet.service.d", "usr/libexec/kubernetes"}

// h is a host path as this process sees it.
func (in *installer) h(p string) string { return filepath.Join(in.hostRoot, p) }

// stateDir is the installer's own directory on the host: the record and
// the copies of replaced files.
func (in *installer) stateDir() string { return in.prefix + "/var/lib/virtlet-installer" }

func (in *installer) load() (*record, error) {
	b, err := os.ReadFile(in.h(in.stateDir() + "/record.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the install record: %w", err)
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("install record %s: %w", in.stateDir()+"/record.json", err)
	}
	return &rec, nil
}

func (in *installer) save(rec *record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(in.h(in.stateDir()+"/record.json"), b, 0o600)
}

// install makes the node a Virtlet node; a failure undoes what it did.
func (in *installer) install(ctx context.Context) (err error) {
	rec, err := in.load()
	if err != nil {
		return err
	}
	if rec != nil && rec.Complete {
		log.WithField("version", rec.Version).Info("the node is installed already (an earlier run of this pod)")
		return nil
	}
	if rec != nil {
		log.Warn("an earlier install did not finish: undoing it first")
		if err := in.uninstall(ctx, rec); err != nil {
			return fmt.Errorf("undo the unfinished install: %w", err)
		}
	}
	kc, err := readKubeletConfig(in.h(in.kubeletConfig))
	if err != nil {
		return fmt.Errorf("KUBELET_CONFIG %s: %w", in.kubeletConfig, err)
	}
	endpoint := "unix://" + in.prefix + daemonSocket
	forward := kc.endpoint()
	if forward == endpoint {
		return fmt.Errorf("KUBELET_CONFIG %s: kubelet's containerRuntimeEndpoint is Virtlet's already (%s) and no install is recorded: not installing over another install", in.kubeletConfig, endpoint)
	}
	// A node installed otherwise (make install) has the unit and no
	// record: installing over it would replace its files and its kubelet
	// configuration's meaning.
	if _, err := os.Lstat(in.h(in.prefix + "/etc/systemd/system/" + unitName)); err == nil {
		return fmt.Errorf("%s is on this node and no install of this installer is recorded: Virtlet was installed otherwise (make install?); uninstall it, or take the node's %s label away", in.prefix+"/etc/systemd/system/"+unitName, "extraRuntime=virtlet")
	}
	rec = &record{Version: in.version}
	if err := in.mkdirs(rec, in.stateDir()); err != nil {
		return err
	}
	if err := in.save(rec); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if uerr := in.uninstall(context.WithoutCancel(ctx), rec); uerr != nil {
				err = fmt.Errorf("%w; undoing it: %v", err, uerr)
			}
		}
	}()
	if err := in.copyStage(rec, forward); err != nil {
		return err
	}
	if err := in.installFlexDriver(rec, kc.volumePluginDir()); err != nil {
		return err
	}
	for _, d := range []string{in.prefix + "/var/lib/virtlet", in.prefix + "/run/virtlet", in.prefix + daemonSocket} {
		if _, err := os.Lstat(in.h(d)); errors.Is(err, fs.ErrNotExist) {
			rec.DaemonDirs = append(rec.DaemonDirs, d)
		}
	}
	if err := in.systemd(ctx, "daemon-reload"); err != nil {
		return err
	}
	rec.ServiceEnabled = true // saved before: a failed enable is still undone
	if err := in.save(rec); err != nil {
		return err
	}
	if err := in.systemd(ctx, "enable", "--now", unitName); err != nil {
		return err
	}
	if err := waitSocket(ctx, in.h(in.prefix+daemonSocket), 3*time.Minute); err != nil {
		return fmt.Errorf("%s started, but the daemon does not answer: %w (journalctl -u %s on the node)", unitName, err, unitName)
	}
	// kubelet last: until here, nothing changed for its pods.
	backup, err := in.backupPath(rec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(in.h(backup), kc.raw, 0o600); err != nil {
		return fmt.Errorf("keep kubelet's configuration: %w", err)
	}
	rec.KubeletConfigBackup = backup
	if err := in.save(rec); err != nil {
		return err
	}
	edited, err := kc.withRuntime(endpoint)
	if err != nil {
		return fmt.Errorf("KUBELET_CONFIG %s: %w", in.kubeletConfig, err)
	}
	if err := writeAtomic(in.h(in.kubeletConfig), edited, kc.mode); err != nil {
		return fmt.Errorf("KUBELET_CONFIG %s: %w", in.kubeletConfig, err)
	}
	if err := in.systemd(ctx, "restart", "kubelet.service"); err != nil {
		return err
	}
	rec.Complete = true
	log.WithFields(log.Fields{"endpoint": endpoint, "forwardRuntime": forward}).Info("kubelet restarted on Virtlet")
	return in.save(rec)
}

// copyStage copies the staged tree onto the host. With a prefix, the
// daemon's config, its unit and the plugin manifests name the prefixed
// paths. The daemon's config gets this node's settings: forwardRuntime
// (kubelet's runtime until now) and, when kubelet has one, kubelet's
// kubeconfig.
func (in *installer) copyStage(rec *record, forward string) error {
	rewrite := strings.NewReplacer()
	if in.prefix != "" {
		var pairs []string
		for _, p := range []string{"/usr/local/bin/", "/usr/libexec/virtlet", "/etc/virtlet", "/var/lib/virtlet", "/run/virtlet"} {
			pairs = append(pairs, p, in.prefix+p)
		}
		rewrite = strings.NewReplacer(pairs...)
	}
	return filepath.WalkDir(in.stage, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(in.stage, p)
		rel = filepath.ToSlash(rel)
		for _, skip := range notCopied {
			if rel == skip || strings.HasPrefix(rel, skip+"/") {
				return filepath.SkipDir
			}
		}
		if e.IsDir() {
			return nil
		}
		dest := in.prefix + "/" + rel
		info, err := e.Info()
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return in.place(rec, dest, nil, 0, target)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if rel == daemonConfig || rel == "etc/systemd/system/"+unitName || strings.HasPrefix(rel, "etc/virtlet/plugins.d/") {
			data = []byte(rewrite.Replace(string(data)))
		}
		if rel == daemonConfig {
			data = in.daemonSettings(data, forward)
		}
		return in.place(rec, dest, data, info.Mode().Perm(), "")
	})
}

// daemonSettings sets the node's own keys in the daemon's config.
func (in *installer) daemonSettings(config []byte, forward string) []byte {
	settings := map[string]string{"forwardRuntime": forward}
	if _, err := os.Stat(in.h(in.kubeletKubeconfig)); err == nil {
		settings["kubeconfig"] = in.kubeletKubeconfig
	} else {
		log.WithField("KUBELET_KUBECONFIG", in.kubeletKubeconfig).Warn("no kubelet kubeconfig there: the daemon runs without the API server (no VirtletImageMapping, VirtletConfigMapping, ConfigMaps or Secrets)")
	}
	if in.prefix != "" {
		settings["adminSocket"] = in.prefix + adminSocket
	}
	var out []string
	for _, line := range strings.Split(strings.TrimRight(string(config), "\n"), "\n") {
		if key, _, ok := strings.Cut(line, ":"); ok && settings[key] != "" {
			continue
		}
		out = append(out, line)
	}
	out = append(out, "# Set by virtlet-installer for this node:")
	for _, k := range []string{"forwardRuntime", "kubeconfig", "adminSocket"} {
		if v := settings[k]; v != "" {
			out = append(out, fmt.Sprintf("%s: %s", k, v))
		}
	}
	return []byte(strings.Join(out, "\n") + "\n")
}

// installFlexDriver puts the flexvolume driver where kubelet looks for
// it; with a prefix, a wrapper tells it the daemon's admin socket.
func (in *installer) installFlexDriver(rec *record, pluginDir string) error {
	bin := filepath.Join(in.stage, "usr/libexec/kubernetes/kubelet-plugins/volume/exec", flexDriver)
	dest := path.Join(pluginDir, flexDriver)
	if in.prefix == "" {
		data, err := os.ReadFile(bin)
		if err != nil {
			return fmt.Errorf("the image's flexvolume driver: %w", err)
		}
		return in.place(rec, dest, data, 0o755, "")
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("the image's flexvolume driver: %w", err)
	}
	real := in.prefix + "/usr/libexec/virtlet/virtlet-flexvolume-driver"
	if err := in.place(rec, real, data, 0o755, ""); err != nil {
		return err
	}
	wrapper := fmt.Sprintf("#!/bin/sh\nVIRTLET_ADMIN_SOCKET=%s exec %s \"$@\"\n", in.prefix+adminSocket, real)
	return in.place(rec, dest, []byte(wrapper), 0o755, "")
}

// place writes a file (or a symbolic link to link) at the host path
// dest, keeping a copy of what was there, and records it.
func (in *installer) place(rec *record, dest string, data []byte, mode fs.FileMode, link string) error {
	if err := in.mkdirs(rec, path.Dir(dest)); err != nil {
		return err
	}
	p := placed{Path: dest}
	if _, err := os.Lstat(in.h(dest)); err == nil {
		backup, err := in.backupPath(rec)
		if err != nil {
			return err
		}
		if err := os.Rename(in.h(dest), in.h(backup)); err != nil {
			return fmt.Errorf("keep %s: %w", dest, err)
		}
		p.Backup = backup
	}
	rec.Files = append(rec.Files, p)
	if err := in.save(rec); err != nil {
		return err
	}
	var err error
	if link != "" {
		err = os.Symlink(link, in.h(dest))
	} else {
		err = writeAtomic(in.h(dest), data, mode)
	}
	if err != nil {
		return fmt.Errorf("install %s: %w", dest, err)
	}
	return nil
}

// backupPath names a new copy of a replaced file in the state directory.
func (in *installer) backupPath(rec *record) (string, error) {
	dir := in.stateDir() + "/backup"
	if err := in.mkdirs(rec, dir); err != nil {
		return "", err
	}
	for n := 0; ; n++ {
		p := fmt.Sprintf("%s/%d", dir, n)
		if _, err := os.Lstat(in.h(p)); errors.Is(err, fs.ErrNotExist) {
			return p, nil
		}
	}
}

// mkdirs makes the host directory dir and its missing parents, recording
// each it made.
func (in *installer) mkdirs(rec *record, dir string) error {
	var missing []string
	for d := dir; d != "/" && d != "."; d = path.Dir(d) {
		if _, err := os.Lstat(in.h(d)); err == nil {
			break
		}
		missing = append([]string{d}, missing...)
	}
	for _, d := range missing {
		if err := os.Mkdir(in.h(d), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("make %s: %w", d, err)
		}
		rec.Dirs = append(rec.Dirs, d)
	}
	return nil
}

// uninstall reverts what rec says was done, in the reverse order: kubelet
// back on its runtime first (so that it finishes deleting this pod there),
// then the daemon stopped, then the files. It goes on past failures and
// reports them all.
func (in *installer) uninstall(ctx context.Context, rec *record) error {
	var errs []error
	if rec.KubeletConfigBackup != "" {
		b, err := os.ReadFile(in.h(rec.KubeletConfigBackup))
		mode := fs.FileMode(0o644)
		if info, serr := os.Stat(in.h(in.kubeletConfig)); serr == nil {
			mode = info.Mode().Perm()
		}
		if err == nil {
			err = writeAtomic(in.h(in.kubeletConfig), b, mode)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("restore kubelet's configuration %s: %w", in.kubeletConfig, err))
		} else if err := in.systemd(ctx, "restart", "kubelet.service"); err != nil {
			errs = append(errs, err)
		} else {
			log.Info("kubelet restarted on its own runtime")
		}
	}
	if rec.ServiceEnabled {
		if err := in.systemd(ctx, "disable", "--now", unitName); err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(rec.Files) - 1; i >= 0; i-- {
		f := rec.Files[i]
		if err := os.Remove(in.h(f.Path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", f.Path, err))
			continue
		}
		if f.Backup != "" {
			if err := os.Rename(in.h(f.Backup), in.h(f.Path)); err != nil {
				errs = append(errs, fmt.Errorf("put back %s: %w", f.Path, err))
			}
		}
	}
	if rec.ServiceEnabled {
		if err := in.systemd(ctx, "daemon-reload"); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range rec.DaemonDirs {
		if m := in.mountsBelow(d); len(m) > 0 {
			errs = append(errs, fmt.Errorf("%s is left: mounts below it (%s); delete the node's VM pods, then run virtlet-installer uninstall", d, strings.Join(m, ", ")))
			continue
		}
		if err := os.RemoveAll(in.h(d)); err != nil {
			errs = append(errs, fmt.Errorf("remove the daemon's %s: %w", d, err))
		}
	}
	os.Remove(in.h(in.stateDir() + "/record.json"))
	if rec.KubeletConfigBackup != "" {
		os.Remove(in.h(rec.KubeletConfigBackup))
	}
	for i := len(rec.Dirs) - 1; i >= 0; i-- {
		d := rec.Dirs[i]
		if err := os.Remove(in.h(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", d, err))
		}
	}
	if len(errs) > 0 {
		// What could not be undone stays recorded for `uninstall`.
		if err := in.mkdirs(&record{}, in.stateDir()); err == nil {
			in.save(rec)
		}
	}
	return errors.Join(errs...)
}

// systemd runs the host's systemctl with the host's root as /.
func (in *installer) systemd(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	argv := append(append([]string(nil), in.systemctl[1:]...), args...)
	cmd := exec.CommandContext(ctx, in.systemctl[0], argv...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if in.chroot && in.hostRoot != "/" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: in.hostRoot}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	log.WithField("command", "systemctl "+strings.Join(args, " ")).Info("done")
	return nil
}

// waitSocket waits until a unix socket accepts a connection.
func waitSocket(ctx context.Context, socket string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.Dial("unix", socket)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// mountsBelow lists the host's mount points at or below the host path
// dir, as the host's PID 1 sees them (the host's /proc is below its root).
func (in *installer) mountsBelow(dir string) []string {
	b, err := os.ReadFile(in.h("/proc/1/mountinfo"))
	if err != nil {
		return []string{"(the host's mounts are unreadable: " + err.Error() + ")"}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// writeAtomic writes a file by renaming a complete copy over it.
func writeAtomic(p string, data []byte, mode fs.FileMode) error {
	tmp := p + ".virtlet-installer.tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
