package manifest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
)

type poolConfig struct {
	Size  int    `json:"size,omitempty" jsonschema:"minimum=0"`
	Users string `json:"users,omitempty"`
}

type testConfig struct {
	URI         string     `json:"uri,omitempty" jsonschema_description:"where, with a comma"`
	Accelerator string     `json:"accelerator,omitempty" jsonschema:"enum=auto,enum=kvm"`
	Prefix      string     `json:"prefix,omitempty" jsonschema:"pattern=^[a-z]{0\\,3}$"`
	Pool        poolConfig `json:"pool,omitempty"`
	Paths       []string   `json:"paths,omitempty"`
}

type configured struct{ def any }

func (c configured) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "test", Kind: ports.KindVolume}
}
func (c configured) DefaultConfig() any                                  { return c.def }
func (c configured) Configure(context.Context, ports.PluginConfig) error { return nil }

type unconfigurable struct{}

func (unconfigurable) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "bare", Kind: ports.KindVolume}
}

// A manifest's config is checked against the schema its plugin declares;
// every problem names the file and the key.
func TestCheckConfig(t *testing.T) {
	schema, err := base.ConfigSchema(configured{def: testConfig{Accelerator: "auto", Pool: poolConfig{Users: "1-2"}}})
	if err != nil {
		t.Fatal(err)
	}
	none, err := base.ConfigSchema(unconfigurable{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, config string
		schema       []byte
		want         []string // each an error's text; none: valid
	}{
		{name: "empty", config: ""},
		{name: "null", config: "null"},
		{name: "valid", config: `{"uri":"x","accelerator":"kvm","prefix":"ab","pool":{"size":2},"paths":["/dev/a"]}`},
		{name: "wrong type", config: `{"pool":{"size":"2"}}`, want: []string{"field config.pool.size: got string, want integer"}},
		{name: "unknown key", config: `{"pools":{}}`, want: []string{"field config.pools: no such key (keys: accelerator, paths, pool, prefix, uri)"}},
		{name: "unknown nested key", config: `{"pool":{"sizes":1}}`, want: []string{"field config.pool.sizes: no such key (keys: size, users)"}},
		{name: "not in enum", config: `{"accelerator":"hvf"}`, want: []string{"field config.accelerator: value must be one of 'auto', 'kvm'"}},
		{name: "pattern", config: `{"prefix":"abcd"}`, want: []string{"field config.prefix: ", "does not match pattern"}},
		{name: "minimum", config: `{"pool":{"size":-1}}`, want: []string{"field config.pool.size: ", "minimum"}},
		{name: "list item", config: `{"paths":[1]}`, want: []string{"field config.paths[0]: got number, want string"}},
		{name: "two problems", config: `{"uri":1,"extra":true}`, want: []string{"field config.uri: got number, want string", "field config.extra: no such key"}},
		{name: "a plugin that takes none", schema: none, config: `{"a":1}`, want: []string{"field config.a: no such key: this takes none"}},
		{name: "a plugin that takes none, empty", schema: none, config: `{}`},
		{name: "no schema declared", schema: []byte{}, config: `{"anything":1}`},
	} {
		s := schema
		if tc.schema != nil {
			s = tc.schema
		}
		m := manifest.Manifest{Name: "test", File: "/etc/virtlet/plugins.d/test.yaml", Config: []byte(tc.config)}
		err := m.CheckConfig(s)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: %s accepted", tc.name, tc.config)
			continue
		}
		for _, want := range tc.want {
			if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "plugin manifest /etc/virtlet/plugins.d/test.yaml: ") {
				t.Errorf("%s: error %q does not say %q naming the file", tc.name, err, want)
			}
		}
	}
}

// The schema shows the defaults a plugin's DefaultConfig holds, and a
// DefaultConfig that is not a struct is refused.
func TestConfigSchemaDefaults(t *testing.T) {
	schema, err := base.ConfigSchema(configured{def: testConfig{Accelerator: "auto", Pool: poolConfig{Users: "1-2"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"accelerator":{"type":"string","enum":["auto","kvm"],"default":"auto"}`, `"users":{"type":"string","default":"1-2"}`,
		`"size":{"type":"integer","minimum":0,"default":0}`, `"description":"where, with a comma"`, `"additionalProperties":false`} {
		if !strings.Contains(string(schema), want) {
			t.Errorf("schema %s does not hold %s", schema, want)
		}
	}
	if _, err := base.ConfigSchema(configured{def: 3}); err == nil {
		t.Error("a DefaultConfig of an int was accepted")
	}
}
