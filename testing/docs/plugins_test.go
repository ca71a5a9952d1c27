// Package docs checks the reference parts of docs/ against the code they
// are generated from.
package docs

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/cloudinit/configdrive"
	"github.com/virtlet/virtlet/adapters/cloudinit/nocloud"
	"github.com/virtlet/virtlet/adapters/cni"
	"github.com/virtlet/virtlet/adapters/imagesource"
	"github.com/virtlet/virtlet/adapters/libvirt"
	"github.com/virtlet/virtlet/adapters/volume/ceph"
	"github.com/virtlet/virtlet/adapters/volume/ninep"
	"github.com/virtlet/virtlet/adapters/volume/qcow2"
	"github.com/virtlet/virtlet/adapters/volume/raw"
	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
)

var update = flag.Bool("update", false, "rewrite the generated parts of docs/")

// shipped are the adapters of the plugins shipped with the daemon, by
// manifest name, as their cmd/virtlet-plugin-* build them.
func shipped() map[string]ports.Describer {
	log := logrus.New()
	return map[string]ports.Describer{
		"libvirt": libvirt.New(log), "images": imagesource.New(log), "nocloud": nocloud.New(), "configdrive": configdrive.New(),
		"cni": cni.New(log), "ceph": ceph.New(log), "ninep": ninep.New(log), "qcow2": qcow2.New(log), "raw": raw.New(log),
	}
}

// Every shipped plugin declares its config, and the shipped manifests'
// configs are valid by it.
func TestShippedManifestsMatchTheirSchemas(t *testing.T) {
	files, err := manifest.DefaultFiles()
	if err != nil {
		t.Fatal(err)
	}
	// The manifests name binaries that must exist; their contents do not
	// matter here.
	bin := t.TempDir()
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(bin, f.Command), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ms, _, err := manifest.Defaults(bin, nil)
	if err != nil {
		t.Fatal(err)
	}
	adapters := shipped()
	if len(ms) != len(adapters) {
		t.Fatalf("%d shipped manifests, %d adapters here: add the new plugin to shipped()", len(ms), len(adapters))
	}
	for _, m := range ms {
		a, ok := adapters[m.Name]
		if !ok {
			t.Fatalf("no adapter for the shipped manifest %s", m.Name)
		}
		if _, declares := a.(ports.ConfigDefaulter); !declares {
			t.Errorf("plugin %s declares no config schema (ports.ConfigDefaulter)", m.Name)
			continue
		}
		schema, err := base.ConfigSchema(a)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if err := m.CheckConfig(schema); err != nil {
			t.Errorf("shipped manifest of %s: %v", m.Name, err)
		}
		// Its own defaults pass too.
		def, _ := json.Marshal(a.(ports.ConfigDefaulter).DefaultConfig())
		m.Config = def
		if err := m.CheckConfig(schema); err != nil {
			t.Errorf("%s's default config does not pass its own schema: %v", m.Name, err)
		}
	}
}

const (
	pluginsBegin = "<!-- BEGIN: generated from the shipped plugins' config schemas by `go test ./testing/docs -update` -->\n"
	pluginsEnd   = "<!-- END: generated -->\n"
)

// docs/plugins.md's reference of the shipped plugins' configs is made
// from the schemas they report.
func TestPluginConfigReference(t *testing.T) {
	adapters := shipped()
	var names []string
	for name := range adapters {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		a := adapters[name]
		schema, err := base.ConfigSchema(a)
		if err != nil {
			t.Fatal(err)
		}
		var s schemaDoc
		if err := json.Unmarshal(schema, &s); err != nil {
			t.Fatal(err)
		}
		info := a.PluginInfo()
		handles := ""
		if len(info.Handles) > 0 {
			handles = ": " + strings.Join(info.Handles, ", ")
		}
		fmt.Fprintf(&b, "### %s (%s%s)\n\n", name, info.Kind, handles)
		rows := s.rows("")
		if len(rows) == 0 {
			b.WriteString("Takes no config.\n\n")
			continue
		}
		b.WriteString("| Key | Type | Default | Meaning |\n|---|---|---|---|\n")
		for _, r := range rows {
			b.WriteString(r)
		}
		b.WriteString("\n")
	}
	checkGenerated(t, filepath.Join("..", "..", "docs", "plugins.md"), pluginsBegin, pluginsEnd, b.String())
}

// schemaDoc is the part of a JSON Schema the reference shows.
type schemaDoc struct {
	Type        string                `json:"type"`
	Description string                `json:"description"`
	Default     any                   `json:"default"`
	Enum        []any                 `json:"enum"`
	Pattern     string                `json:"pattern"`
	Items       *schemaDoc            `json:"items"`
	Properties  map[string]*schemaDoc `json:"properties"`
}

// rows lists the keys of s, nested ones by their dotted path, sorted.
func (s *schemaDoc) rows(prefix string) []string {
	var keys []string
	for k := range s.Properties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		p := s.Properties[k]
		typ := p.Type
		if p.Items != nil {
			typ = "list of " + p.Items.Type
		}
		if len(p.Enum) > 0 {
			var vals []string
			for _, v := range p.Enum {
				vals = append(vals, fmt.Sprint(v))
			}
			typ = strings.Join(vals, " \\| ")
		}
		def := "none"
		if p.Default != nil {
			d, _ := json.Marshal(p.Default)
			def = "`" + string(d) + "`"
		}
		meaning := p.Description
		if p.Pattern != "" {
			meaning += " (matching `" + p.Pattern + "`)"
		}
		out = append(out, fmt.Sprintf("| `%s%s` | %s | %s | %s |\n", prefix, k, typ, def, strings.ReplaceAll(meaning, "|", "\\|")))
		if p.Properties != nil {
			out = append(out, p.rows(prefix+k+".")...)
		}
	}
	return out
}

// checkGenerated compares the part of file between begin and end with
// want, or rewrites it under -update.
func checkGenerated(t *testing.T, file, begin, end, want string) {
	t.Helper()
	doc, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := strings.Cut(string(doc), begin)
	_, after, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("%s has no generated part between %q and %q", file, begin, end)
	}
	whole := before + begin + want + end + after
	if whole == string(doc) {
		return
	}
	if *update {
		if err := os.WriteFile(file, []byte(whole), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's generated part is not what the code says; run go test ./testing/docs -update", file)
}

// docs/vm-pods.md's table of annotations is core/annotations.Reference.
func TestAnnotationReference(t *testing.T) {
	var b strings.Builder
	b.WriteString("| Annotation | Values | Default | Meaning |\n|---|---|---|---|\n")
	for _, d := range annotations.Reference {
		def := d.Default
		if def == "" {
			def = "none"
		}
		cell := func(s string) string { return strings.NewReplacer("|", "\\|", "<", "&lt;", ">", "&gt;").Replace(s) }
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", d.Name, cell(d.Values), cell(def), cell(d.Meaning))
	}
	checkGenerated(t, filepath.Join("..", "..", "docs", "vm-pods.md"),
		"<!-- BEGIN: generated from core/annotations.Reference by `go test ./testing/docs -update` -->\n", pluginsEnd, b.String())
}
