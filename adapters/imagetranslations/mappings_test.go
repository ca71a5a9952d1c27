package imagetranslations_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/adapters/imagetranslations"
	"github.com/virtlet/virtlet/ports"
)

// lister is the API server's answer, as kubeapi gives it.
type lister struct {
	specs map[string][]byte
	err   error
}

func (l lister) ImageMappings(context.Context) (map[string][]byte, error) { return l.specs, l.err }

// VirtletImageMapping objects load as files do, in name order; a bad one
// is reported by its name and field, and the others still load.
func TestMappings(t *testing.T) {
	m := imagetranslations.NewMappings(lister{specs: map[string][]byte{
		"b-seed": []byte(`{"translations": [{"name": "cirros", "url": "https://example.com/cirros.img"}]}`),
		"a-more": []byte(`{"prefix": "more", "translations": [{"regexp": "^x(.*)", "url": "http://10.0.0.1/$1.img"}]}`),
		"c-bad":  []byte(`{"translations": [{"name": "nourl"}]}`),
		"d-typo": []byte(`{"translation": []}`),
		"e-file": []byte(`{"translations": [{"name": "x", "url": "file:///etc/shadow"}]}`),
	}}, "kube-system")
	cfgs, errs := m.Translations(context.Background())
	if len(cfgs) != 2 || cfgs[0].Prefix != "more" || cfgs[1].Translations[0].Name != "cirros" {
		t.Fatalf("configs %+v: want a-more then b-seed", cfgs)
	}
	if cfgs[1].Source != "VirtletImageMapping kube-system/b-seed" {
		t.Errorf("source %q", cfgs[1].Source)
	}
	if len(errs) != 3 {
		t.Fatalf("errors %v: want c-bad's, d-typo's and e-file's", errs)
	}
	var ie *ports.InvalidError
	if !errors.As(errs[0], &ie) || ie.Field != "VirtletImageMapping kube-system/c-bad spec field translations[0].url" {
		t.Errorf("c-bad: %v", errs[0])
	}
	if !errors.As(errs[1], &ie) || ie.Field != "VirtletImageMapping kube-system/d-typo spec field translation" {
		t.Errorf("d-typo: %v", errs[1])
	}
	// An object may not hand the node's files to the image plugin.
	if !errors.As(errs[2], &ie) || ie.Field != "VirtletImageMapping kube-system/e-file spec field translations[0].url" ||
		!strings.Contains(errs[2].Error(), "file of the node") {
		t.Errorf("e-file: %v", errs[2])
	}
}

// An API server that cannot be read costs the mappings, not the files.
func TestSourcesKeepTheFilesWhenTheAPIFails(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "10-images.yaml"), []byte(good), 0o644)
	down := imagetranslations.NewMappings(lister{err: errors.New("connection refused")}, "kube-system")
	up := imagetranslations.NewMappings(lister{specs: map[string][]byte{
		"seed": []byte(`{"translations": [{"name": "cirros", "url": "https://mapped.example.com/cirros.img"}]}`)}}, "kube-system")

	cfgs, errs := imagetranslations.Sources{down, imagetranslations.New(dir)}.Translations(context.Background())
	if len(cfgs) != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "VirtletImageMapping objects: connection refused") {
		t.Fatalf("configs %d, errors %v", len(cfgs), errs)
	}
	// Objects first, then files, as Virtlet read them: for the same name
	// the object's translation is the first config's.
	cfgs, errs = imagetranslations.Sources{up, imagetranslations.New(dir)}.Translations(context.Background())
	if len(errs) != 0 || len(cfgs) != 2 || cfgs[0].Source != "VirtletImageMapping kube-system/seed" || !strings.HasSuffix(cfgs[1].Source, "10-images.yaml") {
		t.Fatalf("configs %+v, errors %v", cfgs, errs)
	}
}
