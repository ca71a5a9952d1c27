// Package flexvolume is Virtlet's flexvolume driver: kubelet's exec
// protocol for volumes of driver virtlet/flexvolume_driver, an inbound
// adapter kubelet runs as `<plugin dir>/virtlet~flexvolume_driver/flexvolume_driver`.
//
//	init                 → {"status":"Success","capabilities":{"attach":false}}
//	mount <dir> <json>   → the options are checked by the volume plugin of
//	                       their `type` (asked through the daemon's admin
//	                       API, so a new type needs no new driver) and kept,
//	                       without secrets, in <dir>/virtlet-flexvolume.json
//	unmount <dir>        → the plugin forgets the volume; the file goes
//	anything else        → {"status":"Not supported"}
//
// Errors are {"status":"Failure","message":...}, naming the option at
// fault. Like Virtlet's driver, mount puts a small tmpfs on the volume's
// directory (kubelet recognises a mounted volume by its mount point) and
// writes the options both under and on it, so that a daemon whose view of
// kubelet's directory does not receive the node's later mounts reads them
// too.
package flexvolume

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/ports"
)

// Result is what the driver prints for kubelet.
type Result struct {
	Status       string        `json:"status"`
	Message      string        `json:"message,omitempty"`
	Capabilities *Capabilities `json:"capabilities,omitempty"`
}

// Capabilities are the driver's answer to init.
type Capabilities struct {
	Attach bool `json:"attach"`
}

// Statuses of kubelet's protocol.
const (
	Success      = "Success"
	Failure      = "Failure"
	NotSupported = "Not supported"
)

// kubelet's keys in a flexvolume's options.
const (
	keyPrefix    = "kubernetes.io/"
	keySecret    = keyPrefix + "secret/"
	keyPodUID    = keyPrefix + "pod.uid"
	keyPodName   = keyPrefix + "pod.name"
	keyNamespace = keyPrefix + "pod.namespace"
	keyVolume    = keyPrefix + "pvOrVolumeName"
)

// Daemon is what the driver asks of the Virtlet daemon.
type Daemon interface {
	ValidateVolume(ctx context.Context, fv ports.FlexvolumeOptions) (map[string]string, error)
	ForgetVolume(ctx context.Context, fv ports.FlexvolumeOptions) error
}

// Mounter puts the tmpfs on a volume's directory and takes it off.
type Mounter interface {
	Mount(dir string) error
	Unmount(dir string) error
	IsMounted(dir string) bool
}

// Driver answers kubelet's calls.
type Driver struct {
	Daemon  Daemon
	Mounter Mounter
	Timeout time.Duration // for each call to the daemon (default 2 minutes)
}

// Run performs one call of kubelet's protocol (args without the program
// name).
func (d *Driver) Run(args []string) Result {
	if len(args) == 0 {
		return failure(errors.New("no command given (kubelet calls init, mount or unmount)"))
	}
	op, rest := args[0], args[1:]
	want := map[string]int{"init": 0, "mount": 2, "unmount": 1}
	n, ok := want[op]
	if !ok {
		return Result{Status: NotSupported}
	}
	if len(rest) != n {
		return failure(fmt.Errorf("%s takes %d arguments, got %d", op, n, len(rest)))
	}
	switch op {
	case "init":
		return Result{Status: Success, Capabilities: &Capabilities{Attach: false}}
	case "mount":
		return result(d.mount(rest[0], rest[1]))
	default:
		return result(d.unmount(rest[0]))
	}
}

func result(err error) Result {
	if err != nil {
		return failure(err)
	}
	return Result{Status: Success}
}

func failure(err error) Result { return Result{Status: Failure, Message: err.Error()} }

func (d *Driver) ctx() (context.Context, context.CancelFunc) {
	t := d.Timeout
	if t == 0 {
		t = 2 * time.Minute
	}
	return context.WithTimeout(context.Background(), t)
}

// mount checks the options with the daemon and keeps what it returns.
func (d *Driver) mount(dir, rawOpts string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("mount: the volume directory %q is not an absolute path", dir)
	}
	var opts map[string]string
	if err := json.Unmarshal([]byte(rawOpts), &opts); err != nil {
		return fmt.Errorf("mount: the options are not a JSON object of strings: %v", err)
	}
	fv, err := request(dir, opts)
	if err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	ctx, cancel := d.ctx()
	defer cancel()
	kept, err := d.Daemon.ValidateVolume(ctx, fv)
	if err != nil {
		return fmt.Errorf("mount: volume %s: %w", fv.Volume, err)
	}
	// Keep who the volume belongs to, for unmount.
	for _, k := range []string{keyPodUID, keyNamespace, keyPodName, keyVolume} {
		if v, ok := opts[k]; ok {
			kept[k] = v
		}
	}
	data, err := json.MarshalIndent(kept, "", "  ")
	if err != nil {
		return err
	}
	undo := func() {
		d.Mounter.Unmount(dir)
		os.Remove(filepath.Join(dir, ports.FlexvolumeOptionsFile))
		d.Daemon.ForgetVolume(ctx, fv)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		undo()
		return fmt.Errorf("mount: %w", err)
	}
	if err := writeOptions(dir, data); err != nil {
		undo()
		return fmt.Errorf("mount: %w", err)
	}
	if !d.Mounter.IsMounted(dir) {
		if err := d.Mounter.Mount(dir); err != nil {
			undo()
			return fmt.Errorf("mount: tmpfs on %s: %w", dir, err)
		}
	}
	if err := writeOptions(dir, data); err != nil {
		undo()
		return fmt.Errorf("mount: %w", err)
	}
	return nil
}

// request turns kubelet's options into the daemon's request: secrets from
// the flexVolume's secretRef (kubernetes.io/secret/<key>, base64) become
// options of their key unless the volume sets them itself.
func request(dir string, opts map[string]string) (ports.FlexvolumeOptions, error) {
	fv := ports.FlexvolumeOptions{PodUID: opts[keyPodUID], PodNamespace: opts[keyNamespace], PodName: opts[keyPodName],
		Volume: opts[keyVolume], Options: map[string]string{}}
	if fv.Volume == "" {
		fv.Volume = filepath.Base(dir)
	}
	for k, v := range opts {
		name, isSecret := strings.CutPrefix(k, keySecret)
		switch {
		case isSecret:
			if _, set := opts[name]; set {
				continue
			}
			dec, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				return fv, fmt.Errorf("option %s (from the secretRef) is not base64 as kubelet sends it", k)
			}
			fv.Options[name] = string(dec)
		default:
			fv.Options[k] = v
		}
	}
	return fv, nil
}

func writeOptions(dir string, data []byte) error {
	return atomicfile.Write(filepath.Join(dir, ports.FlexvolumeOptionsFile), data, 0o600)
}

// unmount tells the daemon and removes what mount made. A directory mount
// never set up is fine.
func (d *Driver) unmount(dir string) error {
	p := filepath.Join(dir, ports.FlexvolumeOptionsFile)
	raw, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) && d.Mounter.IsMounted(dir) {
		// A mount interrupted between the tmpfs and its file: the options
		// are under the tmpfs, written first.
		if err := d.Mounter.Unmount(dir); err != nil {
			return fmt.Errorf("unmount: %w", err)
		}
		raw, err = os.ReadFile(p)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("unmount: %w", err)
	default:
		var kept map[string]string
		if err := json.Unmarshal(raw, &kept); err != nil {
			return fmt.Errorf("unmount: %s: %v", p, err)
		}
		fv := ports.FlexvolumeOptions{PodUID: kept[keyPodUID], PodNamespace: kept[keyNamespace], PodName: kept[keyPodName],
			Volume: kept[keyVolume], Options: kept}
		if fv.Volume == "" {
			fv.Volume = filepath.Base(dir)
		}
		ctx, cancel := d.ctx()
		defer cancel()
		if err := d.Daemon.ForgetVolume(ctx, fv); err != nil {
			return fmt.Errorf("unmount: volume %s: %w", fv.Volume, err)
		}
	}
	if d.Mounter.IsMounted(dir) {
		if err := d.Mounter.Unmount(dir); err != nil {
			return fmt.Errorf("unmount: %w", err)
		}
	}
	for _, f := range []string{p, p + atomicfile.TempSuffix} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("unmount: %w", err)
		}
	}
	return nil
}

// Tmpfs is the node's Mounter: a 1 MiB tmpfs, mode 0700.
type Tmpfs struct{}

func (Tmpfs) Mount(dir string) error {
	return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700")
}

func (Tmpfs) Unmount(dir string) error { return unix.Unmount(dir, 0) }

func (Tmpfs) IsMounted(dir string) bool {
	ok, err := mountinfo.Mounted(dir)
	return err == nil && ok
}
