package checkpointarchive

import (
	"archive/tar"
	"fmt"
	"io"
	"path"
	"strings"
)

// ImageAnnotation marks an OCI image made from a container checkpoint:
// CRI-O restores from an image whose manifest carries it, and whose one
// layer holds the checkpoint archive's files (as `buildah add` of the
// archive and `buildah commit` make it).
const ImageAnnotation = "io.kubernetes.cri-o.annotations.checkpoint.name"

// FromLayer writes to w the checkpoint archive whose files the image
// layer r (an uncompressed tar) holds: the members a VM checkpoint has,
// named as the archive names them ("./" and the layer's root directory
// go), with their contents and nothing of their owners or modes. The
// layer comes from a registry and is untrusted: any other member (a
// whiteout, a link, a device, a file a checkpoint does not have), a
// sparse or duplicated one, is refused by name.
func FromLayer(r io.Reader, w io.Writer) error {
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read the checkpoint image's layer: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." || name == "/" {
			continue // the layer's root
		}
		if h.Typeflag == tar.TypeDir {
			name += "/"
		}
		ok, dir := member(name)
		switch {
		case !ok:
			return fmt.Errorf("the checkpoint image's layer holds %q, which is not part of a VM checkpoint", h.Name)
		case dir && h.Typeflag != tar.TypeDir, !dir && h.Typeflag != tar.TypeReg:
			return fmt.Errorf("the checkpoint image's layer holds %q of type %q, not a %s", h.Name, h.Typeflag, map[bool]string{true: "directory", false: "regular file"}[dir])
		case seen[name]:
			return fmt.Errorf("the checkpoint image's layer holds %q twice", h.Name)
		case h.Size < 0 || h.Size > maxArchiveMember:
			return fmt.Errorf("the checkpoint image's layer holds %q of size %d", h.Name, h.Size)
		case sparse(h):
			return fmt.Errorf("the checkpoint image's layer holds %q as a sparse file", h.Name)
		}
		seen[name] = true
		out := &tar.Header{Name: name, Typeflag: h.Typeflag, Mode: archiveFileMode, Size: h.Size, ModTime: h.ModTime}
		if dir {
			out.Mode, out.Size = archiveDirMode, 0
		}
		if err := tw.WriteHeader(out); err != nil {
			return err
		}
		if !dir {
			if _, err := io.CopyN(tw, tr, h.Size); err != nil {
				return fmt.Errorf("copy %s from the checkpoint image's layer: %w", name, err)
			}
		}
	}
	if !seen[VirtletMetaFile] {
		return fmt.Errorf("the checkpoint image's layer has no %s: it is not a checkpoint of a VM", VirtletMetaFile)
	}
	return tw.Close()
}
