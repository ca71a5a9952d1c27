package critestimages

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
)

// entry is one file of a layer.
type entry struct {
	typeflag byte  // tar.TypeReg, TypeDir, TypeSymlink or TypeLink
	mode     int64 // permissions with the setuid, setgid and sticky bits
	uid, gid int
	data     []byte
	link     string // a symlink's target, or the path a hard link names
}

// tree is the content of a layer: path (relative to /, no leading slash) →
// entry. Parent directories that are not listed are made 0755, root's.
type tree map[string]entry

func (t tree) dir(p string, mode int64) {
	t[clean(p)] = entry{typeflag: tar.TypeDir, mode: mode}
}

func (t tree) file(p string, mode int64, data []byte) {
	t[clean(p)] = entry{typeflag: tar.TypeReg, mode: mode, data: data}
}

// owned sets the owner of p, which must be in t.
func (t tree) owned(p string, uid, gid int) {
	e := t[clean(p)]
	e.uid, e.gid = uid, gid
	t[clean(p)] = e
}

func (t tree) symlink(p, target string) {
	t[clean(p)] = entry{typeflag: tar.TypeSymlink, mode: 0o777, link: target}
}

// hardlink makes p another name of target, a file of the same layer.
func (t tree) hardlink(p, target string) {
	t[clean(p)] = entry{typeflag: tar.TypeLink, mode: 0o755, link: clean(target)}
}

func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// layerModTime is every entry's modification time: a layer depends on its
// content only.
var layerModTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// layer is a tree as an image layer.
type layer struct {
	gz     []byte        // the gzip-compressed tar, as registries store it
	diffID digest.Digest // the digest of the uncompressed tar
}

// layer writes t as a tar in path order (hard links last) and compresses
// it; the same tree always gives the same bytes.
func (t tree) layer() (layer, error) {
	all := map[string]entry{}
	for p, e := range t {
		all[p] = e
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := t[d]; !ok {
				all[d] = entry{typeflag: tar.TypeDir, mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	// Parents before children; hard links after the files they name.
	sort.SliceStable(paths, func(i, j int) bool {
		li, lj := all[paths[i]].typeflag == tar.TypeLink, all[paths[j]].typeflag == tar.TypeLink
		if li != lj {
			return lj
		}
		return paths[i] < paths[j]
	})
	var plain bytes.Buffer
	tw := tar.NewWriter(&plain)
	for _, p := range paths {
		e := all[p]
		h := &tar.Header{Typeflag: e.typeflag, Name: p, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: layerModTime, Format: tar.FormatPAX}
		switch e.typeflag {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeReg:
			h.Size = int64(len(e.data))
		case tar.TypeSymlink:
			h.Linkname = e.link
		case tar.TypeLink:
			target, ok := all[e.link]
			if !ok || target.typeflag != tar.TypeReg {
				return layer{}, fmt.Errorf("hard link %s: %s is not a file of the layer", p, e.link)
			}
			h.Linkname = e.link
		default:
			return layer{}, fmt.Errorf("%s: unsupported entry type %q", p, e.typeflag)
		}
		if err := tw.WriteHeader(h); err != nil {
			return layer{}, fmt.Errorf("layer entry %s: %w", p, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return layer{}, fmt.Errorf("layer entry %s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return layer{}, err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(plain.Bytes()); err != nil {
		return layer{}, err
	}
	if err := zw.Close(); err != nil {
		return layer{}, err
	}
	return layer{gz: gz.Bytes(), diffID: digest.FromBytes(plain.Bytes())}, nil
}
