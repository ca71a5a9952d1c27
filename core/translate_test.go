package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/fakes"
)

type staticTranslations struct {
	cfgs []ports.TranslationConfig
	errs []error
}

func (s staticTranslations) Translations(ctx context.Context) ([]ports.TranslationConfig, []error) {
	return s.cfgs, s.errs
}

func TestImageNameTranslations(t *testing.T) {
	one := 1
	cfgs := []ports.TranslationConfig{
		{Source: "/etc/virtlet/images/10-regexps.yaml", Translations: []ports.Translation{
			{Regexp: `cirros|ubuntu/(\d+\.\d+)`, URL: "https://cloud-images.ubuntu.com/releases/$1/ubuntu-$1.img"},
			{Regexp: `escape/(.*)`, URL: "file:///srv/images/../$1"},
		}},
		{Source: "/etc/virtlet/images/20-names.yaml", Translations: []ports.Translation{
			{Name: "cirros", URL: "https://github.com/mirantis/virtlet/releases/download/v0.9.3/cirros.img"},
			{Name: "local", URL: "http://10.0.0.1/local.img", Transport: "lan"},
			{Name: "disk", URL: "file:///srv/images/disk.qcow2"},
			{Name: "broken", URL: "https://x/y", Transport: "missing"},
		}, Transports: map[string]ports.TransportConfig{"lan": {TimeoutMillis: 5000, MaxRedirects: &one}}},
		{Source: "/etc/virtlet/images/30-prefix.yaml", Prefix: "corp", Translations: []ports.Translation{
			{Regexp: `(.*)`, URL: "https://images.corp.example.com/$1"},
		}},
		// A match anywhere in the name, and the file's default transport
		// (named ""), as Virtlet had them.
		{Source: "/etc/virtlet/images/40-partial.yaml", Prefix: "mirror", Translations: []ports.Translation{
			{Regexp: `fedora-(\d+)`, URL: "https://mirror.example.com/fedora/$1.qcow2"},
		}, Transports: map[string]ports.TransportConfig{"": {TimeoutMillis: 7000}}},
	}
	images := fakes.NewImageSource()
	rt, err := core.New(core.Deps{Hypervisor: fakehypervisor.New(), Store: fakes.NewStore(), ImageFiles: fakes.NewImageFiles(t.TempDir()),
		ImageSources: map[string]ports.ImageSource{"https": images, "http": images, "file": images},
		Translations: staticTranslations{cfgs: cfgs, errs: []error{errors.New("a bad file")}}}, core.Options{Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		image, url, transport string
	}{
		{"virtlet.cloud/cirros", "https://github.com/mirantis/virtlet/releases/download/v0.9.3/cirros.img", ""}, // exact beats regexp
		{"virtlet.cloud/ubuntu/18.04:latest", "https://cloud-images.ubuntu.com/releases/18.04/ubuntu-18.04.img", ""},
		{"virtlet.cloud/local", "http://10.0.0.1/local.img", `{"timeout":5000,"maxRedirects":1}`},
		{"virtlet.cloud/disk", "file:///srv/images/disk.qcow2", ""},
		{"virtlet.cloud/corp/team/vm.qcow2", "https://images.corp.example.com/team/vm.qcow2", ""},
		{"virtlet.cloud/example.com/other.img", "https://example.com/other.img", ""}, // the default rule
		{"virtlet.cloud/mirror/images/fedora-40-cloud", "https://mirror.example.com/fedora/40.qcow2", `{"timeout":7000}`},
	} {
		if _, err := rt.PullImage(ctx, tc.image, nil); err != nil {
			t.Errorf("%s: %v", tc.image, err)
			continue
		}
		req := images.Requests[len(images.Requests)-1]
		if req.Location != tc.url || string(req.TransportConfig) != tc.transport {
			t.Errorf("%s → %s %s, want %s %s", tc.image, req.Location, req.TransportConfig, tc.url, tc.transport)
		}
	}
	for _, tc := range []struct{ image, want string }{
		{"virtlet.cloud/escape/x", "expands it to a URL with '..'"},
		{"virtlet.cloud/broken", `names a transport the file does not define`},
	} {
		if _, err := rt.PullImage(ctx, tc.image, nil); !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.image, err)
		}
	}
	var tc ports.TransportConfig
	json.Unmarshal(images.Requests[2].TransportConfig, &tc)
	if fmt.Sprint(tc.TimeoutMillis, *tc.MaxRedirects) != "5000 1" {
		t.Errorf("transport config %+v", tc)
	}
}

func TestRegistryImagesAreNamedByTag(t *testing.T) {
	images := fakes.NewImageSource()
	images.Content["docker://127.0.0.1:5055/disks/tiny:v1"] = []byte("disk v1")
	images.Content["docker://127.0.0.1:5055/disks/tiny:v2"] = []byte("disk v2")
	cfgs := []ports.TranslationConfig{{Source: "reg.yaml", Translations: []ports.Translation{
		{Regexp: `disks/(.*)`, URL: "docker://127.0.0.1:5055/disks/$1"},
		{Name: "pinned", URL: "docker://127.0.0.1:5055/disks/tiny:v1"},
		{Name: "layout", URL: "oci:/srv/layouts/tiny"},
	}}}
	rt, err := core.New(core.Deps{Hypervisor: fakehypervisor.New(), Store: fakes.NewStore(), ImageFiles: fakes.NewImageFiles(t.TempDir()),
		ImageSources: map[string]ports.ImageSource{"docker": images, "oci": images}, Translations: staticTranslations{cfgs: cfgs}},
		core.Options{Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v1, err := rt.PullImage(ctx, "virtlet.cloud/disks/tiny:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := rt.PullImage(ctx, "virtlet.cloud/disks/tiny:v2", nil)
	if err != nil || v2 == v1 {
		t.Fatalf("v2 %s %v (v1 %s)", v2, err, v1)
	}
	for spec, want := range map[string]string{"virtlet.cloud/disks/tiny:v1": v1, "virtlet.cloud/disks/tiny:v2": v2} {
		if img, err := rt.ImageStatus(ctx, spec); err != nil || img.ID != want || !img.Registry {
			t.Errorf("ImageStatus(%s) = %+v, %v; want %s", spec, img, err, want)
		}
	}
	if _, err := rt.ImageStatus(ctx, "virtlet.cloud/disks/tiny:v3"); !errors.Is(err, ports.ErrNotFound) {
		t.Errorf("an unpulled tag resolves: %v", err)
	}
	if imgs, _ := rt.ListImages(ctx, ""); len(imgs) != 2 {
		t.Fatalf("images %+v", imgs)
	}
	// The URL a translation names keeps its own tag; a name's digest pins the manifest.
	rt.PullImage(ctx, "virtlet.cloud/pinned:other", nil)
	rt.PullImage(ctx, "virtlet.cloud/layout:v5", nil)
	digest := "sha256:" + strings.Repeat("ab", 32)
	rt.PullImage(ctx, "virtlet.cloud/disks/tiny@"+digest, nil)
	var got []string
	for _, r := range images.Requests {
		got = append(got, r.Location+" "+r.ExpectedDigest)
	}
	want := []string{"docker://127.0.0.1:5055/disks/tiny:v1 ", "docker://127.0.0.1:5055/disks/tiny:v2 ",
		"docker://127.0.0.1:5055/disks/tiny:v1 ", "oci:/srv/layouts/tiny:v5 ", "docker://127.0.0.1:5055/disks/tiny@" + digest + " "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("locations\n got %q\nwant %q", got, want)
	}
}

// A registry image's repo digests are the manifests' its names resolved
// to; a pull by digest that the image plugin does not confirm is refused
// and stores nothing.
func TestRegistryRepoDigestsAreTheManifests(t *testing.T) {
	images := fakes.NewImageSource()
	files := fakes.NewImageFiles(t.TempDir())
	cfgs := []ports.TranslationConfig{{Source: "reg.yaml", Translations: []ports.Translation{
		{Regexp: `disks/(.*)`, URL: "docker://127.0.0.1:5055/disks/$1"},
		{Regexp: `mirror/(.*)`, URL: "docker://127.0.0.1:5056/disks/$1"},
	}}}
	rt, err := core.New(core.Deps{Hypervisor: fakehypervisor.New(), Store: fakes.NewStore(), ImageFiles: files,
		ImageSources: map[string]ports.ImageSource{"docker": images}, Translations: staticTranslations{cfgs: cfgs}},
		core.Options{Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tagged, pinned := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	images.ManifestDigests["docker://127.0.0.1:5055/disks/tiny:v1"] = tagged
	images.Content["docker://127.0.0.1:5056/disks/tiny@"+pinned] = images.ContentFor("docker://127.0.0.1:5055/disks/tiny:v1")
	id, err := rt.PullImage(ctx, "virtlet.cloud/disks/tiny:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	// The same disk through another repository, by digest: one image.
	if other, err := rt.PullImage(ctx, "virtlet.cloud/mirror/tiny@"+pinned, nil); err != nil || other != id {
		t.Fatalf("pull by digest: %s %v (want %s)", other, err, id)
	}
	img, err := rt.ImageStatus(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"virtlet.cloud/disks/tiny@" + tagged, "virtlet.cloud/mirror/tiny@" + pinned}
	if got := img.RepoDigests(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("repo digests %q, want %q", got, want)
	}
	// A digest names the image in its repositories only, and for a
	// registry image it is the manifest's: the disk's digest under
	// another repository would hand one tenant's private image to
	// anyone who learns its ID.
	for spec, found := range map[string]bool{
		"virtlet.cloud/disks/tiny@" + tagged:  true,
		"virtlet.cloud/mirror/tiny@" + pinned: true,
		"virtlet.cloud/disks/tiny@" + pinned:  false,
		"virtlet.cloud/disks/tiny@" + id:      false,
		"virtlet.cloud/other/tiny@" + tagged:  false,
		"virtlet.cloud/other/tiny@" + id:      false,
		id:                                    true,
	} {
		if _, err := rt.ImageStatus(ctx, spec); (err == nil) != found {
			t.Errorf("ImageStatus(%s): %v, want found %v", spec, err, found)
		}
	}

	lied := "sha256:" + strings.Repeat("3", 64)
	images.ManifestDigests["docker://127.0.0.1:5055/disks/tiny@"+lied] = pinned
	images.Content["docker://127.0.0.1:5055/disks/tiny@"+lied] = []byte("another disk")
	_, err = rt.PullImage(ctx, "virtlet.cloud/disks/tiny@"+lied, nil)
	if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), "reports manifest digest \""+pinned+"\", not the "+lied) {
		t.Fatalf("a pull the plugin does not confirm: %v", err)
	}
	if imgs, _ := rt.ListImages(ctx, ""); len(imgs) != 1 {
		t.Errorf("images after the refused pull: %+v", imgs)
	}
	if entries, _ := os.ReadDir(files.Dir); len(entries) != 1 {
		t.Errorf("image files after the refused pull: %v", entries)
	}
}

func TestUnreferencedImageDataIsCollectedAtStart(t *testing.T) {
	files := fakes.NewImageFiles(t.TempDir())
	ctx := context.Background()
	tmp, _ := files.NewTemp(ctx)
	os.WriteFile(tmp, []byte("orphan"), 0o600)
	orphan := "sha256:" + strings.Repeat("0", 64)
	files.Commit(ctx, tmp, orphan)
	store := fakes.NewStore()
	rt, _ := core.New(core.Deps{Hypervisor: fakehypervisor.New(), Store: store, ImageFiles: files,
		ImageSources: map[string]ports.ImageSource{"https": fakes.NewImageSource()}}, core.Options{Log: quietLog()})
	kept, err := rt.PullImage(ctx, "virtlet.cloud/example.com/kept.img", nil)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := core.New(core.Deps{Hypervisor: fakehypervisor.New(), Store: store, ImageFiles: files}, core.Options{Log: quietLog()})
	if err := again.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if list, _ := files.List(ctx); len(list) != 1 || list[0] != kept {
		t.Fatalf("data after start: %v (kept %s)", list, kept)
	}
}
