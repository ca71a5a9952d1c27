package imagetranslations_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/adapters/imagetranslations"
	"github.com/virtlet/virtlet/ports"
)

const good = `
prefix: ""
translations:
- name: cirros
  url: https://github.com/mirantis/virtlet/releases/download/v0.9.3/cirros.img
- regexp: 'ubuntu/(\d+\.\d+)'
  url: 'https://cloud-images.ubuntu.com/releases/$1/release/ubuntu-$1-server-cloudimg-amd64.img'
- name: local
  url: http://10.0.0.1/local.img
  transport: slow
transports:
  slow:
    timeout: 5000
    maxRedirects: 1
    proxy: http://proxy.example.com:3128
    tls:
      serverName: images.example.com
      insecure: false
`

func TestLoadsVirtletsFormatAndReloads(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "10-images.yaml"), []byte(good), 0o644)
	d := imagetranslations.New(dir)
	cfgs, errs := d.Translations(context.Background())
	if len(errs) != 0 || len(cfgs) != 1 || len(cfgs[0].Translations) != 3 || cfgs[0].Transports["slow"].TimeoutMillis != 5000 ||
		*cfgs[0].Transports["slow"].MaxRedirects != 1 || cfgs[0].Source != filepath.Join(dir, "10-images.yaml") {
		t.Fatalf("%+v %v", cfgs, errs)
	}
	// A changed file is read again without a restart.
	time.Sleep(10 * time.Millisecond)
	os.WriteFile(filepath.Join(dir, "10-images.yaml"), []byte("translations:\n- name: x\n  url: https://example.com/x.img\n"), 0o644)
	now := time.Now().Add(time.Second)
	os.Chtimes(filepath.Join(dir, "10-images.yaml"), now, now)
	cfgs, _ = d.Translations(context.Background())
	if len(cfgs) != 1 || cfgs[0].Translations[0].Name != "x" {
		t.Fatalf("after the change: %+v", cfgs)
	}
	os.Remove(filepath.Join(dir, "10-images.yaml"))
	if cfgs, _ = d.Translations(context.Background()); len(cfgs) != 0 {
		t.Fatalf("after removal: %+v", cfgs)
	}
}

func TestMalformedFileIsNamedAndOthersStillLoad(t *testing.T) {
	for _, tc := range []struct{ content, want string }{
		{"translations: [\n", "cannot parse"},
		{"translation:\n- name: x\n  url: https://x/y\n", `field translation: unknown field`},
		{"translations:\n- url: https://x/y\n", "translations[0]: needs exactly one of name and regexp"},
		{"translations:\n- name: a\n  regexp: b\n  url: https://x/y\n", "needs exactly one of name and regexp"},
		{"translations:\n- name: a\n", "translations[0].url: required"},
		{"translations:\n- regexp: 'a(('\n  url: https://x/y\n", "translations[0].regexp"},
		{"translations:\n- name: a\n  url: ftp://x/y\n", "not a https, http, file, docker or oci URL"},
		{"translations:\n- name: a\n  url: https://x/y\n  transport: nope\n", `"nope" is not among this file's transports`},
		{"transports:\n  t: {tls: {certificates: [{cert: hello}]}}\n", "transports.t.tls.certificates[0].cert: not a PEM certificate"},
	} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "10-good.yaml"), []byte(good), 0o644)
		os.WriteFile(filepath.Join(dir, "20-bad.yaml"), []byte(tc.content), 0o644)
		cfgs, errs := imagetranslations.New(dir).Translations(context.Background())
		if len(cfgs) != 1 || len(errs) != 1 {
			t.Fatalf("%q: %d configs, errors %v", tc.content, len(cfgs), errs)
		}
		if !errors.Is(errs[0], ports.ErrInvalidArgument) || !strings.Contains(errs[0].Error(), "20-bad.yaml") || !strings.Contains(errs[0].Error(), tc.want) {
			t.Errorf("%q: error %v, want it to name the file and say %q", tc.content, errs[0], tc.want)
		}
	}
}

func TestMissingDirectoryIsEmpty(t *testing.T) {
	cfgs, errs := imagetranslations.New(filepath.Join(t.TempDir(), "absent")).Translations(context.Background())
	if cfgs != nil || errs != nil {
		t.Fatalf("%v %v", cfgs, errs)
	}
}
