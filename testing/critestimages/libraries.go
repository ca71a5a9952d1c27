package critestimages

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

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
