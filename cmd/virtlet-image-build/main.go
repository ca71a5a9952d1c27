// Command virtlet-image-build makes the node installer's OCI image without
// docker (`make image` runs it): one layer holding a `make install` staging
// tree at /opt/virtlet/stage and the static installer at
// /usr/bin/virtlet-installer, its entrypoint. The layer depends on its
// content only (sorted entries, fixed times, root's ownership), so the same
// build gives the same image digest. It writes the image to an OCI layout
// or a registry through containers/image.
//
//	virtlet-image-build --stage bin/image-stage --installer bin/virtlet-installer \
//	    --image-version v1 --dest docker://127.0.0.1:5000/virtlet/virtlet-node:v1 --insecure
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/containers/image/v5/types"
	digest "github.com/opencontainers/go-digest"
	imgspecv1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/virtlet/virtlet/deploy/ociimage"
	"github.com/virtlet/virtlet/plugins/buildinfo"
)

// Where the image keeps what it installs (cmd/virtlet-installer reads them
// there).
const (
	stageDir      = "opt/virtlet/stage"
	installerPath = "usr/bin/virtlet-installer"
)

// modTime is every entry's modification time: the layer depends on its
// content only.
var modTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func main() {
	stage := flag.String("stage", "", "a `make install DESTDIR=…` tree")
	installer := flag.String("installer", "", "the static virtlet-installer binary")
	version := flag.String("image-version", "", "the build's version, the image's version label")
	dest := flag.String("dest", "", "where the image goes: oci:DIR:TAG or docker://REGISTRY/REPO:TAG")
	insecure := flag.Bool("insecure", false, "a registry dest over plain HTTP or with an unverified certificate")
	printVersion := flag.Bool("version", false, "print this program's version")
	flag.Parse()
	if *printVersion {
		fmt.Println("virtlet-image-build", buildinfo.Version())
		return
	}
	if *stage == "" || *installer == "" || *dest == "" {
		fmt.Fprintln(os.Stderr, "virtlet-image-build: --stage, --installer and --dest are required")
		os.Exit(2)
	}
	d, err := build(context.Background(), *stage, *installer, *version, *dest, *insecure)
	if err != nil {
		fmt.Fprintln(os.Stderr, "virtlet-image-build:", err)
		os.Exit(1)
	}
	fmt.Printf("%s@%s\n", *dest, d)
}

func build(ctx context.Context, stage, installer, version, dest string, insecure bool) (digest.Digest, error) {
	plain, err := layerTar(stage, installer)
	if err != nil {
		return "", err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(plain); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	config, err := json.Marshal(imgspecv1.Image{
		Platform: imgspecv1.Platform{Architecture: "amd64", OS: "linux"},
		Config: imgspecv1.ImageConfig{
			Entrypoint: []string{"/" + installerPath},
			Env:        []string{"PATH=/usr/bin:/bin"},
			Labels: map[string]string{
				"org.opencontainers.image.title":   "virtlet-node",
				"org.opencontainers.image.version": version,
			},
		},
		RootFS: imgspecv1.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(plain)}},
	})
	if err != nil {
		return "", err
	}
	return write(ctx, dest, config, gz.Bytes(), insecure)
}

// layerTar is the image's one layer, uncompressed: the stage tree below
// stageDir and the installer.
func layerTar(stage, installer string) ([]byte, error) {
	type file struct {
		name string // in the layer
		src  string // "" for a directory
		mode fs.FileMode
		link string
	}
	var files []file
	err := filepath.WalkDir(stage, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(stage, p)
		name := filepath.ToSlash(filepath.Join(stageDir, rel))
		info, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case e.IsDir():
			files = append(files, file{name: name, mode: info.Mode().Perm()})
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			files = append(files, file{name: name, link: target})
		case info.Mode().IsRegular():
			files = append(files, file{name: name, src: p, mode: info.Mode().Perm()})
		default:
			return fmt.Errorf("%s: not a file, directory or symbolic link", p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stage %s: %w", stage, err)
	}
	files = append(files, file{name: "usr", mode: 0o755}, file{name: "usr/bin", mode: 0o755},
		file{name: installerPath, src: installer, mode: 0o755})
	for _, d := range []string{"opt", "opt/virtlet"} {
		files = append(files, file{name: d, mode: 0o755})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, f := range files {
		if seen[f.name] {
			continue
		}
		seen[f.name] = true
		h := &tar.Header{Name: f.name, Mode: int64(f.mode), ModTime: modTime, Format: tar.FormatPAX}
		var data []byte
		switch {
		case f.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.link, 0o777
		case f.src == "":
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
		default:
			b, err := os.ReadFile(f.src)
			if err != nil {
				return nil, err
			}
			data = b
			h.Typeflag, h.Size = tar.TypeReg, int64(len(b))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// write stores the image (config and one gzip layer) at dest and returns
// the manifest's digest.
func write(ctx context.Context, dest string, config, layer []byte, insecure bool) (digest.Digest, error) {
	sys := &types.SystemContext{}
	if insecure {
		sys.DockerInsecureSkipTLSVerify = types.OptionalBoolTrue
	}
	d, err := ociimage.Write(ctx, dest, ociimage.Image{Config: config, Layers: [][]byte{layer}}, sys)
	if err != nil {
		return "", fmt.Errorf("--dest %q: %w", dest, err)
	}
	return d, nil
}
