package critestimages

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"io"
	"os"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// readLayer lists a layer's entries in order, with their contents.
func readLayer(t *testing.T, l layer) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(l.gz))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if got := digest.FromBytes(plain); got != l.diffID {
		t.Errorf("diffID %s, the uncompressed tar's digest is %s", l.diffID, got)
	}
	var headers []*tar.Header
	data := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(plain))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		headers = append(headers, h)
		data[h.Name], _ = io.ReadAll(tr)
	}
	return headers, data
}

func TestLayerOrderModesAndLinks(t *testing.T) {
	tr := tree{}
	tr.file("bin/busybox", 0o755, []byte("elf"))
	tr.hardlink("bin/[", "/bin/busybox") // sorts before its target
	tr.hardlink("bin/ls", "bin/busybox")
	tr.file("usr/local/bin/nnp", 0o4755, []byte("setuid"))
	tr.symlink("var/run", "../run")
	tr.dir("tmp", 0o1777)
	tr.dir("home/default-user", 0o755)
	tr.owned("home/default-user", 1000, 1000)
	l, err := tr.layer()
	if err != nil {
		t.Fatal(err)
	}
	again, err := tr.layer()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(l.gz, again.gz) {
		t.Error("the same tree made two different layers")
	}
	headers, data := readLayer(t, l)
	seen := map[string]bool{}
	byName := map[string]*tar.Header{}
	for _, h := range headers {
		byName[h.Name] = h
		if parent := parentDir(h.Name); parent != "" && !seen[parent] {
			t.Errorf("%s comes before its directory %s", h.Name, parent)
		}
		if h.Typeflag == tar.TypeLink && !seen[h.Linkname] {
			t.Errorf("hard link %s comes before %s", h.Name, h.Linkname)
		}
		if !h.ModTime.Equal(layerModTime) {
			t.Errorf("%s: modification time %s", h.Name, h.ModTime)
		}
		seen[h.Name] = true
	}
	for name, want := range map[string]struct {
		typeflag byte
		mode     int64
		uid      int
		link     string
	}{
		"bin/":               {tar.TypeDir, 0o755, 0, ""},
		"usr/local/":         {tar.TypeDir, 0o755, 0, ""},
		"tmp/":               {tar.TypeDir, 0o1777, 0, ""},
		"home/default-user/": {tar.TypeDir, 0o755, 1000, ""},
		"bin/busybox":        {tar.TypeReg, 0o755, 0, ""},
		"bin/[":              {tar.TypeLink, 0o755, 0, "bin/busybox"},
		"bin/ls":             {tar.TypeLink, 0o755, 0, "bin/busybox"},
		"usr/local/bin/nnp":  {tar.TypeReg, 0o4755, 0, ""},
		"var/run":            {tar.TypeSymlink, 0o777, 0, "../run"},
	} {
		h := byName[name]
		if h == nil {
			t.Errorf("%s is not in the layer", name)
			continue
		}
		if h.Typeflag != want.typeflag || h.Mode != want.mode || h.Uid != want.uid || h.Linkname != want.link {
			t.Errorf("%s: type %q mode %o uid %d link %q, want type %q mode %o uid %d link %q",
				name, h.Typeflag, h.Mode, h.Uid, h.Linkname, want.typeflag, want.mode, want.uid, want.link)
		}
	}
	if string(data["usr/local/bin/nnp"]) != "setuid" {
		t.Errorf("nnp holds %q", data["usr/local/bin/nnp"])
	}
}

func parentDir(name string) string {
	name = clean(name)
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			return name[:i+1]
		}
	}
	return ""
}

func TestHardLinkToAFileOutsideTheLayerIsRefused(t *testing.T) {
	tr := tree{}
	tr.hardlink("bin/ls", "bin/busybox")
	if _, err := tr.layer(); err == nil {
		t.Fatal("a hard link to a file the layer lacks was written")
	}
}

// The libraries of util-linux's ipcs are where Debian keeps them, the
// loader executable and named by the path ipcs asks for.
func TestSharedLibrariesOfADebianBinary(t *testing.T) {
	ipcs, err := os.ReadFile("/usr/bin/ipcs")
	if err != nil {
		t.Skip("no ipcs on this host:", err)
	}
	libs, err := sharedLibraries(ipcs)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(ipcs))
	if err != nil {
		t.Fatal(err)
	}
	needed, _ := f.ImportedLibraries()
	for _, soname := range needed {
		if e, ok := libs["lib/x86_64-linux-gnu/"+soname]; !ok || e.typeflag != tar.TypeReg || len(e.data) == 0 {
			t.Errorf("%s (DT_NEEDED of ipcs) missing: %+v", soname, ok)
		}
	}
	interp, ok := libs["lib64/ld-linux-x86-64.so.2"]
	if !ok || interp.typeflag != tar.TypeSymlink || interp.link != "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" {
		t.Fatalf("the loader's path: %+v", interp)
	}
	loader := libs["lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"]
	if loader.typeflag != tar.TypeReg || loader.mode&0o111 == 0 {
		t.Errorf("the loader is not an executable file: type %q mode %o", loader.typeflag, loader.mode)
	}
	if _, err := tree(libs).layer(); err != nil {
		t.Errorf("the libraries make no layer: %v", err)
	}
}
