package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/testing/containerdisk"
	"github.com/virtlet/virtlet/testing/harness"
)

// sources serves the tiny image every way a node can get it: https
// (already, through the test image server), plain http, a file on the
// node, a container registry and an OCI layout; plus broken servers.
type sources struct {
	http     *httptest.Server
	registry *containerdisk.Registry
	layout   string
	file     string
}

func startSources(t *testing.T) *sources {
	t.Helper()
	data, err := os.ReadFile(tiny)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", http.FileServer(http.Dir(imgDir)))
	mux.HandleFunc("/truncated.qcow2", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(data)))
		w.Write(data[:len(data)/2])
	})
	mux.HandleFunc("/empty.img", func(w http.ResponseWriter, r *http.Request) {})
	// Images that would make QEMU open a host file: a backing file naming
	// /etc/shadow (-u: qemu-img does not open it), an external data file
	// (qemu-img makes the one it is given: the test's own).
	dir := t.TempDir()
	for name, args := range map[string][]string{
		"backing.qcow2":  {"-u", "-F", "raw", "-b", "/etc/shadow"},
		"datafile.qcow2": {"-o", "data_file=" + filepath.Join(dir, "host-file") + ",data_file_raw=on"},
	} {
		img := filepath.Join(dir, name)
		if out, err := exec.Command("qemu-img", append(append([]string{"create", "-q", "-f", "qcow2"}, args...), img, "1M")...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v %s", err, out)
		}
		mux.HandleFunc("/"+name, func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, img) })
	}
	mux.HandleFunc("/corrupt.qcow2", func(w http.ResponseWriter, r *http.Request) {
		bad := append([]byte(nil), data[:4096]...)
		bad[7] = 42 // qcow2 version 42
		w.Write(bad)
	})
	s := &sources{http: httptest.NewServer(mux), file: filepath.Join(t.TempDir(), "tiny.qcow2")}
	t.Cleanup(s.http.Close)
	os.WriteFile(s.file, data, 0o644)
	if s.registry, err = containerdisk.StartRegistry(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.registry.Close)
	files, _ := containerdisk.DiskFiles(tiny, "tiny.qcow2")
	ctx := context.Background()
	if err := containerdisk.Push(ctx, "docker://"+s.registry.Addr+"/disks/tiny:v1", files, true); err != nil {
		t.Fatal(err)
	}
	if err := containerdisk.Push(ctx, "docker://"+s.registry.Addr+"/disks/not-a-disk:v1", containerdisk.Files{"etc/motd": []byte("hi")}, true); err != nil {
		t.Fatal(err)
	}
	s.layout = t.TempDir()
	if err := containerdisk.Push(ctx, "oci:"+s.layout+":v1", files, false); err != nil {
		t.Fatal(err)
	}
	return s
}

// translation names each source; the registry through a prefix rule.
func (s *sources) translation() string {
	return fmt.Sprintf(`translations:
- name: tiny-http
  url: %[1]s/tiny.qcow2
- name: tiny-file
  url: file://%[2]s
- name: tiny-oci
  url: oci:%[3]s
- regexp: 'disks/(.*)'
  url: docker://%[4]s/disks/$1
  transport: plain-registry
- name: missing
  url: %[1]s/missing.qcow2
- name: truncated
  url: %[1]s/truncated.qcow2
- name: empty
  url: %[1]s/empty.img
- name: corrupt
  url: %[1]s/corrupt.qcow2
- name: backing
  url: %[1]s/backing.qcow2
- name: datafile
  url: %[1]s/datafile.qcow2
- name: refused
  url: http://127.0.0.1:1/x.qcow2
- name: untrusted
  url: https://%[5]s/tiny.qcow2
transports:
  plain-registry: {tls: {insecure: true}}
`, s.http.URL, s.file, s.layout, s.registry.Addr, images.Host)
}

func storeFiles(d *harness.Daemon) []string {
	var out []string
	for _, sub := range []string{"sha256", "tmp"} {
		entries, _ := os.ReadDir(filepath.Join(d.StateDir, "images", sub))
		for _, e := range entries {
			out = append(out, sub+"/"+e.Name())
		}
	}
	return out
}

// A VM boots from each kind of image source, and crictl shows the images.
func TestVMBootsFromEverySourceKind(t *testing.T) {
	parallel(t)
	src := startSources(t)
	d, c := startDaemon(t)
	d.Translate("sources.yaml", src.translation())
	digest := containerdisk.Sum(mustRead(t, tiny))
	for _, tc := range []struct{ kind, image string }{
		{"https", "virtlet.cloud/tiny"},
		{"http", "virtlet.cloud/tiny-http"},
		{"file", "virtlet.cloud/tiny-file"},
		{"registry", "virtlet.cloud/disks/tiny:v1"},
		{"oci layout", "virtlet.cloud/tiny-oci:v1"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			if out := c.Must(t, "pull", tc.image); !strings.Contains(out, digest) {
				t.Fatalf("pull: %s, want %s", out, digest)
			}
			var inspect struct {
				Status struct {
					ID       string   `json:"id"`
					RepoTags []string `json:"repoTags"`
					Size     string   `json:"size"`
				} `json:"status"`
			}
			c.JSON(t, &inspect, "inspecti", tc.image)
			if inspect.Status.ID != digest || inspect.Status.Size != fmt.Sprint(len(mustRead(t, tiny))) {
				t.Fatalf("inspecti: %+v", inspect.Status)
			}
			if images := c.Must(t, "images"); !strings.Contains(images, strings.SplitN(tc.image, ":", 2)[0]) {
				t.Fatalf("crictl images lacks %s:\n%s", tc.image, images)
			}
			name := "vm-" + strings.NewReplacer(" ", "-").Replace(tc.kind)
			podJSON, _ := vmPod(t, d, name, nil, 128<<20)
			ctrJSON := harness.WriteJSON(t, d.Dir, name+"-ctr.json", map[string]interface{}{
				"metadata": map[string]string{"name": name}, "image": map[string]string{"image": tc.image}, "log_path": name + "/0.log",
				"linux": map[string]interface{}{"resources": map[string]interface{}{"memory_limit_in_bytes": 128 << 20}},
			})
			sb, _, _ := bootTiny(t, c, podJSON, ctrJSON)
			// The image cannot go while the VM's root disk is backed by it.
			if _, errOut, err := c.Run("rmi", tc.image); err == nil || !strings.Contains(errOut, "in use by the VM of pod default/"+name) {
				t.Fatalf("rmi of an image in use: %v %s", err, errOut)
			}
			c.Must(t, "rmp", "-f", sb)
		})
	}
	var fs struct {
		Status struct {
			ImageFilesystems []struct {
				UsedBytes struct {
					Value string `json:"value"`
				} `json:"usedBytes"`
			} `json:"imageFilesystems"`
		} `json:"status"`
	}
	c.JSON(t, &fs, "imagefsinfo")
	if used, _ := strconv.Atoi(fs.Status.ImageFilesystems[0].UsedBytes.Value); used < len(mustRead(t, tiny)) {
		t.Errorf("imagefsinfo reports %d bytes used for a %d-byte image", used, len(mustRead(t, tiny)))
	}
	// Every name refers to the one stored file; rmi of the ID removes it.
	if files := storeFiles(d); len(files) != 1 || files[0] != "sha256/"+strings.TrimPrefix(digest, "sha256:") {
		t.Fatalf("store: %v", files)
	}
	c.Must(t, "rmi", digest)
	if out := c.Must(t, "images", "-q"); out != "" || len(storeFiles(d)) != 0 {
		t.Fatalf("after rmi: images %q, store %v", out, storeFiles(d))
	}
	assertNothingLeft(t, d, c)
}

// Bad pulls fail with clear errors and leave nothing in the store.
func TestBadPullsLeaveNothing(t *testing.T) {
	parallel(t)
	src := startSources(t)
	d, c := startDaemon(t)
	d.Translate("sources.yaml", src.translation())
	d.Translate("zz-broken.yaml", "translations:\n- name: x\n  url: https://example.com/x\n  transport: nowhere\n")
	// A registry that lies, in front of the honest one (containerdisk.Liar).
	liar := containerdisk.NewLiar(src.registry.Addr)
	t.Cleanup(liar.Close)
	tiny, err := liar.Manifest("disks/tiny", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if liar.Swap, err = liar.Manifest("disks/not-a-disk", "v1"); err != nil {
		t.Fatal(err)
	}
	d.Translate("lying.yaml", fmt.Sprintf("translations:\n- regexp: 'lying/(.*)'\n  url: docker://%s/$1\n  transport: plain\ntransports:\n  plain: {tls: {insecure: true}}\n", liar.Addr))
	for _, tc := range []struct{ image, want string }{
		{"virtlet.cloud/missing", "404 Not Found"},
		{"virtlet.cloud/refused", "connection refused"},
		{"virtlet.cloud/untrusted", "certificate signed by unknown authority"},
		{"virtlet.cloud/truncated", "truncated"},
		{"virtlet.cloud/tiny@sha256:" + strings.Repeat("0", 64), "digest mismatch"},
		{"virtlet.cloud/not-a-disk", "neither a qcow2 header nor a partition table"},
		{"virtlet.cloud/empty", "the file is empty"},
		{"virtlet.cloud/corrupt", "qcow2 version 42"},
		{"virtlet.cloud/backing", "the qcow2 image names a backing file"},
		{"virtlet.cloud/datafile", "the qcow2 image keeps its data in an external data file"},
		{"virtlet.cloud/lying/swapped/disks/tiny@" + containerdisk.Sum(tiny), "the registry sent a manifest of digest " + containerdisk.Sum(liar.Swap)},
		{"virtlet.cloud/lying/flipped/disks/tiny@" + containerdisk.Sum(tiny), "the registry sent data of another digest"},
		{"virtlet.cloud/lying/longer/disks/tiny@" + containerdisk.Sum(tiny), "is longer than the"},
		{"virtlet.cloud/disks/not-a-disk:v1", "has no VM disk in its 1 layer(s)"},
		{"virtlet.cloud/disks/tiny:v9", "v9"},
		{"virtlet.cloud/example.com/../etc/passwd", "invalid reference format"},
		{"nginx:1.27", "not a VM image"},
	} {
		t.Run(tc.image, func(t *testing.T) {
			_, errOut, err := c.Run("pull", tc.image)
			if err == nil || !strings.Contains(errOut, tc.want) {
				t.Fatalf("pull %s: %v\n%s\nwant %q", tc.image, err, errOut, tc.want)
			}
			if files := storeFiles(d); len(files) != 0 {
				t.Fatalf("store after a failed pull: %v", files)
			}
		})
	}
	if out := c.Must(t, "images", "-q"); out != "" {
		t.Fatalf("images: %q", out)
	}
	// The same registry, honest, serves the same pull by digest; the
	// image's repo digest is the manifest's.
	honest := "virtlet.cloud/lying/honest/disks/tiny@" + containerdisk.Sum(tiny)
	c.Must(t, "pull", honest)
	var st struct {
		Status struct {
			RepoDigests []string `json:"repoDigests"`
		} `json:"status"`
	}
	c.JSON(t, &st, "inspecti", honest)
	if fmt.Sprint(st.Status.RepoDigests) != fmt.Sprint([]string{honest}) {
		t.Errorf("repo digests %q, want %q", st.Status.RepoDigests, honest)
	}
	// The broken translation file is named in the log; the others still work.
	found := false
	for _, e := range d.LogEntries() {
		if e["msg"] == "image translation config skipped" && strings.Contains(fmt.Sprint(e["error"]), "zz-broken.yaml") &&
			strings.Contains(fmt.Sprint(e["error"]), `"nowhere" is not among this file's transports`) {
			found = true
		}
	}
	if !found {
		t.Error("the daemon log does not name the broken translation file")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
