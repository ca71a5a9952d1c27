// Package debs fetches Debian packages for the tests without installing
// them: apt's candidate version of a package (its local lists, no network),
// its .deb downloaded with `apt-get download` into a cache directory and
// checked against the SHA256 of apt's lists, and files read out of it. The
// critest image stand-ins (testing/critestimages) are built from such
// files, and Debian's containerd and runc run from them (Programs).
package debs

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/virtlet/virtlet/plugins/manifest"
)

// Package is the candidate version of a Debian package, as apt knows it.
type Package struct {
	Name, Version string
	SHA256        string // of the .deb, from apt's lists
	Filename      string // the .deb's base name in the archive
}

// Candidate asks apt (its local lists, no network) for the version of name
// it would install.
func Candidate(name string) (Package, error) {
	out, err := exec.Command("apt-cache", "show", "--no-all-versions", name).Output()
	if err != nil {
		return Package{}, fmt.Errorf("apt-cache show %s: %w", name, err)
	}
	p := Package{Name: name}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		switch k {
		case "Version":
			p.Version = v
		case "SHA256":
			p.SHA256 = v
		case "Filename":
			p.Filename = path.Base(v)
		}
	}
	if p.Version == "" || p.SHA256 == "" || p.Filename == "" {
		return Package{}, fmt.Errorf("apt-cache show %s: no version, SHA256 or file name in its record", name)
	}
	return p, nil
}

// Fetch returns the path of p's .deb under dir, downloading it with
// apt-get download (not installing it) when dir does not hold it yet; the
// file is checked against the SHA256 of apt's lists either way. A download
// replaces the package's other versions there.
func Fetch(dir string, p Package) (string, error) {
	dest := filepath.Join(dir, p.Filename)
	if sum, err := manifest.FileSHA256(dest); err == nil && sum == p.SHA256 {
		return dest, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "download-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("apt-get", "download", "-q", p.Name+"="+p.Version)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get download %s=%s: %w\n%s", p.Name, p.Version, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s=%s left %d .deb files", p.Name, p.Version, len(debs))
	}
	got, err := manifest.FileSHA256(debs[0])
	if err != nil {
		return "", err
	}
	if got != p.SHA256 {
		return "", fmt.Errorf("%s: SHA256 %s, apt's lists say %s", debs[0], got, p.SHA256)
	}
	if err := os.Rename(debs[0], dest); err != nil {
		return "", err
	}
	// Other versions of the package are of no more use.
	olds, _ := filepath.Glob(filepath.Join(dir, p.Name+"_*.deb"))
	for _, old := range olds {
		if old != dest {
			os.Remove(old)
		}
	}
	return dest, nil
}

// Files reads the named files (paths as the package installs them, such
// as /usr/sbin/nginx) out of a .deb.
func Files(deb string, names ...string) (map[string][]byte, error) {
	files := map[string][]byte{}
	err := walk(deb, names, func(name string, r io.Reader) error {
		data, err := io.ReadAll(r)
		files[name] = data
		return err
	})
	return files, err
}

// walk calls fn with each named regular file of a .deb (its name as given
// in names, and its content), and fails when one is missing.
func walk(deb string, names []string, fn func(name string, r io.Reader) error) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", deb, err)
	}
	want := map[string]string{} // path in the archive → name as given
	for _, n := range names {
		want[clean(n)] = n
	}
	seen := map[string]bool{}
	tr := tar.NewReader(out)
	var rerr error
	for {
		h, err := tr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				rerr = err
			}
			break
		}
		if name, ok := want[clean(h.Name)]; ok && h.Typeflag == tar.TypeReg {
			if err := fn(name, tr); err != nil {
				rerr = fmt.Errorf("%s: %w", name, err)
				break
			}
			seen[name] = true
		}
	}
	io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, stderr.String())
	}
	if rerr != nil {
		return fmt.Errorf("%s: %w", deb, rerr)
	}
	for _, n := range names {
		if !seen[n] {
			return fmt.Errorf("%s has no file %s", deb, n)
		}
	}
	return nil
}

// Programs returns a directory holding the named programs of Debian
// packages (package → the paths it installs them at: runc →
// /usr/sbin/runc), each under its base name, at apt's candidate versions.
// The directory is below dir and named by the packages' versions; it is
// made once from the .deb files (fetched into debsDir as Fetch does), and
// found again while the candidates stay the same. dir keeps the current
// versions only.
func Programs(dir, debsDir string, programs map[string][]string) (string, error) {
	names := make([]string, 0, len(programs))
	for name := range programs {
		names = append(names, name)
	}
	sort.Strings(names)
	pkgs := make([]Package, 0, len(names))
	for _, name := range names {
		p, err := Candidate(name)
		if err != nil {
			return "", err
		}
		pkgs = append(pkgs, p)
	}
	out := filepath.Join(dir, versionsKey(pkgs))
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "extract-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, p := range pkgs {
		deb, err := Fetch(debsDir, p)
		if err != nil {
			return "", err
		}
		if err := extract(tmp, deb, programs[p.Name]); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, out); err != nil {
		if _, serr := os.Stat(out); serr != nil {
			return "", fmt.Errorf("programs of %s: %w", strings.Join(names, ", "), err)
		}
		// Another extraction of the same versions finished first.
	}
	olds, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, old := range olds {
		if old != out && !strings.HasPrefix(filepath.Base(old), "extract-") {
			os.RemoveAll(old)
		}
	}
	return out, nil
}

// versionsKey names a set of packages by their names and versions, as a
// file name that can stand in PATH (an epoch's colon is escaped).
func versionsKey(pkgs []Package) string {
	parts := make([]string, len(pkgs))
	for i, p := range pkgs {
		parts[i] = p.Name + "_" + strings.ReplaceAll(p.Version, ":", "%3A")
	}
	return strings.Join(parts, ",")
}

// extract writes the named files of a .deb into dir under their base
// names, executable.
func extract(dir, deb string, names []string) error {
	return walk(deb, names, func(name string, r io.Reader) error {
		f, err := os.OpenFile(filepath.Join(dir, path.Base(name)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
}

func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }
