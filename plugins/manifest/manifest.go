// Package manifest reads plugin manifests: one YAML file per plugin in a
// directory (default /etc/virtlet/plugins.d), or the set embedded in the
// daemon. Every problem stops start-up with an error naming the file and
// the field.
package manifest

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/ports"
)

// DefaultDir is where operators put manifests.
const DefaultDir = "/etc/virtlet/plugins.d"

// Manifest says how to run one plugin.
type Manifest struct {
	// Name identifies the plugin in logs, errors and its state directory.
	Name string `json:"name"`
	// Kind is the port the plugin serves.
	Kind ports.PluginKind `json:"kind"`
	// Command is the plugin binary: an absolute path, or a path relative
	// to the manifest's directory.
	Command string   `json:"command"`
	Args    []string `json:"args,omitempty"`
	// SHA256 is the binary's checksum, verified before every launch.
	SHA256 string `json:"sha256"`
	// Handles optionally restricts what the plugin is used for (volume
	// types, datasource names, image URL schemes); by default everything
	// it reports in PluginInfo.
	Handles []string `json:"handles,omitempty"`
	// Config is handed to the plugin as JSON.
	Config json.RawMessage `json:"config,omitempty"`

	// File is where the manifest was read from.
	File string `json:"-"`
}

// Error is a problem with one manifest.
type Error struct {
	File   string
	Field  string // "" when the problem concerns the whole file
	Reason string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("plugin manifest %s: %s", e.File, e.Reason)
	}
	return fmt.Sprintf("plugin manifest %s: field %s: %s", e.File, e.Field, e.Reason)
}

func (e *Error) Is(target error) bool { return target == ports.ErrInvalidArgument }

var (
	nameRE         = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	handleRE       = regexp.MustCompile(`^[a-z0-9][-a-z0-9.+_]*$`)
	sha256RE       = regexp.MustCompile(`^[0-9a-f]{64}$`)
	unknownFieldRE = regexp.MustCompile(`unknown field "([^"]+)"`)
	wrongTypeRE    = regexp.MustCompile(`Go struct field Manifest\.(\S+) of type (\S+)`)
)

// Parse reads one manifest. A relative command is resolved against baseDir.
func Parse(file string, data []byte, baseDir string) (Manifest, error) {
	var m Manifest
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		msg := err.Error()
		if sub := unknownFieldRE.FindStringSubmatch(msg); sub != nil {
			return m, &Error{File: file, Field: sub[1], Reason: "unknown field (known: name, kind, command, args, sha256, handles, config)"}
		}
		if sub := wrongTypeRE.FindStringSubmatch(msg); sub != nil {
			return m, &Error{File: file, Field: sub[1], Reason: "wrong type, want " + sub[2]}
		}
		return m, &Error{File: file, Reason: "not valid YAML: " + strings.TrimPrefix(msg, "error converting YAML to JSON: ")}
	}
	m.File = file
	if m.Command != "" && !filepath.IsAbs(m.Command) {
		m.Command = filepath.Join(baseDir, m.Command)
	}
	if err := m.validate(); err != nil {
		return m, err
	}
	return m, nil
}

func (m *Manifest) fail(field, format string, args ...interface{}) error {
	return &Error{File: m.File, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func (m *Manifest) validate() error {
	switch {
	case m.Name == "":
		return m.fail("name", "required")
	case !nameRE.MatchString(m.Name) || len(m.Name) > 63:
		return m.fail("name", "%q is not a lowercase name of letters, digits and '-'", m.Name)
	case m.Kind == "":
		return m.fail("kind", "required")
	case !m.Kind.Valid():
		return m.fail("kind", "unknown plugin kind %q (want one of %s)", m.Kind, kinds())
	case m.Command == "":
		return m.fail("command", "required")
	}
	for i, h := range m.Handles {
		if !handleRE.MatchString(h) {
			return m.fail(fmt.Sprintf("handles[%d]", i), "%q is not a lowercase name", h)
		}
	}
	if len(m.Config) > 0 && strings.TrimSpace(string(m.Config)) != "null" && !strings.HasPrefix(strings.TrimSpace(string(m.Config)), "{") {
		return m.fail("config", "must be a mapping")
	}
	info, err := os.Stat(m.Command)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return m.fail("command", "binary %s does not exist", m.Command)
	case err != nil:
		return m.fail("command", "%v", err)
	case info.IsDir() || info.Mode().Perm()&0o111 == 0:
		return m.fail("command", "%s is not an executable file", m.Command)
	}
	if err := OnlyOperatorWritable(m.Command); err != nil {
		return m.fail("command", "%v: the daemon runs it as root, so only root may change it", err)
	}
	// The file checked is the file run: a symlink on the way, changed
	// later, cannot swap it.
	resolved, err := filepath.EvalSymlinks(m.Command)
	if err != nil {
		return m.fail("command", "%v", err)
	}
	m.Command = resolved
	switch {
	case m.SHA256 == "":
		return m.fail("sha256", "required: the checksum of %s (sha256sum %s); the daemon runs only binaries an operator pinned", m.Command, m.Command)
	case !sha256RE.MatchString(m.SHA256):
		return m.fail("sha256", "%q is not 64 lowercase hex digits", m.SHA256)
	}
	sum, err := FileSHA256(m.Command)
	if err != nil {
		return m.fail("command", "%v", err)
	}
	if sum != m.SHA256 {
		return m.fail("sha256", "checksum mismatch: %s has sha256 %s, the manifest pins %s", m.Command, sum, m.SHA256)
	}
	return nil
}

func kinds() string {
	var ks []string
	for _, k := range ports.PluginKinds {
		ks = append(ks, string(k))
	}
	return strings.Join(ks, ", ")
}

// OnlyOperatorWritable fails unless the file at p (its target, if a
// symlink) and every directory above it can be changed by root, or the
// daemon's own user, alone: owned by one of them, not writable by group or
// others. A sticky directory higher up, such as /tmp, may be: nobody else
// can rename or remove what root owns in it. The file's own directory may
// not: others could add files to it (a manifest naming any binary).
func OnlyOperatorWritable(p string) error {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return err
	}
	real, err = filepath.Abs(real)
	if err != nil {
		return err
	}
	self := uint32(os.Geteuid())
	for cur := real; ; cur = filepath.Dir(cur) {
		info, err := os.Stat(cur)
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no owner to check", cur)
		}
		above := cur != real && cur != filepath.Dir(real)
		sticky := info.IsDir() && info.Mode()&os.ModeSticky != 0
		switch {
		case st.Uid != 0 && st.Uid != self:
			return fmt.Errorf("%s belongs to user %d", cur, st.Uid)
		case info.Mode().Perm()&0o022 != 0 && !(sticky && above):
			return fmt.Errorf("%s is writable by its group or others (%s)", cur, info.Mode().Perm())
		}
		if cur == filepath.Dir(cur) {
			return nil
		}
	}
}

// FileSHA256 returns the hex sha256 of a file.
func FileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("checksum %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// LoadDir reads every *.yaml / *.yml file of dir, in name order, and checks
// the set. A missing dir is reported as fs.ErrNotExist so that the caller
// can fall back to the embedded set.
func LoadDir(dir string) ([]Manifest, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read plugin manifest directory %s: %w", dir, err)
	}
	var out []Manifest
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			continue
		}
		file := filepath.Join(dir, e.Name())
		if err := OnlyOperatorWritable(file); err != nil {
			return nil, &Error{File: file, Reason: err.Error() + ": a manifest says what the daemon runs as root, so only root may change it"}
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, &Error{File: file, Reason: err.Error()}
		}
		m, err := Parse(file, data, dir)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if err := CheckSet(out); err != nil {
		return nil, err
	}
	return out, nil
}

//go:embed defaults
var defaultsFS embed.FS

// Defaults returns the embedded manifests, with commands resolved against
// binDir. sums holds the checksums embedded at build time, by manifest
// name; for a plugin without one the binary's current checksum is used and
// its name returned in unpinned.
func Defaults(binDir string, sums map[string]string) (ms []Manifest, unpinned []string, err error) {
	entries, err := fs.ReadDir(defaultsFS, "defaults")
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		data, err := defaultsFS.ReadFile(path.Join("defaults", e.Name()))
		if err != nil {
			return nil, nil, err
		}
		m, err := parseDefault("<embedded>/"+e.Name(), data, binDir, sums)
		if err != nil {
			return nil, nil, err
		}
		if sums[m.Name] == "" {
			unpinned = append(unpinned, m.Name)
		}
		ms = append(ms, m)
	}
	return ms, unpinned, CheckSet(ms)
}

// DefaultFile is an embedded manifest's name and relative command.
type DefaultFile struct {
	Name    string
	Command string
}

// DefaultFiles lists the plugins of the embedded set (for packaging and tests).
func DefaultFiles() ([]DefaultFile, error) {
	entries, err := fs.ReadDir(defaultsFS, "defaults")
	if err != nil {
		return nil, err
	}
	var out []DefaultFile
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		data, err := defaultsFS.ReadFile(path.Join("defaults", e.Name()))
		if err != nil {
			return nil, err
		}
		var m Manifest
		if err := yaml.Unmarshal(data, &m); err != nil {
			return nil, &Error{File: "<embedded>/" + e.Name(), Reason: err.Error()}
		}
		out = append(out, DefaultFile{Name: m.Name, Command: m.Command})
	}
	return out, nil
}

// parseDefault parses an embedded manifest, filling in its checksum.
func parseDefault(file string, data []byte, binDir string, sums map[string]string) (Manifest, error) {
	var probe Manifest
	if err := yaml.Unmarshal(data, &probe); err != nil {
		return probe, &Error{File: file, Reason: err.Error()}
	}
	cmd := probe.Command
	if !filepath.IsAbs(cmd) {
		cmd = filepath.Join(binDir, cmd)
	}
	sum := sums[probe.Name]
	if sum == "" {
		var err error
		if sum, err = FileSHA256(cmd); err != nil {
			return probe, &Error{File: file, Field: "command", Reason: fmt.Sprintf("plugin shipped with the daemon is missing: %v", err)}
		}
	}
	var m map[string]interface{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		return probe, &Error{File: file, Reason: err.Error()}
	}
	m["sha256"] = sum
	filled, err := json.Marshal(m)
	if err != nil {
		return probe, err
	}
	return Parse(file, filled, binDir)
}

// CheckSet checks manifests against each other: unique names, exactly one
// hypervisor, at most one network plugin, and no two plugins claiming the
// same handle.
func CheckSet(ms []Manifest) error {
	names := map[string]string{}
	claims := map[string]string{} // kind/handle -> file
	var hypervisors, networks []string
	for _, m := range ms {
		if prev, ok := names[m.Name]; ok {
			return &Error{File: m.File, Field: "name", Reason: fmt.Sprintf("%q is also the name of the plugin in %s", m.Name, prev)}
		}
		names[m.Name] = m.File
		switch m.Kind {
		case ports.KindHypervisor:
			hypervisors = append(hypervisors, m.File)
		case ports.KindNetwork:
			networks = append(networks, m.File)
		}
		for i, h := range m.Handles {
			key := string(m.Kind) + "/" + h
			if prev, ok := claims[key]; ok {
				return &Error{File: m.File, Field: fmt.Sprintf("handles[%d]", i),
					Reason: fmt.Sprintf("%s %q is already handled by the plugin in %s", m.Kind, h, prev)}
			}
			claims[key] = m.File
		}
	}
	if len(hypervisors) > 1 {
		sort.Strings(hypervisors)
		return &Error{File: hypervisors[1], Field: "kind", Reason: "a second hypervisor plugin (the first is in " + hypervisors[0] + "); a node runs one hypervisor"}
	}
	if len(networks) > 1 {
		sort.Strings(networks)
		return &Error{File: networks[1], Field: "kind", Reason: "a second network plugin (the first is in " + networks[0] + ")"}
	}
	return nil
}

// RequireHypervisor fails when a set has no hypervisor plugin.
func RequireHypervisor(ms []Manifest, source string) error {
	for _, m := range ms {
		if m.Kind == ports.KindHypervisor {
			return nil
		}
	}
	return fmt.Errorf("no hypervisor plugin among the plugin manifests of %s: add a manifest of kind hypervisor", source)
}
