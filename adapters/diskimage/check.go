package diskimage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/virtlet/virtlet/adapters/internal/keyedmutex"
	"github.com/virtlet/virtlet/adapters/posixacl"
)

// Tool runs QEMU's image tools (qemu-img) on an untrusted image as a user
// of no account, bounded in time and address space: the tools parse the
// image's metadata, and an image crafted against them reaches no more
// than that user may (nothing of the host's but world-readable files).
// Inspect must pass first, so that no tool is pointed at another file by
// the image.
type Tool struct {
	// UID is the user (and group) the tools run as when this process is
	// root; DefaultToolUID when 0.
	UID uint32
	// Timeout bounds each run; 2 minutes when 0.
	Timeout time.Duration
	// MaxMemory bounds each run's address space; 2 GiB when 0.
	MaxMemory uint64
}

// qemuImg is the tool's binary (a test's stand-in replaces it).
var qemuImg = "qemu-img"

// DefaultToolUID is a user and group id no account has, below the VMs'
// users (2000000000 and up, adapters/libvirt). Each plugin that runs the
// tools has a user of its own (the images plugin this one), so that one
// process revoking its grant on a shared image never cuts another's run
// short: runs of one process on one file are serialised.
const (
	DefaultToolUID = 1999999999
	VolumeToolUID  = DefaultToolUID - 1 // the raw volume plugin (persistent roots)
	LibvirtToolUID = DefaultToolUID - 2 // the libvirt plugin (VirtletFilesFromDataSource)
	CephToolUID    = DefaultToolUID - 3 // the ceph volume plugin (persistent roots on RBD)
)

func (t Tool) uid() uint32 {
	if t.UID == 0 {
		return DefaultToolUID
	}
	return t.UID
}

// run runs qemu-img with args, bounded by timeout when it is not 0 (see
// execute). Its standard output is returned; a failure carries its
// standard error.
func (t Tool) run(ctx context.Context, timeout time.Duration, grants map[string]uint16, args ...string) ([]byte, int, error) {
	stdout, _, code, err := t.execute(ctx, timeout, grants, qemuImg, args...)
	return stdout, code, err
}

// Run runs one of the disk tools (prog: qemu-img, qemu-io, debugfs,
// blkid) the way Tool runs qemu-img, bounded by the Tool's timeout, with
// grants as execute takes them. It returns the tool's standard output and
// standard error; a failure to run or a non-zero exit is an error.
func (t Tool) Run(ctx context.Context, grants map[string]uint16, prog string, args ...string) ([]byte, []byte, error) {
	switch prog {
	case "qemu-img", "qemu-io", "debugfs", "blkid":
	default:
		return nil, nil, fmt.Errorf("%q is not a disk tool", prog)
	}
	if prog == "qemu-img" {
		prog = qemuImg
	}
	stdout, stderr, _, err := t.execute(ctx, t.timeout(), grants, prog, args...)
	return stdout, stderr, err
}

// execute runs prog with args. The tool's user may read (perm 4) or read
// and write (6) each of grants only while it runs (an ACL entry, removed
// after); the directories above them must let every user search them
// (the image store's do). It returns the standard output and error, and
// the exit code; a failure carries the standard error.
func (t Tool) execute(ctx context.Context, timeout time.Duration, grants map[string]uint16, prog string, args ...string) ([]byte, []byte, int, error) {
	mem := t.MaxMemory
	if mem == 0 {
		mem = 2 << 30
	}
	name := filepath.Base(prog) + " " + args[0]
	if prog == qemuImg {
		name = "qemu-img " + args[0]
	}
	for p := range grants {
		if !strings.HasPrefix(p, "/") {
			// QEMU reads "proto:..." and "json:{...}" names as protocols.
			return nil, nil, 0, fmt.Errorf("image path %q is not absolute", p)
		}
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	argv := append([]string{"--as=" + strconv.FormatUint(mem, 10), "--core=0", "--", prog}, args...)
	cmd := exec.CommandContext(ctx, "prlimit", argv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Output kept open by a child it left must not hold the run.
	cmd.WaitDelay = 5 * time.Second
	if os.Geteuid() == 0 {
		uid := t.uid()
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}
		// Namespaces of its own: the tool is their first process, so
		// whatever a crafted image made it start dies with it (the tool's
		// user holds grants on other images in other runs), and it has
		// no network.
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC
		paths := make([]string, 0, len(grants))
		for p := range grants {
			paths = append(paths, p)
		}
		slices.Sort(paths)
		for _, p := range paths {
			if dir := unsearchable(p); dir != "" {
				return nil, nil, 0, fmt.Errorf("%s runs as user %d, which cannot search %s (the image's directories need o+x)", name, uid, dir)
			}
		}
		for _, p := range paths {
			unlock := granting.Lock(p)
			defer unlock()
			revoke, err := grant(p, uid, grants[p])
			if err != nil {
				return nil, nil, 0, fmt.Errorf("let the disk tools' user %d open %s: %w", uid, p, err)
			}
			defer revoke()
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Few malloc arenas: the address space bound is for the image's
	// doing, not glibc's per-thread reserves.
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "MALLOC_ARENA_MAX=2"}
	cmd.Dir = "/"
	err := cmd.Run()
	if ctx.Err() != nil {
		if timeout > 0 && ctx.Err() == context.DeadlineExceeded {
			return nil, nil, 0, fmt.Errorf("%s took longer than %s", name, timeout)
		}
		return nil, nil, 0, fmt.Errorf("%s: %w", name, ctx.Err())
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return stdout.Bytes(), stderr.Bytes(), exit.ExitCode(), fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("%s: %w", name, err)
	}
	return stdout.Bytes(), stderr.Bytes(), 0, nil
}

func (t Tool) timeout() time.Duration {
	if t.Timeout == 0 {
		return 2 * time.Minute
	}
	return t.Timeout
}

// Check runs qemu-img check on an image Inspect accepted: a corrupt image
// is refused (wrapping ErrNotADisk) when it is pulled, not at each start.
// Leaked clusters are harmless and pass. Raw images have no metadata to
// check.
func (t Tool) Check(ctx context.Context, path string, info Info) error {
	if info.Format != QCOW2 {
		return nil
	}
	out, code, err := t.run(ctx, t.timeout(), map[string]uint16{path: 4}, "check", "-f", "qcow2", "--output=json", path)
	var res struct {
		Corruptions int `json:"corruptions"`
		CheckErrors int `json:"check-errors"`
	}
	switch {
	// 0: clean; 3: leaks only.
	case code == 0 && err == nil, code == 3:
		return nil
	case code == 2 && json.Unmarshal(out, &res) == nil:
		return fmt.Errorf("%w: qemu-img check found %d corruptions in the qcow2 image", ErrNotADisk, res.Corruptions)
	case code == 1 || code == 2:
		return fmt.Errorf("%w: qemu-img check could not read the qcow2 image: %v", ErrNotADisk, err)
	}
	return err
}

// QemuInfo is what qemu-img info reports of an image.
type QemuInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
	Encrypted       bool   `json:"encrypted"`
	FormatSpecific  struct {
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// Info runs qemu-img info on the image, in the given format ("" lets
// QEMU probe it).
func (t Tool) Info(ctx context.Context, path, format string) (QemuInfo, error) {
	args := []string{"info", "--output=json"}
	if format != "" {
		args = append(args, "-f", format)
	}
	out, _, err := t.run(ctx, t.timeout(), map[string]uint16{path: 4}, append(args, path)...)
	if err != nil {
		return QemuInfo{}, err
	}
	var info QemuInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return QemuInfo{}, fmt.Errorf("qemu-img info: %w", err)
	}
	return info, nil
}

// unsearchable is the first directory above path that others may not
// search, or "".
func unsearchable(path string) string {
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		if st, err := os.Stat(dir); err == nil && st.Mode().Perm()&0o001 == 0 {
			return dir
		}
		if dir == "/" {
			return ""
		}
	}
}

// Convert writes the image (of format, which Inspect found) as raw data
// to the block device dev, through qemu-img convert's target options
// (which name dev), bounded by ctx alone: a copy takes as long as the
// image is large.
func (t Tool) Convert(ctx context.Context, image, format, dev, targetOpts string) error {
	_, _, err := t.run(ctx, 0, map[string]uint16{image: 4, dev: 6},
		"convert", "-n", "-f", format, "--target-image-opts", image, targetOpts)
	return err
}

// ConvertToFile writes the image (of format, which Inspect found) as raw
// data into dest, an existing file the caller made (the tool's user cannot
// create files where the caller keeps it), sparse where the image reads
// as zeros. It is bounded by ctx alone: a copy takes as long as the image
// is large.
func (t Tool) ConvertToFile(ctx context.Context, image, format, dest string) error {
	_, _, err := t.run(ctx, 0, map[string]uint16{image: 4, dest: 6},
		"convert", "-f", format, "-O", "raw", image, dest)
	return err
}

// granting serialises the grants of one file: two runs on one image (two
// pods' persistent roots) must not each restore the ACL the other set.
var granting keyedmutex.Map

// grant adds an ACL entry letting uid open the file at path with perm
// (4 read, 6 read and write), keeping the entries others hold (the VMs'
// users on an image), and returns what removes it again.
func grant(path string, uid uint32, perm uint16) (func(), error) {
	if err := posixacl.Grant(path, uid, perm); err != nil {
		return nil, err
	}
	return func() { posixacl.Revoke(path, uid) }, nil
}
