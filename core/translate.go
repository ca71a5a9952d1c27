package core

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/virtlet/virtlet/ports"
)

// location is where an image is downloaded from, and how.
type location struct {
	URL             string
	Transport       string
	TransportConfig []byte // JSON of a ports.TransportConfig
	Source          string // the translation file that matched, if any
}

// resolveLocation finds where an image name is downloaded from: through
// the operator's translations (exact names beat regexps, across all
// files), else by Virtlet's default rule, https://<path>. http:// and
// file:// locations can only come from a translation.
func (r *imageService) resolveLocation(ctx context.Context, n ImageName) (location, error) {
	if r.deps.Translations == nil {
		return location{URL: n.Location()}, nil
	}
	configs, problems := r.deps.Translations.Translations(ctx)
	for _, p := range problems {
		r.log.WithError(p).Warn("image translation config skipped")
	}
	for _, cfg := range configs {
		rest, ok := withoutPrefix(cfg.Prefix, n.Path)
		if !ok {
			continue
		}
		for _, t := range cfg.Translations {
			if t.Name != "" && t.Name == rest {
				return translated(cfg, t, t.URL)
			}
		}
	}
	for _, cfg := range configs {
		rest, ok := withoutPrefix(cfg.Prefix, n.Path)
		if !ok {
			continue
		}
		for _, t := range cfg.Translations {
			if t.Regexp == "" {
				continue
			}
			re, err := t.Pattern()
			if err != nil {
				continue // the adapter reports bad regexps when it loads the file
			}
			m := re.FindStringSubmatchIndex(rest)
			if m == nil {
				continue
			}
			url := string(re.ExpandString(nil, t.URL, rest, m))
			for _, seg := range strings.Split(url, "/") {
				if seg == ".." {
					return location{}, &ports.InvalidError{Field: "image", Value: n.Raw,
						Reason: fmt.Sprintf("the translation %q in %s expands it to a URL with '..'", t.Regexp, cfg.Source)}
				}
			}
			return translated(cfg, t, url)
		}
	}
	return location{URL: n.Location()}, nil
}

func withoutPrefix(prefix, path string) (string, bool) {
	if prefix == "" {
		return path, true
	}
	rest, ok := strings.CutPrefix(path, strings.Trim(prefix, "/")+"/")
	return rest, ok && rest != ""
}

// isRegistry reports whether a location is a container image (docker:// or
// an oci: layout), whose tags and digests are part of its identity.
func isRegistry(location string) bool {
	return strings.HasPrefix(location, "docker://") || strings.HasPrefix(location, "oci:")
}

// withReference adds the name's tag or digest to a registry location that
// has neither: virtlet.cloud/<repo>:v1 through a translation to
// docker://registry/<repo> pulls docker://registry/<repo>:v1.
func withReference(location string, n ImageName) string {
	if !isRegistry(location) {
		return location
	}
	last := location[strings.LastIndex(location, "/")+1:]
	if strings.ContainsAny(last, ":@") {
		return location
	}
	switch {
	case n.Digest != "" && strings.HasPrefix(location, "docker://"):
		return location + "@" + n.Digest
	case n.Tag != "":
		return location + ":" + n.Tag
	default:
		return location + ":latest"
	}
}

func translated(cfg ports.TranslationConfig, t ports.Translation, url string) (location, error) {
	loc := location{URL: url, Transport: t.Transport, Source: cfg.Source}
	// A translation without a transport takes the file's transport named
	// "" when it has one, as Virtlet did: its default.
	tc, ok := cfg.Transports[t.Transport]
	if !ok && t.Transport != "" {
		return location{}, &ports.InvalidError{Field: "image translation " + cfg.Source, Value: t.Transport,
			Reason: "names a transport the file does not define"}
	}
	if ok {
		b, err := json.Marshal(tc)
		if err != nil {
			return location{}, err
		}
		loc.TransportConfig = b
	}
	return loc, nil
}
