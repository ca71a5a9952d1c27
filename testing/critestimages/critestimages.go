// Package critestimages builds stand-ins for the container images that
// cri-tools' critest pulls from registries (cri-tools' test images on
// gcr.io/k8s-staging-cri-tools, Kubernetes' e2e images on registry.k8s.io),
// from Debian packages and a few lines of this repository: the tests reach
// no registry on the internet. The images are written once into an OCI
// image layout under the cache directory, named by a hash of everything
// they are made of, and pushed to a registry of the test's own, which the
// test's containerd uses as its mirror of gcr.io and registry.k8s.io:
// critest's pulls are real pulls.
//
// Each stand-in gives the specs what cri-tools' Dockerfiles (images/ in
// cri-tools v1.34.0) and Kubernetes' e2e images give them: busybox as the
// base, with its applets as hard links (MaskedPaths masks /bin/ls); the
// users and groups of the image-user and image-predefined-group images;
// nginx writing /var/run/nginx.pid with its "master process" title (the
// PID namespace specs), on port 12003 in hostnet-nginx; a setuid program
// printing its effective user (NoNewPrivs); ipcs (HostIpc).
package critestimages

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containers/image/v5/types"
	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
	imgspecv1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/virtlet/virtlet/testing/containerdisk"
	"github.com/virtlet/virtlet/testing/debs"
	"github.com/virtlet/virtlet/testing/harness"
)

const (
	criTools = "gcr.io/k8s-staging-cri-tools/"
	e2e      = "registry.k8s.io/e2e-test-images/"
)

// The images critest v1.34.0 pulls by these names (pkg/validate/consts.go,
// security_context_linux.go; pkg/framework/util.go for the default test
// image). test-image-digest is not among them: critest pulls it by a digest
// that only cri-tools' own build has.
const (
	Busybox       = e2e + "busybox:1.29-2" // the default test image
	Nginx         = e2e + "nginx:1.14-2"   // the PID namespace specs' and the default web server
	NoNewPrivs    = e2e + "nonewprivs:1.3"
	HostNetNginx  = criTools + "hostnet-nginx-amd64:latest"
	PredefinedGrp = criTools + "test-image-predefined-group:latest"
)

// Registries are the registries the images' names belong to, which a
// test's container runtime must mirror.
var Registries = []string{"gcr.io", "registry.k8s.io"}

// The users of cri-tools' image-user images (images/build).
var imageUsers = map[string]string{
	"test-image-user-uid":            "1002",
	"test-image-user-username":       "www-data",
	"test-image-user-uid-group":      "1003:1004",
	"test-image-user-username-group": "www-data:1004",
}

// cri-tools' image-test images: busybox with one empty file, named by the
// build argument TEST, at /; the same file makes the same image.
var testImages = map[string]string{ // reference → file
	criTools + "test-image-1:latest":      "test-image-1",
	criTools + "test-image-2:latest":      "test-image-2",
	criTools + "test-image-3:latest":      "test-image-3",
	criTools + "test-image-latest:latest": "test-image-latest",
	criTools + "test-image-tags:1":        "same-image",
	criTools + "test-image-tags:2":        "same-image",
	criTools + "test-image-tags:3":        "same-image",
	criTools + "test-image-tag:test":      "test",
	criTools + "test-image-tag:all":       "all",
}

// Set is the built images.
type Set struct {
	// Dir is the OCI image layout holding them, each under its reference
	// (the org.opencontainers.image.ref.name annotation).
	Dir  string
	Refs []string
}

// Refs lists every image's reference, sorted.
func Refs() []string {
	refs := []string{Busybox, Nginx, NoNewPrivs, HostNetNginx, PredefinedGrp}
	for name := range imageUsers {
		refs = append(refs, criTools+name+":latest")
	}
	for ref := range testImages {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	return refs
}

// Build returns the images, from cache/critest-images when their inputs
// have not changed, else built (the .deb files they come from are kept in
// cache/debs). logf tells what it does.
func Build(cache string, logf func(format string, args ...any)) (*Set, error) {
	in, err := gather(filepath.Join(cache, "debs"))
	if err != nil {
		return nil, err
	}
	root := filepath.Join(cache, "critest-images")
	set := &Set{Dir: filepath.Join(root, in.key()), Refs: Refs()}
	if _, err := os.Stat(filepath.Join(set.Dir, "index.json")); err == nil {
		logf("critest images: cached in %s", set.Dir)
		return set, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(root, "build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	images, err := in.images()
	if err != nil {
		return nil, err
	}
	for _, img := range images {
		for _, ref := range img.refs {
			if _, err := containerdisk.Write(context.Background(), "oci:"+tmp+":"+ref, img.image, nil); err != nil {
				return nil, fmt.Errorf("critest image %s: %w", ref, err)
			}
		}
	}
	if err := os.Rename(tmp, set.Dir); err != nil {
		if _, serr := os.Stat(filepath.Join(set.Dir, "index.json")); serr != nil {
			return nil, fmt.Errorf("critest images: %w", err)
		}
		// Another build of the same inputs finished first.
	}
	// The cache keeps the images of the current inputs only.
	olds, _ := filepath.Glob(filepath.Join(root, "*"))
	for _, old := range olds {
		if old != set.Dir && !strings.HasPrefix(filepath.Base(old), "build-") {
			os.RemoveAll(old)
		}
	}
	logf("critest images: built into %s", set.Dir)
	return set, nil
}

// Push copies every image to the registry at addr (plain HTTP), under its
// path and tag: gcr.io/k8s-staging-cri-tools/test-image-1:latest becomes
// addr/k8s-staging-cri-tools/test-image-1:latest, where a mirror of gcr.io
// finds it.
func (s *Set) Push(ctx context.Context, addr string) error {
	sys := &types.SystemContext{DockerInsecureSkipTLSVerify: types.OptionalBoolTrue}
	for _, ref := range s.Refs {
		named, err := reference.ParseNormalizedNamed(ref)
		if err != nil {
			return fmt.Errorf("critest image %s: %w", ref, err)
		}
		tagged, ok := named.(reference.Tagged)
		if !ok {
			return fmt.Errorf("critest image %s has no tag", ref)
		}
		img, err := containerdisk.Read(ctx, "oci:"+s.Dir+":"+ref, nil)
		if err != nil {
			return fmt.Errorf("critest image %s: %w", ref, err)
		}
		dest := fmt.Sprintf("docker://%s/%s:%s", addr, reference.Path(named), tagged.Tag())
		if _, err := containerdisk.Write(ctx, dest, img, sys); err != nil {
			return fmt.Errorf("critest image %s: %w", ref, err)
		}
	}
	return nil
}

// nnpPackage is the nonewprivs image's program.
const nnpPackage = "testing/images/nonewprivs"

// inputs are everything the images are made of.
type inputs struct {
	parts map[string][]byte // name → content, for the key
	// Debian's busybox package's (not busybox-static's: that one's shell
	// runs its applets without looking them up in PATH, so masking
	// /bin/ls would not hide ls from it) and its applets.
	busybox []byte
	applets []string
	nginx   []byte // Debian's nginx package's /usr/sbin/nginx
	ipcs    []byte // util-linux's, this host's
	pgrep   []byte // busybox has no pgrep applet: the tiny guest's script
}

// gather reads the inputs: the .deb files (fetched into debsDir when apt's
// candidate is not there yet), this host's files, the repository's.
func gather(debsDir string) (*inputs, error) {
	in := &inputs{parts: map[string][]byte{}}
	for _, f := range []struct {
		pkg, file string
		into      *[]byte
	}{{"busybox", "/bin/busybox", &in.busybox}, {"nginx", "/usr/sbin/nginx", &in.nginx}} {
		p, err := debs.Candidate(f.pkg)
		if err != nil {
			return nil, err
		}
		deb, err := debs.Fetch(debsDir, p)
		if err != nil {
			return nil, err
		}
		files, err := debs.Files(deb, f.file)
		if err != nil {
			return nil, err
		}
		*f.into = files[f.file]
		in.parts[p.Filename+":"+f.file] = *f.into
	}
	var err error
	if in.ipcs, err = os.ReadFile("/usr/bin/ipcs"); err != nil {
		return nil, fmt.Errorf("util-linux's ipcs: %w", err)
	}
	in.parts["/usr/bin/ipcs"] = in.ipcs
	repo := harness.RepoRoot()
	if in.pgrep, err = os.ReadFile(filepath.Join(repo, "testing", "images", "tiny", "pgrep")); err != nil {
		return nil, err
	}
	in.parts["pgrep"] = in.pgrep
	sources, _ := filepath.Glob(filepath.Join(repo, nnpPackage, "*.go"))
	own, _ := filepath.Glob(filepath.Join(repo, "testing", "critestimages", "*.go"))
	for _, f := range append(append(sources, own...), filepath.Join(repo, "testing", "containerdisk", "containerdisk.go")) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(repo, f)
		in.parts[rel] = data
	}
	if in.applets, err = applets(in.busybox); err != nil {
		return nil, err
	}
	libs, err := sharedLibraries(in.busybox, in.nginx, in.ipcs)
	if err != nil {
		return nil, err
	}
	for p, e := range libs {
		in.parts[p] = append([]byte(e.link), e.data...)
	}
	return in, nil
}

// key names the inputs: a build with the same key made the same images.
func (in *inputs) key() string {
	names := make([]string, 0, len(in.parts))
	for n := range in.parts {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s %d\n", n, len(in.parts[n]))
		h.Write(in.parts[n])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// applets lists busybox's applets by asking it.
func applets(busybox []byte) ([]string, error) {
	dir, err := os.MkdirTemp("", "busybox-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "busybox")
	if err := os.WriteFile(bin, busybox, 0o755); err != nil {
		return nil, err
	}
	out, err := exec.Command(bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	return strings.Fields(string(out)), nil
}

// buildNNP compiles the nonewprivs program, statically.
func buildNNP() ([]byte, error) {
	dir, err := os.MkdirTemp("", "nnp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "nnp")
	if err := harness.BuildStatic("./"+nnpPackage, out); err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}

// built is an image and the references it goes by.
type built struct {
	refs  []string
	image containerdisk.Image
}

// image makes an image of layers with config.
func image(config imgspecv1.ImageConfig, layers ...layer) (containerdisk.Image, error) {
	img := containerdisk.Image{}
	diffIDs := []digest.Digest{}
	for _, l := range layers {
		img.Layers = append(img.Layers, l.gz)
		diffIDs = append(diffIDs, l.diffID)
	}
	var err error
	img.Config, err = json.Marshal(imgspecv1.Image{
		Platform: imgspecv1.Platform{Architecture: "amd64", OS: "linux"},
		Config:   config,
		RootFS:   imgspecv1.RootFS{Type: "layers", DiffIDs: diffIDs},
	})
	return img, err
}

const pathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// The accounts of Docker's busybox image.
const (
	passwd = "root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/bin/false\nbin:x:2:2:bin:/bin:/bin/false\n" +
		"sys:x:3:3:sys:/dev:/bin/false\nsync:x:4:100:sync:/bin:/bin/sync\nmail:x:8:8:mail:/var/spool/mail:/bin/false\n" +
		"www-data:x:33:33:www-data:/var/www:/bin/false\noperator:x:37:37:Operator:/var:/bin/false\nnobody:x:65534:65534:nobody:/home:/bin/false\n"
	group = "root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\nadm:x:4:\ntty:x:5:\ndisk:x:6:\nlp:x:7:\nmail:x:8:\nkmem:x:9:\n" +
		"wheel:x:10:root\ncdrom:x:11:\ndialout:x:18:\nfloppy:x:19:\nvideo:x:28:\naudio:x:29:\ntape:x:32:\nwww-data:x:33:\n" +
		"operator:x:37:\nutmp:x:43:\nplugdev:x:46:\nstaff:x:50:\nlock:x:54:\nnetdev:x:82:\nusers:x:100:\nnogroup:x:65534:\n"
)

// images builds every image from the inputs.
func (in *inputs) images() ([]built, error) {
	libs, err := sharedLibraries(in.busybox)
	if err != nil {
		return nil, err
	}
	// busybox, as Docker's busybox image lays it out: every applet a hard
	// link of /bin/busybox.
	base := tree{}
	for _, d := range []string{"bin", "dev", "etc", "home", "proc", "sys", "usr/sbin", "usr/bin", "var/spool/mail", "var/www"} {
		base.dir(d, 0o755)
	}
	base.dir("root", 0o700)
	base.dir("tmp", 0o1777)
	base.file("bin/busybox", 0o755, in.busybox)
	for _, a := range in.applets {
		if a != "busybox" {
			base.hardlink("bin/"+a, "bin/busybox")
		}
	}
	for p, e := range libs {
		base[p] = e
	}
	base.file("etc/passwd", 0o644, []byte(passwd))
	base.file("etc/group", 0o644, []byte(group))
	busyboxConfig := imgspecv1.ImageConfig{Env: []string{pathEnv}, Cmd: []string{"sh"}}

	// Kubernetes' e2e busybox, the suite's default image, with ipcs
	// (HostIpc) and pgrep (the suite's check for sleep).
	tools := tree{}
	tools.file("usr/bin/ipcs", 0o755, in.ipcs)
	tools.file("bin/pgrep", 0o755, in.pgrep)
	if err := tools.addLibraries(base, in.ipcs); err != nil {
		return nil, err
	}

	// nginx, as the official image configures it, on port 80.
	nginx := tree{}
	nginx.file("usr/sbin/nginx", 0o755, in.nginx)
	if err := nginx.addLibraries(base, in.nginx); err != nil {
		return nil, err
	}
	nginx.file("etc/passwd", 0o644, []byte(passwd+"nginx:x:101:101:nginx:/var/cache/nginx:/sbin/nologin\n"))
	nginx.file("etc/group", 0o644, []byte(group+"nginx:x:101:\n"))
	nginx.file("etc/nginx/nginx.conf", 0o644, []byte(nginxConf))
	nginx.file("etc/nginx/mime.types", 0o644, []byte(mimeTypes))
	nginx.file("etc/nginx/conf.d/default.conf", 0o644, []byte(serverConf(80)))
	nginx.file("usr/share/nginx/html/index.html", 0o644, []byte(welcome))
	nginx.file("usr/share/nginx/html/50x.html", 0o644, []byte("<html><body><h1>An error occurred.</h1></body></html>\n"))
	nginx.dir("var/cache/nginx", 0o755)
	nginx.dir("var/lib/nginx", 0o755)
	nginx.symlink("var/log/nginx/access.log", "/dev/stdout")
	nginx.symlink("var/log/nginx/error.log", "/dev/stderr")
	nginx.dir("run", 0o755)
	nginx.symlink("var/run", "../run")
	nginxConfig := imgspecv1.ImageConfig{
		Env: []string{pathEnv}, Cmd: []string{"nginx", "-g", "daemon off;"},
		ExposedPorts: map[string]struct{}{"80/tcp": {}}, StopSignal: "SIGQUIT",
	}
	// cri-tools' hostnet-nginx: nginx on port 12003.
	hostnet := tree{}
	hostnet.file("etc/nginx/conf.d/default.conf", 0o644, []byte(serverConf(12003)))

	nnp, err := buildNNP()
	if err != nil {
		return nil, err
	}
	nonewprivs := tree{}
	nonewprivs.file("usr/local/bin/nnp", 0o4755, nnp)

	// cri-tools' image-predefined-group: busybox's adduser and addgroup
	// made default-user (1000), a member of group-defined-in-image (50000).
	predefined := tree{}
	predefined.file("etc/passwd", 0o644, []byte(passwd+"default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n"))
	predefined.file("etc/group", 0o644, []byte(group+"default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"))
	predefined.dir("home/default-user", 0o755)
	predefined.owned("home/default-user", 1000, 1000)

	layers := map[string]layer{}
	for name, t := range map[string]tree{"base": base, "tools": tools, "nginx": nginx, "hostnet": hostnet, "nonewprivs": nonewprivs, "predefined": predefined} {
		if layers[name], err = t.layer(); err != nil {
			return nil, fmt.Errorf("layer %s: %w", name, err)
		}
	}
	var out []built
	add := func(config imgspecv1.ImageConfig, names []string, layerNames ...string) error {
		var ls []layer
		for _, n := range layerNames {
			ls = append(ls, layers[n])
		}
		img, err := image(config, ls...)
		if err != nil {
			return err
		}
		out = append(out, built{refs: names, image: img})
		return nil
	}
	if err := add(busyboxConfig, []string{Busybox}, "base", "tools"); err != nil {
		return nil, err
	}
	if err := add(nginxConfig, []string{Nginx}, "base", "nginx"); err != nil {
		return nil, err
	}
	if err := add(nginxConfig, []string{HostNetNginx}, "base", "nginx", "hostnet"); err != nil {
		return nil, err
	}
	nnpConfig := imgspecv1.ImageConfig{Env: []string{pathEnv}, Entrypoint: []string{"/usr/local/bin/nnp"}}
	if err := add(nnpConfig, []string{NoNewPrivs}, "base", "nonewprivs"); err != nil {
		return nil, err
	}
	predefinedConfig := imgspecv1.ImageConfig{Env: []string{pathEnv}, Cmd: []string{"sh"}, User: "1000"}
	if err := add(predefinedConfig, []string{PredefinedGrp}, "base", "predefined"); err != nil {
		return nil, err
	}
	for name, user := range imageUsers {
		userConfig := imgspecv1.ImageConfig{Env: []string{pathEnv}, Cmd: []string{"sh"}, User: user}
		if err := add(userConfig, []string{criTools + name + ":latest"}, "base"); err != nil {
			return nil, err
		}
	}
	byFile := map[string][]string{}
	for ref, file := range testImages {
		byFile[file] = append(byFile[file], ref)
	}
	for file, refs := range byFile {
		t := tree{}
		t.file(file, 0o644, nil)
		l, err := t.layer()
		if err != nil {
			return nil, err
		}
		img, err := image(busyboxConfig, layers["base"], l)
		if err != nil {
			return nil, err
		}
		sort.Strings(refs)
		out = append(out, built{refs: refs, image: img})
	}
	return out, nil
}

// addLibraries adds the libraries bins need that lower, the layer below,
// does not have.
func (t tree) addLibraries(lower tree, bins ...[]byte) error {
	libs, err := sharedLibraries(bins...)
	if err != nil {
		return err
	}
	for p, e := range libs {
		if l, ok := lower[p]; ok && l.link == e.link && string(l.data) == string(e.data) {
			continue
		}
		t[p] = e
	}
	return nil
}

const nginxConf = `user  nginx;
worker_processes  1;

error_log  /var/log/nginx/error.log notice;
pid        /var/run/nginx.pid;

events {
    worker_connections  1024;
}

http {
    include       /etc/nginx/mime.types;
    default_type  application/octet-stream;
    access_log    /var/log/nginx/access.log;
    sendfile      on;
    keepalive_timeout  65;
    include /etc/nginx/conf.d/*.conf;
}
`

const mimeTypes = `types {
    text/html   html htm;
    text/plain  txt;
}
`

func serverConf(port int) string {
	return fmt.Sprintf(`server {
    listen       %d;
    server_name  localhost;

    location / {
        root   /usr/share/nginx/html;
        index  index.html;
    }

    error_page   500 502 503 504  /50x.html;
    location = /50x.html {
        root   /usr/share/nginx/html;
    }
}
`, port)
}

const welcome = `<!DOCTYPE html>
<html>
<head><title>Welcome to nginx!</title></head>
<body><h1>Welcome to nginx!</h1></body>
</html>
`
