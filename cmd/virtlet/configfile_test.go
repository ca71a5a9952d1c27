package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md's generated reference")

// A config file names its schema; one of another version or kind, an
// unknown key or a value of the wrong type is refused naming the file and
// the key.
func TestConfigFileIsVersioned(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, file, err string
	}{
		{"unversioned", "listen: unix:///run/v.sock\n", `apiVersion "", kind "": want apiVersion: ` + configAPIVersion + " and kind: " + configKind},
		{"another version", "apiVersion: config.virtlet.cloud/v2\nkind: VirtletConfiguration\n", `apiVersion "config.virtlet.cloud/v2"`},
		{"another kind", "apiVersion: " + configAPIVersion + "\nkind: KubeletConfiguration\n", `kind "KubeletConfiguration"`},
		{"unknown key", "apiVersion: " + configAPIVersion + "\nkind: VirtletConfiguration\nlistenOn: x\n", `unknown key "listenOn" (keys: listen, adminSocket,`},
		{"wrong type", "apiVersion: " + configAPIVersion + "\nkind: VirtletConfiguration\nallowWatchdogDump: sometimes\n", "key allowWatchdogDump: want a bool"},
		{"wrong type string", "apiVersion: " + configAPIVersion + "\nkind: VirtletConfiguration\nstateDir: [a]\n", "key stateDir: want a string"},
		{"not YAML", "apiVersion: [\n", "config "},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
		if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := parseConfig([]string{"--config", path})
		if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: got %v, want an error naming %s with %q", tc.name, err, path, tc.err)
		}
	}
}

// Every problem of a configuration is reported at once, each naming its
// key and flag.
func TestValidateReportsEveryProblem(t *testing.T) {
	path := writeConfig(t, "logFormat: xml\nlogLevel: loud\ndefaultVMMemory: lots\nmaxVirtualSize: -1\n")
	_, _, err := parseConfig([]string{"--config", path, "--cgroup-driver", "v2"})
	if err == nil {
		t.Fatal("a bad configuration was accepted")
	}
	for _, want := range []string{`logFormat (--log-format) "xml"`, `logLevel (--log-level) "loud"`, `defaultVMMemory (--default-vm-memory) "lots"`,
		`maxVirtualSize (--max-virtual-size) "-1"`, `cgroupDriver (--cgroup-driver) "v2"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not report %s", err, want)
		}
	}
}

// `virtlet config default` prints a file the daemon reads back as its
// defaults; `virtlet config validate` prints the configuration a file and
// flags make, or every problem and exit status 1.
func TestConfigCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := configCommand([]string{"default"}, &out, &errOut); code != 0 {
		t.Fatalf("config default: exit %d, %s", code, errOut.String())
	}
	path := filepath.Join(t.TempDir(), "default.yaml")
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	read, _, err := readConfigFile(path)
	if err != nil {
		t.Fatalf("config default's output: %v\n%s", err, out.String())
	}
	if want := defaults(); !reflect.DeepEqual(read, want) {
		t.Errorf("config default's output reads as\n%+v\nwant the defaults\n%+v", read, want)
	}
	for _, key := range configKeys() {
		if !strings.Contains(out.String(), "\n"+key+":") {
			t.Errorf("config default does not print %s", key)
		}
	}

	out.Reset()
	errOut.Reset()
	if code := configCommand([]string{"validate", "--config", path, "--log-level", "debug"}, &out, &errOut); code != 0 {
		t.Fatalf("config validate: exit %d, %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "\nlogLevel: debug\n") || !strings.Contains(out.String(), "\ncgroupDriver: ") {
		t.Errorf("config validate printed no resolved configuration with the flag applied:\n%s", out.String())
	}

	errOut.Reset()
	if code := configCommand([]string{"validate", "--config", path, "--log-format", "xml", "--vm-users", "x"}, &out, &errOut); code != 1 {
		t.Errorf("config validate of a bad configuration: exit %d, want 1", code)
	}
	for _, want := range []string{"logFormat (--log-format)", "vmUsers (--vm-users)"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("config validate's error %q does not name %s", errOut.String(), want)
		}
	}
	if code := configCommand([]string{"frobnicate"}, &out, &errOut); code != 2 {
		t.Errorf("config frobnicate: exit %d, want 2", code)
	}
}

// The shipped config file (make install writes it) is one the daemon
// accepts.
func TestShippedConfigIsValid(t *testing.T) {
	cfg, _, err := parseConfig([]string{"--config", filepath.Join("..", "..", "deploy", "node", "virtlet.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PluginsDir != "/etc/virtlet/plugins.d" {
		t.Errorf("shipped config read as %+v", cfg)
	}
}

const (
	referenceBegin = "<!-- BEGIN: generated from cmd/virtlet's config struct by `go test ./cmd/virtlet -run TestConfigReference -update` -->\n"
	referenceEnd   = "<!-- END: generated -->\n"
)

// docs/configuration.md's reference of keys is made from the config
// struct; this test fails when they differ (-update rewrites it).
func TestConfigReference(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "configuration.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := strings.Cut(string(doc), referenceBegin)
	_, after, ok2 := strings.Cut(rest, referenceEnd)
	if !ok || !ok2 {
		t.Fatalf("%s has no generated reference between %q and %q", path, referenceBegin, referenceEnd)
	}
	want := before + referenceBegin + configReference() + referenceEnd + after
	if want == string(doc) {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's reference is not the config struct's; run go test ./cmd/virtlet -run TestConfigReference -update", path)
}
