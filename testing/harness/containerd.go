package harness

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/debs"
)

// Container images of the tests, made locally (no registry): the pause
// image's /pause comes from testing/images/pause, busybox from Debian's
// busybox-static.
const (
	PauseImage   = "virtlet-test.local/pause:1"
	BusyboxImage = "virtlet-test.local/busybox:1"
)

// ContainerdBinDir holds the tests' containerd 2.2, its shim, ctr and
// runc 1.3, built by testing/tools/build.sh.
func ContainerdBinDir() string { return filepath.Join(RepoRoot(), "bin", "tools", "containerd") }

// DebianContainerdBinDir returns a directory holding Debian's containerd,
// its shim and ctr (package containerd) and runc (package runc), apt's
// candidate versions (Debian 12: containerd 1.6.20, runc 1.1.5), the
// programs a node gets from `apt-get install containerd runc`. They come
// out of the .deb files (apt-get download, checked against apt's SHA256,
// kept in CacheDir's debs) into its debian-containerd/<the versions>, once.
func DebianContainerdBinDir() (string, error) {
	cache := CacheDir()
	dir, err := debs.Programs(filepath.Join(cache, "debian-containerd"), filepath.Join(cache, "debs"), map[string][]string{
		"containerd": {"/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/bin/ctr"},
		"runc":       {"/usr/sbin/runc"},
	})
	if err != nil {
		return "", fmt.Errorf("Debian's containerd and runc: %w", err)
	}
	return dir, nil
}

// ContainerdOptions choose the containerd a test runs.
type ContainerdOptions struct {
	// BinDir holds containerd, containerd-shim-runc-v2, ctr and runc;
	// ContainerdBinDir when empty. DebianContainerdBinDir's run as they
	// are: the config the harness writes is version 2, which containerd
	// 1.6 reads and 2.x migrates.
	BinDir string
	// CNIConfDir is its pods' CNI configuration (the test network's when
	// empty).
	CNIConfDir string
	// Wrap runs it on a Node (Node.Wrap).
	Wrap []string
}

// Containerd is a containerd of the test's own (containerd 2.2 and runc
// 1.3, or the ones of ContainerdOptions.BinDir) serving CRI on a private
// socket, with the test network as its CNI network and the test images
// imported. Forwarded container pods run there.
type Containerd struct {
	// Endpoint is its CRI socket, unix:///…
	Endpoint string
	Dir      string
	binDir   string
	socket   string
	cmd      *exec.Cmd
	exited   chan struct{} // set once Stop began
	log      *os.File
}

// StartContainerd starts containerd for the test and stops it (and every
// shim and mount it left) when the test ends.
func StartContainerd(t testing.TB, tn *TestNetwork, opts ContainerdOptions) *Containerd {
	t.Helper()
	binDir := opts.BinDir
	if binDir == "" {
		binDir = ContainerdBinDir()
	}
	for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr"} {
		if _, err := os.Stat(filepath.Join(binDir, bin)); err != nil {
			t.Fatalf("%s is missing from %s (testing/tools/build.sh builds the default containerd and runc): %v", bin, binDir, err)
		}
	}
	// A short directory: the sockets' paths must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	// Pods in user namespaces: their root user (a host uid from the
	// pod's range) must reach the rootfs below the state directory.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	c := &Containerd{Dir: dir, binDir: binDir, socket: filepath.Join(dir, "containerd.sock")}
	c.Endpoint = "unix://" + c.socket
	config := filepath.Join(dir, "config.toml")
	cniConf := opts.CNIConfDir
	if cniConf == "" {
		cniConf = tn.ConfDir
	}
	if err := os.WriteFile(config, []byte(containerdConfig(dir, c.socket, cniConf)), 0o644); err != nil {
		t.Fatal(err)
	}
	if c.log, err = os.Create(filepath.Join(dir, "containerd.log")); err != nil {
		t.Fatal(err)
	}
	argv := append(append([]string(nil), opts.Wrap...), filepath.Join(binDir, "containerd"), "--config", config)
	c.cmd = exec.Command(argv[0], argv[1:]...)
	// containerd finds its shim, and the shim runc, in PATH.
	c.cmd.Env = append(os.Environ(), "PATH="+binDir+":"+os.Getenv("PATH"))
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.stop(t) })
	Eventually(t, 30*time.Second, "containerd answers", func() bool {
		return exec.Command(filepath.Join(binDir, "ctr"), "--address", c.socket, "version").Run() == nil
	})
	images := t.TempDir()
	for _, img := range []struct {
		name  string
		build func(root string) ([]string, error)
	}{{PauseImage, buildPauseRoot}, {BusyboxImage, buildBusyboxRoot}} {
		root := filepath.Join(images, strings.NewReplacer("/", "_", ":", "_").Replace(img.name))
		entrypoint, err := img.build(root)
		if err != nil {
			t.Fatalf("image %s: %v", img.name, err)
		}
		archive := root + ".tar"
		if err := writeDockerArchive(archive, img.name, root, entrypoint); err != nil {
			t.Fatalf("image %s: %v", img.name, err)
		}
		if out, err := c.Ctr("images", "import", archive); err != nil {
			t.Fatalf("import %s into containerd: %v\n%s", img.name, err, out)
		}
	}
	return c
}

// ImportBusybox imports a busybox image named name (every applet of
// Debian's busybox-static and a pgrep, a /www with an index page for
// httpd) whose entrypoint is entrypoint.
func (c *Containerd) ImportBusybox(t testing.TB, name string, entrypoint ...string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	if _, err := buildBusyboxRoot(root); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	// busybox-static has no pgrep applet: the tiny guest's stand-in.
	pgrep, err := os.ReadFile(filepath.Join(RepoRoot(), "testing", "images", "tiny", "pgrep"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "pgrep"), pgrep, 0o755); err != nil {
		t.Fatal(err)
	}
	// The accounts of the busybox images on Docker Hub.
	etc := map[string]string{
		"passwd": "root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/bin/false\nwww-data:x:33:33:www-data:/var/www:/bin/false\nnobody:x:65534:65534:nobody:/home:/bin/false\n",
		"group":  "root:x:0:\ndaemon:x:1:\nwww-data:x:33:\nnogroup:x:65534:\n",
	}
	for name, content := range etc {
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "www"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "www", "index.html"), []byte("<html><body>busybox httpd</body></html>\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	archive := root + ".tar"
	if err := writeDockerArchive(archive, name, root, entrypoint); err != nil {
		t.Fatalf("image %s: %v", name, err)
	}
	if out, err := c.Ctr("images", "import", archive); err != nil {
		t.Fatalf("import %s into containerd: %v\n%s", name, err, out)
	}
}

// Log is containerd's output so far.
func (c *Containerd) Log() string {
	b, _ := os.ReadFile(c.log.Name())
	return string(b)
}

// containerdConfig is the test containerd's config, in version 2 of the
// format: containerd 1.6 (Debian 12's) reads versions 1 and 2 only, and
// containerd 2.x migrates a version 2 config to its version 3 as it starts
// (same plugins, same settings), so one config serves both.
func containerdConfig(dir, socket, cniConfDir string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = %[3]q
[ttrpc]
  address = "%[3]s.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[4]q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # This machine lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj
  # (kubelet asks -998 for sandboxes).
  restrict_oom_score_adj = true
  # Pod network namespaces below the state directory, so that they carry
  # the run's tag (testing/hostcheck finds them as its mounts).
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[5]q
    conf_dir = %[6]q
  # Registry hosts of the test's own (Mirror), not the host's
  # /etc/containerd/certs.d.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %[8]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[7]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), socket, PauseImage, CNIBinDir, cniConfDir, filepath.Join(dir, "opt"),
		filepath.Join(dir, "certs.d"))
}

// Mirror makes containerd pull the images of registry (gcr.io) from
// mirror (http://127.0.0.1:5000), a registry of the test's, through a
// hosts.toml of its config_path (containerd reads it at every pull) that
// makes the mirror the registry's server: an image the mirror lacks fails
// to pull rather than coming from the real registry when the machine
// reaches it.
func (c *Containerd) Mirror(t testing.TB, registry, mirror string) {
	t.Helper()
	dir := filepath.Join(c.Dir, "certs.d", registry)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	hosts := fmt.Sprintf("server = %q\n", mirror)
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Ctr runs containerd's own CLI against it, in the CRI namespace.
// Its standard output is the result; what it prints on standard error
// (containerd 2.2 warns that cgroup v1 is deprecated on every call here)
// comes with a failure only.
func (c *Containerd) Ctr(args ...string) (string, error) {
	var stderr strings.Builder
	cmd := exec.Command(filepath.Join(c.binDir, "ctr"), append([]string{"--address", c.socket, "-n", "k8s.io"}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

// Stop ends containerd itself (its shims, and so its containers, live on,
// as they do when containerd restarts).
func (c *Containerd) Stop(t testing.TB) {
	if c.exited != nil {
		return
	}
	c.exited = make(chan struct{})
	c.cmd.Process.Signal(syscall.SIGTERM)
	go func() { c.cmd.Wait(); close(c.exited) }()
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		t.Logf("containerd did not stop on SIGTERM: killed")
		syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
	}
}

// stop ends containerd, then the shims it started (they outlive it by
// design), and unmounts what they left, so that nothing stays behind.
func (c *Containerd) stop(t testing.TB) {
	c.Stop(t)
	for pid, cmdline := range processesMentioning(c.socket) {
		if !strings.Contains(cmdline, "containerd-shim") {
			continue // a client, such as a daemon forwarding to it
		}
		t.Logf("containerd left %d: %s", pid, cmdline)
		killTree(pid)
	}
	for _, m := range mountsUnder(c.Dir) {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
	c.log.Close()
	if os.Getenv("VIRTLET_KEEP") == "" {
		os.RemoveAll(c.Dir)
	}
}

// killTree kills pid and every descendant (a shim and its containers).
func killTree(pid int) {
	for child := range ChildrenOf(pid) {
		killTree(child)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

// processesMentioning finds the processes whose command line contains s.
func processesMentioning(s string) map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if cmdline := strings.ReplaceAll(string(raw), "\x00", " "); strings.Contains(cmdline, s) {
			out[pid] = cmdline
		}
	}
	return out
}

// mountsUnder lists the mount points below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 1 && strings.HasPrefix(fields[1], dir+"/") {
			out = append([]string{fields[1]}, out...)
		}
	}
	return out
}

// buildPauseRoot builds testing/images/pause statically into root.
func buildPauseRoot(root string) ([]string, error) {
	if err := BuildStatic("./testing/images/pause", filepath.Join(root, "pause")); err != nil {
		return nil, err
	}
	return []string{"/pause"}, nil
}

// BuildStatic builds the repository's package pkg (./testing/images/pause)
// as a static binary at out, for a container image.
func BuildStatic(pkg, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", pkg, err, msg)
	}
	return nil
}

// buildBusyboxRoot lays Debian's static busybox out with its applets.
func buildBusyboxRoot(root string) ([]string, error) {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox-static: %w", err)
	}
	for _, d := range []string{"bin", "tmp", "etc", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), bb, 0o755); err != nil {
		return nil, err
	}
	for _, applet := range []string{"sh", "cat", "echo", "sleep", "ls", "hostname", "ip", "ping", "wget", "nc", "env", "id", "ps", "true", "false"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			return nil, err
		}
	}
	return []string{"/bin/sh"}, nil
}

// writeDockerArchive writes a one-layer image of root in `docker save`
// format, which `ctr images import` reads.
func writeDockerArchive(path, name, root string, entrypoint []string) error {
	var layer bytes.Buffer
	if err := tarDir(&layer, root); err != nil {
		return err
	}
	diff := sha256.Sum256(layer.Bytes())
	config, err := json.Marshal(map[string]interface{}{
		"architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
		"config": map[string]interface{}{"Entrypoint": entrypoint, "Env": []string{"PATH=/bin"}, "WorkingDir": "/"},
		"rootfs": map[string]interface{}{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(diff[:])}},
	})
	if err != nil {
		return err
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]interface{}{{"Config": configName, "RepoTags": []string{name}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, file := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {configName, config}, {"layer.tar", layer.Bytes()}} {
		if err := tw.WriteHeader(&tar.Header{Name: file.name, Mode: 0o644, Size: int64(len(file.data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if _, err := tw.Write(file.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// tarDir writes root's tree (files, directories, symlinks) owned by root.
func tarDir(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime = rel, 0, 0, "", "", time.Unix(0, 0)
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// CoreDNSImage is the cluster DNS's image (ImportCoreDNS): CoreDNS,
// testing/coredns/build.sh's static build, alone.
const CoreDNSImage = "virtlet-test.local/coredns:1.12.4"

// ImportCoreDNS builds CoreDNS (once, cached) and imports it as
// CoreDNSImage, its entrypoint /coredns.
func (c *Containerd) ImportCoreDNS(t testing.TB) {
	t.Helper()
	out, err := exec.Command(filepath.Join(RepoRoot(), "testing", "coredns", "build.sh")).Output()
	if err != nil {
		t.Fatalf("build CoreDNS: %v", err)
	}
	bin, err := os.ReadFile(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "etc", "coredns"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "coredns"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := root + ".tar"
	if err := writeDockerArchive(archive, CoreDNSImage, root, []string{"/coredns"}); err != nil {
		t.Fatalf("image %s: %v", CoreDNSImage, err)
	}
	if out, err := c.Ctr("images", "import", archive); err != nil {
		t.Fatalf("import %s into containerd: %v\n%s", CoreDNSImage, err, out)
	}
}
