package imagetranslations_test

import (
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/adapters/imagetranslations"
	"github.com/virtlet/virtlet/ports"
)

// FuzzParse: a translation file is accepted or refused with an invalid
// argument error naming the file; what is accepted holds only
// translations the core can follow (one of name and regexp, a regexp the
// core's resolver compiles, a URL of a known scheme, a transport the file
// defines) and reads back unchanged once written out.
func FuzzParse(f *testing.F) {
	f.Add(good)
	f.Add("translations:\n- regexp: 'x/(.*)'\n  url: file:///srv/images/$1\n")
	f.Add("prefix: corp\ntranslations:\n- regexp: '(.*)'\n  url: docker://registry.example.com/$1\n")
	f.Add("translations:\n- regexp: '\\Qimages.example.com\\E/(.*)'\n  url: https://mirror.example.com/$1\n")
	f.Add("translations:\n- regexp: 'a(('\n  url: https://x/y\n")
	f.Add("translations:\n- name: a\n  url: ftp://x/y\n")
	f.Add("transports:\n  t: {tls: {certificates: [{cert: hello}]}}\n")
	f.Add(`{"translations": [{"name": "a", "url": "oci:/srv/layouts/a", "transport": "t"}], "transports": {"t": {"timeout": 1}}}`)
	const file = "/etc/virtlet/images/fuzz.yaml"
	f.Fuzz(func(t *testing.T, data string) {
		cfg, err := imagetranslations.Parse(file, []byte(data))
		if err != nil {
			var ie *ports.InvalidError
			if !errors.As(err, &ie) || !errors.Is(err, ports.ErrInvalidArgument) || !strings.HasPrefix(ie.Field, "image translation file "+file) {
				t.Fatalf("error of the wrong kind: %T %v", err, err)
			}
			return
		}
		if cfg.Source != file {
			t.Fatalf("source %q", cfg.Source)
		}
		for i, tr := range cfg.Translations {
			if (tr.Name == "") == (tr.Regexp == "") {
				t.Fatalf("translation %d: name %q regexp %q", i, tr.Name, tr.Regexp)
			}
			if tr.Regexp != "" {
				// As the core's resolver compiles it.
				if _, err := tr.Pattern(); err != nil {
					t.Fatalf("translation %d: regexp %q accepted, but the resolver cannot use it: %v", i, tr.Regexp, err)
				}
			}
			u, err := url.Parse(strings.ReplaceAll(tr.URL, "$", "x"))
			if err != nil || !map[string]bool{"https": true, "http": true, "file": true, "docker": true, "oci": true}[u.Scheme] {
				t.Fatalf("translation %d: url %q accepted", i, tr.URL)
			}
			if _, ok := cfg.Transports[tr.Transport]; tr.Transport != "" && !ok {
				t.Fatalf("translation %d: transport %q accepted", i, tr.Transport)
			}
		}
		out, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("accepted config cannot be written: %v", err)
		}
		again, err := imagetranslations.Parse(file, out)
		if err != nil {
			t.Fatalf("written back, it is refused: %v\n%s", err, out)
		}
		// Compared as written: an empty list or map reads back as none.
		if out2, _ := json.Marshal(again); string(out2) != string(out) || again.Source != cfg.Source {
			t.Fatalf("written back, it differs:\n%s\n%s", out, out2)
		}
	})
}
