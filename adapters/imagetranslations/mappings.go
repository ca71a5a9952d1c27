package imagetranslations

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/virtlet/virtlet/ports"
)

// MappingLister lists Virtlet's VirtletImageMapping objects: each one's
// spec (a translation config, as JSON) by the object's name.
type MappingLister interface {
	ImageMappings(ctx context.Context) (map[string][]byte, error)
}

// Mappings reads translation configs from VirtletImageMapping objects, as
// Virtlet did: listed on each use (an image pull), so a change applies to
// the next pull. A malformed object is reported, naming it and the
// problem, and the others still load.
type Mappings struct {
	lister    MappingLister
	namespace string // for messages
}

// NewMappings reads the objects that l lists, from namespace.
func NewMappings(l MappingLister, namespace string) *Mappings {
	return &Mappings{lister: l, namespace: namespace}
}

// Translations returns the objects' configs in name order.
func (m *Mappings) Translations(ctx context.Context) ([]ports.TranslationConfig, []error) {
	specs, err := m.lister.ImageMappings(ctx)
	if err != nil {
		return nil, []error{fmt.Errorf("image translations from VirtletImageMapping objects: %w", err)}
	}
	names := make([]string, 0, len(specs))
	for n := range specs {
		names = append(names, n)
	}
	sort.Strings(names)
	var cfgs []ports.TranslationConfig
	var errs []error
	for _, n := range names {
		ref := fmt.Sprintf("VirtletImageMapping %s/%s", m.namespace, n)
		cfg, err := parse(ref+" spec", ref, specs[n])
		if err == nil {
			err = noNodeFiles(ref, cfg)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cfgs = append(cfgs, cfg)
	}
	return cfgs, errs
}

// noNodeFiles refuses file:// translations in an object: they name the
// node's own files, which only the node's translation files (written by
// its root) may hand to the image plugin, not whoever may write objects in
// the cluster.
func noNodeFiles(ref string, cfg ports.TranslationConfig) error {
	for i, t := range cfg.Translations {
		if strings.HasPrefix(strings.ToLower(t.URL), "file:") {
			return &ports.InvalidError{Field: fmt.Sprintf("%s spec field translations[%d].url", ref, i), Value: t.URL,
				Reason: "a file:// URL names a file of the node", Allowed: "https, http, docker or oci URLs (file:// only in the node's own translation files)"}
		}
	}
	return nil
}

var _ ports.ImageTranslations = (*Mappings)(nil)

// Sources reads the configs of several sources, in their order: the
// daemon puts VirtletImageMapping objects before the directory's files, as
// Virtlet did (among equal matches the first config wins).
type Sources []ports.ImageTranslations

// Translations returns every source's configs and problems.
func (s Sources) Translations(ctx context.Context) ([]ports.TranslationConfig, []error) {
	var cfgs []ports.TranslationConfig
	var errs []error
	for _, src := range s {
		c, e := src.Translations(ctx)
		cfgs = append(cfgs, c...)
		errs = append(errs, e...)
	}
	return cfgs, errs
}

var _ ports.ImageTranslations = Sources(nil)
