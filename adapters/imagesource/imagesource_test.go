package imagesource_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/imagesource"
	"github.com/virtlet/virtlet/plugins/image"
	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/imagesourcetest"
	"github.com/virtlet/virtlet/testing/harness"
	"github.com/virtlet/virtlet/testing/imageserver"
)

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// serve starts the test image server over a directory holding a real qcow2
// image, an HTML page and a raw disk; it returns a source that trusts its CA.
func serve(t *testing.T) (*imageserver.Server, *imagesource.Source) {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(dir, "disk.qcow2"), "48M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	// An image whose data is a host file (refused by diskimage before any
	// tool reads it) and one whose refcounts are zeroed (refused by
	// qemu-img check).
	// (qemu-img create makes the data file it is given, truncating it: it
	// must be the test's own.)
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-o", "data_file="+filepath.Join(t.TempDir(), "host-file")+",data_file_raw=on",
		filepath.Join(dir, "datafile.qcow2"), "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	corrupt := filepath.Join(dir, "corrupt.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", corrupt, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	data, _ := os.ReadFile(corrupt)
	table := binary.BigEndian.Uint64(data[48:56])
	block := binary.BigEndian.Uint64(data[table : table+8])
	copy(data[block:block+8], make([]byte, 8))
	os.WriteFile(corrupt, data, 0o644)
	os.WriteFile(filepath.Join(dir, "index.html"), []byte("<html>hello</html>"), 0o644)
	os.WriteFile(filepath.Join(dir, "page.html"), []byte("<html>not a disk</html>"), 0o644)
	srv, err := imageserver.Start(dir, "127.0.0.1:0", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	s := imagesource.New(quiet())
	cfg, _ := json.Marshal(imagesource.Config{CAFiles: []string{srv.CAFile}})
	if err := s.Configure(context.Background(), ports.PluginConfig{Config: cfg}); err != nil {
		t.Fatal(err)
	}
	return srv, s
}

func TestContract(t *testing.T) {
	srv, s := serve(t)
	e := imagesourcetest.Env{Location: "https://" + srv.Host + "/disk.qcow2", Missing: "https://" + srv.Host + "/absent.qcow2"}
	t.Run("in process", func(t *testing.T) {
		e.Source = s
		imagesourcetest.Run(t, e)
	})
	t.Run("over gRPC", func(t *testing.T) {
		e.Source = image.NewClient(sdktest.Conn(t, s))
		imagesourcetest.Run(t, e)
	})
}

func TestFetchReportsFormatAndVirtualSize(t *testing.T) {
	srv, s := serve(t)
	res, err := s.Fetch(context.Background(), ports.FetchRequest{Name: "x", Location: "https://" + srv.Host + "/disk.qcow2", Dest: filepath.Join(harness.SearchableTempDir(t), "d")})
	if err != nil || res.Format != "qcow2" || res.VirtualSize != 48<<20 {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestFetchErrors(t *testing.T) {
	srv, s := serve(t)
	truncated := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		w.Write([]byte("QFI\xfb partial"))
	}))
	defer truncated.Close()
	failing := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "backend down", http.StatusBadGateway)
	}))
	defer failing.Close()
	untrusted := imagesource.New(quiet()) // system CAs only
	base := "https://" + srv.Host
	for _, tt := range []struct {
		name     string
		src      *imagesource.Source
		location string
		digest   string
		kind     error
		want     string
	}{
		{"404", s, base + "/absent.qcow2", "", ports.ErrNotFound, "404 Not Found"},
		{"html page", s, base + "/page.html", "", ports.ErrInvalidArgument, "not a VM disk image: neither a qcow2 header nor a partition table"},
		{"data in a host file", s, base + "/datafile.qcow2", "", ports.ErrInvalidArgument, "not a VM disk image: the qcow2 image keeps its data in an external data file"},
		{"corrupt qcow2", s, base + "/corrupt.qcow2", "", ports.ErrInvalidArgument, "not a VM disk image: qemu-img check found"},
		{"untrusted certificate", untrusted, base + "/disk.qcow2", "", nil, "certificate signed by unknown authority"},
		{"ftp", s, "ftp://" + srv.Host + "/disk.qcow2", "", ports.ErrInvalidArgument, "an https://, http://, file://, docker:// or oci: location"},
		{"digest mismatch", s, base + "/disk.qcow2", "sha256:" + strings.Repeat("1", 64), ports.ErrInvalidArgument, "digest mismatch"},
		{"server error", trusting(t, failing), failing.URL + "/x", "", ports.ErrUnavailable, "502 Bad Gateway"},
		{"connection refused", s, "https://127.0.0.1:1/x", "", nil, "connection refused"},
		{"truncated", trusting(t, truncated), truncated.URL + "/x", "", nil, "truncated: got 12 of 100000 bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.src.Fetch(context.Background(), ports.FetchRequest{Name: "x", Location: tt.location, Dest: filepath.Join(harness.SearchableTempDir(t), "d"), ExpectedDigest: tt.digest})
			if err == nil || !strings.Contains(err.Error(), tt.want) || (tt.kind != nil && !errors.Is(err, tt.kind)) {
				t.Fatalf("err %v, want %v containing %q", err, tt.kind, tt.want)
			}
			if strings.Contains(err.Error(), "?") {
				t.Fatalf("error leaks a query string: %v", err)
			}
		})
	}
}

func TestBadConfig(t *testing.T) {
	s := imagesource.New(quiet())
	for _, cfg := range []string{`{"caFile": "x"}`, `{"caFiles": ["/nonexistent"]}`, `{"progressInterval": "often"}`} {
		if err := s.Configure(context.Background(), ports.PluginConfig{Config: []byte(cfg)}); !errors.Is(err, ports.ErrInvalidArgument) {
			t.Errorf("%s: %v", cfg, err)
		}
	}
}

// The node's limits: an image larger than maxImageSize is refused before
// its download when its size is known, and as the download passes it when
// not (a chunked answer); a download that would leave the store's file
// system less than keepFreeSpace is refused.
func TestFetchLimits(t *testing.T) {
	srv, s := serve(t)
	chunked := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 64; i++ {
			w.Write(make([]byte, 1024))
			w.(http.Flusher).Flush()
		}
	}))
	defer chunked.Close()
	for _, tt := range []struct {
		name          string
		src           *imagesource.Source
		location      string
		maxBytes      int64
		keepFreeBytes int64
		kind          error
		want          string
	}{
		{"size known", s, "https://" + srv.Host + "/disk.qcow2", 1000, 0, ports.ErrInvalidArgument, "more than the 1000 the node allows an image (maxImageSize)"},
		{"size unknown", trusting(t, chunked), chunked.URL + "/x", 1000, 0, ports.ErrInvalidArgument, "more than the 1000 bytes the node allows an image (maxImageSize)"},
		{"free space", s, "https://" + srv.Host + "/disk.qcow2", 0, 1 << 60, ports.ErrUnavailable, "(keepFreeSpace)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.src.Fetch(context.Background(), ports.FetchRequest{Name: "x", Location: tt.location,
				Dest: filepath.Join(harness.SearchableTempDir(t), "d"), MaxBytes: tt.maxBytes, KeepFreeBytes: tt.keepFreeBytes})
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want %v containing %q", err, tt.kind, tt.want)
			}
		})
	}
	// Within the limits, the same download passes.
	if _, err := s.Fetch(context.Background(), ports.FetchRequest{Name: "x", Location: "https://" + srv.Host + "/disk.qcow2",
		Dest: filepath.Join(harness.SearchableTempDir(t), "d"), MaxBytes: 1 << 30, KeepFreeBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
}
