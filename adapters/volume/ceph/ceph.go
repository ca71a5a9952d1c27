// Package ceph is the volume plugin of Virtlet's ceph flexvolumes: Ceph
// RBD images, reached with go-ceph (librados, librbd) to check that the
// image exists and is large enough (or to create it), and attached to the
// VM as a libvirt network disk whose cephx key the hypervisor keeps in a
// libvirt secret. A volume with option rootfs: "true" holds the VM's
// persistent root file system (rootfs.go): the pod's image behind the
// header the raw plugin writes on block devices.
//
// The key is secret. kubelet hands it to the flexvolume driver when it
// mounts the volume (the `secret` option, or a Secret through the
// flexVolume's secretRef); Validate keeps it (0600 files in a 0700
// directory, on tmpfs by default: Config.KeysDir), by pod UID and volume
// name, and leaves it out of the options the driver writes into kubelet's
// volume directory; Forget deletes it when kubelet unmounts the volume. It
// is never logged.
package ceph

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/adapters/internal/keyedmutex"
	"github.com/virtlet/virtlet/adapters/volume/flexopts"
	"github.com/virtlet/virtlet/ports"
)

var schema = flexopts.Schema{Type: "ceph",
	Required: []string{"monitor", "pool", "volume", "user"},
	Optional: []string{"secret", "capacity", "create", "protocol", ports.RootfsOption}}

// Config is the plugin's manifest config.
type Config struct {
	Timeout string `json:"timeout,omitempty" jsonschema_description:"bound of each talk with the Ceph cluster: a duration such as 30s"`
	// /run/virtlet/ceph-keys is a tmpfs on systemd nodes, so that keys never
	// reach a disk; it outlives the plugin and the daemon, and a reboot
	// makes kubelet mount the volumes, and hand their keys, again.
	KeysDir string `json:"keysDir,omitempty" jsonschema_description:"directory of the keys of mounted volumes (best a tmpfs)"`
}

// DefaultKeysDir is where the plugin keeps keys by default.
const DefaultKeysDir = "/run/virtlet/ceph-keys"

// Volumes is the adapter.
type Volumes struct {
	log     logrus.FieldLogger
	keys    string // the keys' directory
	timeout time.Duration
	// work holds the raw copies of images on their way into a persistent
	// root (<state>/rootfs); "" until configured with a state directory.
	work string
	// writing serialises the persistent roots of one RBD image in this
	// process.
	writing keyedmutex.Map
}

// New returns an unconfigured adapter.
func New(log logrus.FieldLogger) *Volumes { return &Volumes{log: log, timeout: 30 * time.Second} }

func (v *Volumes) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "ceph", Kind: ports.KindVolume, Handles: []string{"ceph"}, RootfsTypes: []string{"ceph"}}
}

// DefaultConfig declares the plugin's config (ports.ConfigDefaulter).
func (v *Volumes) DefaultConfig() any {
	return Config{Timeout: "30s", KeysDir: DefaultKeysDir}
}

// Configure makes the private keys directory.
func (v *Volumes) Configure(ctx context.Context, pc ports.PluginConfig) error {
	cfg := v.DefaultConfig().(Config)
	if err := pc.Decode(&cfg); err != nil {
		return err
	}
	if cfg.Timeout != "" {
		d, err := time.ParseDuration(cfg.Timeout)
		if err != nil || d <= 0 {
			return &ports.InvalidError{Field: "ceph config timeout", Value: cfg.Timeout, Allowed: "a positive duration such as 30s"}
		}
		v.timeout = d
	}
	if cfg.KeysDir == "" {
		cfg.KeysDir = DefaultKeysDir
	}
	if !filepath.IsAbs(cfg.KeysDir) {
		return &ports.InvalidError{Field: "ceph config keysDir", Value: cfg.KeysDir, Allowed: "an absolute path"}
	}
	v.keys = cfg.KeysDir
	if err := os.MkdirAll(v.keys, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(v.keys, 0o700); err != nil {
		return err
	}
	// A key whose writing was interrupted is a secret left behind.
	if _, err := atomicfile.RemoveTemps(v.keys); err != nil {
		return err
	}
	if pc.StateDir != "" {
		work, err := makeWorkDir(pc.StateDir)
		if err != nil {
			return fmt.Errorf("ceph: persistent roots' work directory: %w", err)
		}
		v.work = work
	}
	return nil
}

// volume is a checked ceph flexvolume.
type volume struct {
	monitors []ports.NetworkHost
	pool     string
	image    string
	user     string
	key      string // base64, as in a keyring; may be empty until found
	capacity int64  // 0: any size
	create   bool
	rootfs   bool // the volume holds the VM's persistent root
}

var (
	cephName = regexp.MustCompile(`^[a-zA-Z0-9][-a-zA-Z0-9_.]{0,127}$`)
	// A cephx key is 28 bytes (a header and a 16-byte AES key), base64.
	minKeyBytes = 16
)

func parse(name string, opts map[string]string) (volume, error) {
	if err := schema.Check(name, opts); err != nil {
		return volume{}, err
	}
	v := volume{pool: opts["pool"], image: opts["volume"], user: strings.TrimPrefix(opts["user"], "client.")}
	for _, f := range []struct{ opt, val string }{{"pool", v.pool}, {"volume", v.image}, {"user", v.user}} {
		if !cephName.MatchString(f.val) {
			return volume{}, schema.Invalid(name, f.opt, f.val, "not a Ceph name", "letters, digits, '-', '_' and '.'")
		}
	}
	for _, m := range strings.Split(opts["monitor"], ",") {
		host, port, err := net.SplitHostPort(strings.TrimSpace(m))
		if err != nil || host == "" {
			return volume{}, schema.Invalid(name, "monitor", opts["monitor"], "not host:port", "monitors as ip:port, comma-separated, e.g. 10.0.0.1:6789")
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return volume{}, schema.Invalid(name, "monitor", opts["monitor"], "bad port "+port, "monitors as ip:port, comma-separated")
		}
		v.monitors = append(v.monitors, ports.NetworkHost{Name: host, Port: port})
	}
	if p := opts["protocol"]; p != "" && p != "rbd" {
		return volume{}, schema.Invalid(name, "protocol", p, "", "rbd")
	}
	if s := strings.TrimSpace(opts["secret"]); s != "" {
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(raw) < minKeyBytes {
			// Never echo the value: it is meant to be a key.
			return volume{}, schema.Invalid(name, "secret", "", "not a base64 cephx key", "the key as a keyring holds it (base64)")
		}
		v.key = s
	}
	if c := opts["capacity"]; c != "" {
		n, err := flexopts.Capacity(c)
		if err != nil {
			return volume{}, schema.Invalid(name, "capacity", c, err.Error(), flexopts.CapacityAllowed)
		}
		v.capacity = n
	}
	switch opts["create"] {
	case "", "false":
	case "true":
		v.create = true
		if v.capacity == 0 {
			return volume{}, schema.Invalid(name, "capacity", "", "missing: creating an image needs its size", flexopts.CapacityAllowed)
		}
	default:
		return volume{}, schema.Invalid(name, "create", opts["create"], "", `"true" (create the image when it does not exist) or "false"`)
	}
	switch opts[ports.RootfsOption] {
	case "", "false":
	case "true":
		v.rootfs = true
	default:
		return volume{}, schema.Invalid(name, ports.RootfsOption, opts[ports.RootfsOption], "",
			`"true" (the image holds the VM's persistent root file system) or "false"`)
	}
	return v, nil
}

var podUID = regexp.MustCompile(`^[a-zA-Z0-9][-a-zA-Z0-9]{0,127}$`)

func (v *Volumes) keyPath(req ports.VolumeRequest) (string, error) {
	if v.keys == "" {
		return "", fmt.Errorf("ceph: not configured: %w", ports.ErrUnavailable)
	}
	if !podUID.MatchString(req.PodUID) {
		return "", &ports.InvalidError{Field: "ceph volume " + req.Name + " pod UID", Value: req.PodUID, Allowed: "the pod's UID (kubelet's kubernetes.io/pod.uid)"}
	}
	if !cephName.MatchString(req.Name) {
		return "", &ports.InvalidError{Field: "ceph volume name", Value: req.Name, Allowed: "letters, digits, '-', '_' and '.'"}
	}
	return filepath.Join(v.keys, req.PodUID, req.Name+".key"), nil
}

// Validate checks the options and keeps the key, returning the options
// without it.
func (v *Volumes) Validate(ctx context.Context, req ports.VolumeRequest) (map[string]string, error) {
	vol, err := parse(req.Name, req.Options)
	if err != nil {
		return nil, err
	}
	if vol.key == "" {
		return nil, schema.Invalid(req.Name, "secret", "", "missing", "the cephx key: the secret option, or a secretRef to a Secret with a key named secret")
	}
	p, err := v.keyPath(req)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(p, []byte(vol.key), 0o600); err != nil {
		return nil, fmt.Errorf("keep the key of ceph volume %s: %w", req.Name, err)
	}
	kept := schema.Own(req.Options)
	delete(kept, "secret")
	return kept, nil
}

// Forget deletes the key Validate kept (and what an interrupted Validate
// left).
func (v *Volumes) Forget(ctx context.Context, req ports.VolumeRequest) error {
	p, err := v.keyPath(req)
	if err != nil {
		return err
	}
	for _, f := range []string{p, p + atomicfile.TempSuffix} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("forget the key of ceph volume %s: %w", req.Name, err)
		}
	}
	os.Remove(filepath.Dir(p)) // once empty
	return nil
}

// Prepare checks the image (creating it when asked), writes the pod's
// image into a persistent root, and describes the network disk.
func (v *Volumes) Prepare(ctx context.Context, req ports.VolumeRequest) (ports.VolumeAttachment, error) {
	vol, err := parse(req.Name, req.Options)
	if err != nil {
		return ports.VolumeAttachment{}, err
	}
	if err := checkRootfsRequest(vol, req); err != nil {
		return ports.VolumeAttachment{}, err
	}
	if vol.key, err = v.key(req, vol); err != nil {
		return ports.VolumeAttachment{}, err
	}
	rawKey, _ := base64.StdEncoding.DecodeString(vol.key) // checked by parse
	disk := ports.Disk{Name: "vol-" + req.Name, Device: ports.DeviceDisk, ReadOnly: req.ReadOnly,
		Source: ports.DiskSource{Type: ports.SourceNetwork, Protocol: "rbd", Name: vol.pool + "/" + vol.image, Format: "raw",
			Hosts: vol.monitors, Auth: &ports.DiskAuth{Username: vol.user, SecretType: "ceph", Secret: rawKey}}}
	log := v.log.WithFields(logrus.Fields{"vm": req.VMID, "volume": req.Name, "image": vol.pool + "/" + vol.image})
	s, err := v.connect(ctx, vol)
	if err != nil {
		return ports.VolumeAttachment{}, fmt.Errorf("ceph volume %s (image %s/%s): %w", req.Name, vol.pool, vol.image, err)
	}
	defer s.close()
	if req.Rootfs != nil {
		offset, size, err := v.prepareRootfs(ctx, s.ioctx, vol, req.Name, *req.Rootfs, log)
		if err != nil {
			return ports.VolumeAttachment{}, fmt.Errorf("ceph volume %s (image %s/%s): %w", req.Name, vol.pool, vol.image, err)
		}
		disk.Source.Offset, disk.Source.Size = offset, size
		return ports.VolumeAttachment{Disks: []ports.Disk{disk}}, nil
	}
	size, created, err := checkImage(s.ioctx, vol)
	if err != nil {
		return ports.VolumeAttachment{}, fmt.Errorf("ceph volume %s (image %s/%s): %w", req.Name, vol.pool, vol.image, err)
	}
	log.WithFields(logrus.Fields{"bytes": size, "created": created}).Info("RBD image ready")
	att := ports.VolumeAttachment{Disks: []ports.Disk{disk}}
	if vol.create {
		// A volume that may be new asks the guest for a file system; the
		// guest makes one only on a disk that is blank (never written), so
		// an image that existed keeps its data.
		if att.Format, err = schema.FSType(req.Name, req.Options, "ext4"); err != nil {
			return ports.VolumeAttachment{}, err
		}
	}
	return att, nil
}

// checkRootfsRequest makes sure the volume's rootfs option and the
// runtime's request agree: an image is written only into a volume that
// asked to hold the root, and such a volume is never attached without it
// (the guest would see the header).
func checkRootfsRequest(vol volume, req ports.VolumeRequest) error {
	switch {
	case vol.rootfs && req.Rootfs == nil:
		return fmt.Errorf("ceph volume %s has option rootfs: \"true\", but the runtime asked for no persistent root (a runtime that does not know the option): %w",
			req.Name, ports.ErrFailedPrecondition)
	case !vol.rootfs && req.Rootfs != nil:
		return schema.Invalid(req.Name, ports.RootfsOption, "", "missing: the runtime asks this volume to hold the persistent root",
			`"true" on the volume that holds the VM's persistent root file system`)
	case req.Rootfs != nil && req.ReadOnly:
		return schema.Invalid(req.Name, ports.RootfsOption, "true", "the volume is read-only, and a persistent root file system is written by its VM",
			"a read-write volume")
	}
	return nil
}

// key is the volume's cephx key: from its options, else the one Validate
// kept.
func (v *Volumes) key(req ports.VolumeRequest, vol volume) (string, error) {
	if vol.key != "" {
		return vol.key, nil
	}
	p, err := v.keyPath(req)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("ceph volume %s: the plugin does not know its cephx key: it keeps the key it receives when kubelet mounts the volume (flexvolume driver), and this volume was not mounted through it: %w",
			req.Name, ports.ErrFailedPrecondition)
	}
	if err != nil {
		return "", fmt.Errorf("ceph volume %s: read its kept key: %w", req.Name, err)
	}
	return string(b), nil
}

// session is a connection to the cluster as a volume's user, with the
// volume's pool open.
type session struct {
	conn  *rados.Conn
	ioctx *rados.IOContext
}

func (s *session) close() {
	s.ioctx.Destroy()
	s.conn.Shutdown()
}

// connect connects as the volume's user and opens its pool. Every talk
// with the cluster is bounded by the plugin's timeout.
func (v *Volumes) connect(ctx context.Context, vol volume) (*session, error) {
	conn, err := rados.NewConnWithUser(vol.user)
	if err != nil {
		return nil, fmt.Errorf("ceph client: %w", err)
	}
	var mons []string
	for _, m := range vol.monitors {
		mons = append(mons, net.JoinHostPort(m.Name, m.Port))
	}
	secs := strconv.Itoa(int(v.timeout.Seconds() + 0.5))
	for _, o := range [][2]string{
		{"mon_host", strings.Join(mons, ",")}, {"key", vol.key}, {"keyring", "/dev/null"},
		{"client_mount_timeout", secs}, {"rados_mon_op_timeout", secs}, {"rados_osd_op_timeout", secs},
		{"log_to_stderr", "false"}, {"err_to_stderr", "false"}, {"log_file", "/dev/null"},
	} {
		if err := conn.SetConfigOption(o[0], o[1]); err != nil {
			conn.Shutdown()
			return nil, fmt.Errorf("ceph client option %s: %w", o[0], err)
		}
	}
	// Connect may outlive the caller (it is bounded by the timeouts
	// above): the connection is then shut down when it returns.
	done := make(chan error, 1)
	go func() { done <- conn.Connect() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		go func() {
			<-done
			conn.Shutdown()
		}()
		return nil, ctx.Err()
	}
	if err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("connect to the Ceph monitors %s as %s: %v: %w", strings.Join(mons, ","), vol.user, err, ports.ErrUnavailable)
	}
	ioctx, err := conn.OpenIOContext(vol.pool)
	if err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("open pool %s: %w", vol.pool, err)
	}
	return &session{conn: conn, ioctx: ioctx}, nil
}

// checkImage checks the image, creating it when the volume asks. The image
// is opened read-only, which registers no watch, and closed at once.
func checkImage(ioctx *rados.IOContext, vol volume) (size uint64, created bool, err error) {
	img, err := rbd.OpenImageReadOnly(ioctx, vol.image, rbd.NoSnapshot)
	if errors.Is(err, rbd.ErrNotFound) {
		if !vol.create {
			return 0, false, fmt.Errorf("the image does not exist (the volume's options may ask to create it: create: \"true\" with a capacity): %w", ports.ErrNotFound)
		}
		if err := createImage(ioctx, vol.image, vol.capacity); err != nil {
			return 0, false, err
		}
		return uint64(vol.capacity), true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("open the image: %w", err)
	}
	defer img.Close()
	size, err = img.GetSize()
	if err != nil {
		return 0, false, fmt.Errorf("size of the image: %w", err)
	}
	if vol.capacity > 0 && size < uint64(vol.capacity) {
		return 0, false, &ports.InvalidError{Field: "ceph volume option capacity", Value: strconv.FormatInt(vol.capacity, 10) + " bytes",
			Reason: fmt.Sprintf("the image has %d bytes", size), Allowed: "at most the image's size"}
	}
	return size, false, nil
}

// createImage makes an RBD image of size bytes with layering only, which
// every client (QEMU's librbd of any node) reads.
func createImage(ioctx *rados.IOContext, name string, size int64) error {
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if err := opts.SetUint64(rbd.ImageOptionFeatures, rbd.FeatureLayering); err != nil {
		return err
	}
	if err := rbd.CreateImage(ioctx, name, uint64(size), opts); err != nil {
		return fmt.Errorf("create the image: %w", err)
	}
	return nil
}

// Release keeps the image: Ceph volumes are persistent. The key stays
// until kubelet unmounts the volume (Forget), for the pod's next VM.
func (v *Volumes) Release(ctx context.Context, req ports.VolumeRequest) error { return nil }

var _ ports.Volumes = (*Volumes)(nil)
