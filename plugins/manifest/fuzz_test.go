package manifest_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/plugins/manifest"
	"github.com/virtlet/virtlet/ports"
)

// fuzzPlugin is the binary the fuzzed manifests may name: its content,
// hence its checksum, is fixed, so that corpus entries holding it stay
// valid.
const fuzzPlugin = "#!/bin/sh\n"

var (
	// knownField is a field an error may name besides an unknown field's own.
	knownField = regexp.MustCompile(`^(name|kind|command|args|sha256|config|handles(\[\d+\])?)$`)
	validName  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// FuzzParse: a manifest is accepted or refused with a manifest error
// naming its file and (unless the whole file is at fault) a field; what
// is accepted is valid by every rule and survives being written out and
// read back unchanged.
func FuzzParse(f *testing.F) {
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "plugin"), []byte(fuzzPlugin), 0o755); err != nil {
		f.Fatal(err)
	}
	sum, err := manifest.FileSHA256(filepath.Join(dir, "plugin"))
	if err != nil {
		f.Fatal(err)
	}
	ok := "name: p\nkind: volume\ncommand: plugin\nsha256: " + sum + "\n"
	f.Add(ok)
	f.Add(ok + "args: [serve, --verbose]\nhandles: [ceph, qcow2]\nconfig:\n  size: 64Mi\n  nested: {a: [1, 2]}\n")
	f.Add(ok + "config: null\n")
	f.Add(ok + "config: [1]\n")
	f.Add(ok + "restartPolicy: always\n")
	f.Add(ok + "args: --verbose\n")
	f.Add(ok + "handles: [Ceph]\n")
	f.Add(strings.Replace(ok, "plugin", "/nonexistent", 1))
	f.Add("{\"name\": \"p\", \"kind\": \"hypervisor\", \"command\": \"./plugin\", \"sha256\": \"" + sum + "\"}")
	f.Add("name: [\n")
	f.Add("- a\n- b\n")
	f.Fuzz(func(t *testing.T, data string) {
		file := filepath.Join(dir, "fuzz.yaml")
		m, err := manifest.Parse(file, []byte(data), dir)
		if err != nil {
			var me *manifest.Error
			if !errors.As(err, &me) || !errors.Is(err, ports.ErrInvalidArgument) {
				t.Fatalf("error of the wrong kind: %T %v", err, err)
			}
			if me.File != file || !strings.Contains(err.Error(), file) {
				t.Fatalf("error does not name the file: %v", err)
			}
			if me.Field != "" && !knownField.MatchString(me.Field) && !strings.HasPrefix(me.Reason, "unknown field") {
				t.Fatalf("error names no field of a manifest: field %q: %v", me.Field, err)
			}
			return
		}
		if len(m.Name) > 63 || !validName.MatchString(m.Name) || !m.Kind.Valid() {
			t.Fatalf("accepted name %q kind %q", m.Name, m.Kind)
		}
		if !filepath.IsAbs(m.Command) || m.SHA256 != sum || m.File != file {
			t.Fatalf("accepted command %q sha256 %q file %q", m.Command, m.SHA256, m.File)
		}
		if len(m.Config) > 0 {
			var v interface{}
			if err := json.Unmarshal(m.Config, &v); err != nil {
				t.Fatalf("config is not JSON: %v: %s", err, m.Config)
			}
			if _, isMap := v.(map[string]interface{}); !isMap && v != nil {
				t.Fatalf("config is not a mapping: %s", m.Config)
			}
		}
		out, err := yaml.Marshal(m)
		if err != nil {
			t.Fatalf("accepted manifest cannot be written: %v", err)
		}
		again, err := manifest.Parse(file, out, "/nonexistent")
		if err != nil {
			t.Fatalf("written back, it is refused: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(normalConfig(t, m), normalConfig(t, again)) {
			t.Fatalf("written back, it differs:\n%+v\n%+v\n%s", m, again, out)
		}
	})
}

// normalConfig decodes the config, so that manifests compare by what it
// says, not by how its JSON is spaced; an empty list reads back as none.
func normalConfig(t *testing.T, m manifest.Manifest) interface{} {
	var cfg interface{}
	if len(m.Config) > 0 {
		if err := json.Unmarshal(m.Config, &cfg); err != nil {
			t.Fatal(err)
		}
	}
	m.Config = nil
	if len(m.Args) == 0 {
		m.Args = nil
	}
	if len(m.Handles) == 0 {
		m.Handles = nil
	}
	return []interface{}{m, cfg}
}
