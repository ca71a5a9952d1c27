// Package imagetranslations reads image name translation configs (Virtlet's
// format) from a directory, default /etc/virtlet/images. Files are
// reloaded when they change, without a restart; a malformed file is
// reported, naming the file and the problem, and the others still load.
package imagetranslations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/ports"
)

// DefaultDir is where operators put translation configs.
const DefaultDir = "/etc/virtlet/images"

// Dir reads the configs of one directory.
type Dir struct {
	path  string
	mu    sync.Mutex
	cache map[string]cached // by file name
}

type cached struct {
	mtime time.Time
	size  int64
	cfg   ports.TranslationConfig
	err   error
}

// New reads translation configs from path (which may not exist yet).
func New(path string) *Dir { return &Dir{path: path, cache: map[string]cached{}} }

// Translations returns the configs of every *.yaml, *.yml and *.json file,
// in name order, parsing only the files that changed since the last call.
func (d *Dir) Translations(ctx context.Context) ([]ports.TranslationConfig, []error) {
	entries, err := os.ReadDir(d.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{fmt.Errorf("image translations %s: %w", d.path, err)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := map[string]bool{}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml") || strings.HasSuffix(n, ".json")) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		seen[n] = true
		names = append(names, n)
		if c, ok := d.cache[n]; ok && c.mtime.Equal(info.ModTime()) && c.size == info.Size() {
			continue
		}
		file := filepath.Join(d.path, n)
		cfg, err := Load(file)
		d.cache[n] = cached{mtime: info.ModTime(), size: info.Size(), cfg: cfg, err: err}
	}
	for n := range d.cache {
		if !seen[n] {
			delete(d.cache, n)
		}
	}
	sort.Strings(names)
	var cfgs []ports.TranslationConfig
	var errs []error
	for _, n := range names {
		if c := d.cache[n]; c.err != nil {
			errs = append(errs, c.err)
		} else {
			cfgs = append(cfgs, c.cfg)
		}
	}
	return cfgs, errs
}

var (
	unknownField = regexp.MustCompile(`unknown field "([^"]+)"`)
	knownSchemes = map[string]bool{"https": true, "http": true, "file": true, "docker": true, "oci": true}
)

// Load reads, parses and checks one translation file.
func Load(file string) (ports.TranslationConfig, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return ports.TranslationConfig{}, fmt.Errorf("image translation file %s: %w", file, err)
	}
	return Parse(file, data)
}

// Parse parses and checks the content of one translation file.
func Parse(file string, data []byte) (ports.TranslationConfig, error) {
	return parse("image translation file "+file, file, data)
}

// parse parses and checks one translation config; what names it in errors
// (a file, a VirtletImageMapping object) and source in the config.
func parse(what, source string, data []byte) (ports.TranslationConfig, error) {
	fail := func(field, format string, args ...interface{}) (ports.TranslationConfig, error) {
		e := &ports.InvalidError{Field: what, Reason: fmt.Sprintf(format, args...)}
		if field != "" {
			e.Field += " field " + field
		}
		return ports.TranslationConfig{}, e
	}
	var cfg ports.TranslationConfig
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		if m := unknownField.FindStringSubmatch(err.Error()); m != nil {
			return fail(m[1], "unknown field (known: prefix, translations, transports)")
		}
		return fail("", "cannot parse: %v", strings.TrimPrefix(err.Error(), "error converting YAML to JSON: "))
	}
	cfg.Source = source
	for i, t := range cfg.Translations {
		field := fmt.Sprintf("translations[%d]", i)
		switch {
		case (t.Name == "") == (t.Regexp == ""):
			return fail(field, "needs exactly one of name and regexp")
		case t.URL == "":
			return fail(field+".url", "required")
		}
		if t.Regexp != "" {
			// Compiled as the core applies it, so that a regexp the core
			// could not use is reported here, not skipped silently.
			if _, err := t.Pattern(); err != nil {
				return fail(field+".regexp", "%v", err)
			}
		}
		u, err := url.Parse(strings.ReplaceAll(t.URL, "$", "x"))
		if err != nil || !knownSchemes[u.Scheme] {
			return fail(field+".url", "%q is not a https, http, file, docker or oci URL", t.URL)
		}
		if t.Transport != "" {
			if _, ok := cfg.Transports[t.Transport]; !ok {
				return fail(field+".transport", "%q is not among this file's transports", t.Transport)
			}
		}
	}
	for name, tr := range cfg.Transports {
		if tr.Proxy != "" {
			if u, err := url.Parse(tr.Proxy); err != nil || u.Host == "" {
				return fail("transports."+name+".proxy", "%q is not a URL", tr.Proxy)
			}
		}
		if tr.TLS != nil {
			for i, c := range tr.TLS.Certificates {
				if !strings.Contains(c.Cert, "-----BEGIN CERTIFICATE-----") {
					return fail(fmt.Sprintf("transports.%s.tls.certificates[%d].cert", name, i), "not a PEM certificate")
				}
			}
		}
	}
	return cfg, nil
}

var _ ports.ImageTranslations = (*Dir)(nil)
