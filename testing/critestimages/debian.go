package critestimages

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// debPackage is the candidate version of a Debian package, as apt knows it.
type debPackage struct {
	name, version, sha256, filename string
}

// candidate asks apt (its local lists, no network) for the version of name
// it would install.
func candidate(name string) (debPackage, error) {
	out, err := exec.Command("apt-cache", "show", "--no-all-versions", name).Output()
	if err != nil {
		return debPackage{}, fmt.Errorf("apt-cache show %s: %w", name, err)
	}
	p := debPackage{name: name}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		switch k {
		case "Version":
			p.version = v
		case "SHA256":
			p.sha256 = v
		case "Filename":
			p.filename = path.Base(v)
		}
	}
	if p.version == "" || p.sha256 == "" || p.filename == "" {
		return debPackage{}, fmt.Errorf("apt-cache show %s: no version, SHA256 or file name in its record", name)
	}
	return p, nil
}

// fetchDeb returns the path of p's .deb under dir, downloading it with
// apt-get download (not installing it) when dir does not hold it yet; the
// file is checked against the SHA256 of apt's lists either way. A download
// replaces the package's other versions there.
func fetchDeb(dir string, p debPackage) (string, error) {
	dest := filepath.Join(dir, p.filename)
	if data, err := os.ReadFile(dest); err == nil && sha256Hex(data) == p.sha256 {
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
	cmd := exec.Command("apt-get", "download", "-q", p.name+"="+p.version)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get download %s=%s: %w\n%s", p.name, p.version, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s=%s left %d .deb files", p.name, p.version, len(debs))
	}
	data, err := os.ReadFile(debs[0])
	if err != nil {
		return "", err
	}
	if got := sha256Hex(data); got != p.sha256 {
		return "", fmt.Errorf("%s: SHA256 %s, apt's lists say %s", debs[0], got, p.sha256)
	}
	if err := os.Rename(debs[0], dest); err != nil {
		return "", err
	}
	// Other versions of the package are of no more use.
	olds, _ := filepath.Glob(filepath.Join(dir, p.name+"_*.deb"))
	for _, old := range olds {
		if old != dest {
			os.Remove(old)
		}
	}
	return dest, nil
}

// debFiles reads the named files (paths as the package installs them, such
// as /usr/sbin/nginx) out of a .deb.
func debFiles(deb string, names ...string) (map[string][]byte, error) {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", deb, err)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[clean(n)] = true
	}
	files := map[string][]byte{}
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
		if name := clean(h.Name); want[name] && h.Typeflag == tar.TypeReg {
			if files["/"+name], err = io.ReadAll(tr); err != nil {
				rerr = err
				break
			}
		}
	}
	io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, stderr.String())
	}
	if rerr != nil {
		return nil, fmt.Errorf("%s: %w", deb, rerr)
	}
	for _, n := range names {
		if _, ok := files["/"+clean(n)]; !ok {
			return nil, fmt.Errorf("%s has no file %s", deb, n)
		}
	}
	return files, nil
}

// libDirs are where Debian's multiarch libraries are, and where the images
// keep them (the dynamic loader searches there).
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"}

// sharedLibraries finds what the dynamically linked binaries need to run,
// in this host's Debian libraries: the libraries they name (DT_NEEDED),
// and the ones those name, at /lib/x86_64-linux-gnu/<soname>, and the
// dynamic loader at the path the binaries ask for (PT_INTERP), a symlink
// to its file there, as Debian lays them out.
func sharedLibraries(bins ...[]byte) (tree, error) {
	libs := tree{}
	queue := append([][]byte{}, bins...)
	for len(queue) > 0 {
		f, err := elf.NewFile(bytes.NewReader(queue[0]))
		if err != nil {
			return nil, fmt.Errorf("read ELF: %w", err)
		}
		queue = queue[1:]
		needed, err := f.ImportedLibraries()
		if err != nil {
			return nil, fmt.Errorf("read DT_NEEDED: %w", err)
		}
		for _, p := range f.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			raw, err := io.ReadAll(p.Open())
			if err != nil {
				return nil, fmt.Errorf("read PT_INTERP: %w", err)
			}
			interp := strings.TrimRight(string(raw), "\x00")
			if lib := path.Join(libDirs[0], path.Base(interp)); interp != lib {
				libs.symlink(interp, lib)
			}
			needed = append(needed, path.Base(interp))
		}
		for _, soname := range needed {
			lib := clean(path.Join(libDirs[0], soname))
			if _, ok := libs[lib]; ok {
				continue
			}
			data, mode, err := findLibrary(soname)
			if err != nil {
				return nil, err
			}
			libs.file(lib, mode, data)
			queue = append(queue, data)
		}
	}
	return libs, nil
}

// findLibrary reads a library and its permissions (the loader's include
// execute: the kernel checks it).
func findLibrary(soname string) ([]byte, int64, error) {
	for _, dir := range libDirs {
		p := filepath.Join(dir, soname)
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, 0, err
		}
		return data, int64(fi.Mode().Perm()), nil
	}
	return nil, 0, fmt.Errorf("library %s is in none of %v", soname, libDirs)
}

func sha256Hex(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}
