package presets

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func loadDir(t *testing.T, dir string) *Set {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = b
	}
	s, err := Load(files)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestApply merges testdata/presets into pods; each result (or error) is
// a golden file in testdata/apply.
func TestApply(t *testing.T) {
	set := loadDir(t, filepath.Join("testdata", "presets"))
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		memoryLimit int64
	}{
		{"none", map[string]string{"app": "db"}, map[string]string{"VirtletVCPUCount": "2"}, 0},
		{"by-name", nil, map[string]string{"VirtletPreset": "small"}, 0},
		{"by-label", map[string]string{"vm-class": "guarded"}, nil, 0},
		{"by-expression", map[string]string{"os": "windows-server"}, nil, 0},
		{"expression-excluded", map[string]string{"os": "windows", "legacy-bios": ""}, nil, 0},
		{"by-name-and-labels", map[string]string{"vm-class": "guarded", "os": "windows"}, map[string]string{"VirtletPreset": "q35"}, 0},
		{"pod-wins", nil, map[string]string{"VirtletPreset": "small", "VirtletVCPUCount": "2", "VirtletDiskDriver": "scsi"}, 0},
		{"conflict", map[string]string{"size": "big"}, map[string]string{"VirtletPreset": "small"}, 0},
		{"memory-conflict", map[string]string{"size": "big"}, map[string]string{"VirtletPreset": "small", "VirtletVCPUCount": "2"}, 0},
		{"conflicts-settled-by-the-pod", map[string]string{"size": "big"}, map[string]string{"VirtletPreset": "small", "VirtletVCPUCount": "2"}, 1 << 30},
		{"unknown-name", nil, map[string]string{"VirtletPreset": "huge"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []byte
			a, err := set.Apply(tc.labels, tc.annotations, tc.memoryLimit)
			if err != nil {
				if !errors.Is(err, ports.ErrInvalidArgument) {
					t.Errorf("error %v is not InvalidArgument", err)
				}
				got = []byte("error: " + err.Error() + "\n")
			} else {
				got, _ = json.MarshalIndent(a, "", "  ")
				got = append(got, '\n')
			}
			golden := filepath.Join("testdata", "apply", tc.name+".golden")
			if *update {
				os.MkdirAll(filepath.Dir(golden), 0o755)
				os.WriteFile(golden, got, 0o644)
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("got\n%s\nwant (%s; -update rewrites it)\n%s", got, golden, want)
			}
		})
	}
}

func TestNoPresets(t *testing.T) {
	var none *Set
	a, err := none.Apply(map[string]string{"a": "b"}, map[string]string{"VirtletVCPUCount": "2"}, 0)
	if err != nil || a.Annotations["VirtletVCPUCount"] != "2" || len(a.Presets) != 0 {
		t.Errorf("without presets: %+v %v", a, err)
	}
	_, err = none.Apply(nil, map[string]string{"VirtletPreset": "small"}, 0)
	if err == nil || !strings.Contains(err.Error(), "this node has none") {
		t.Errorf("a preset named on a node without presets: %v", err)
	}
}

// A bad preset file keeps the daemon from starting, naming the file.
func TestLoadRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"unknown field", map[string]string{"a.yaml": "name: a\nannotation: {}\n"}, []string{"preset file a.yaml", `unknown field "annotation"`}},
		{"bad name", map[string]string{"a.yaml": "name: Big_VM\n"}, []string{"preset file a.yaml", `name "Big_VM"`, "DNS label"}},
		{"taken name", map[string]string{"a.yaml": "name: x\n", "b.yaml": "name: x\n"}, []string{"preset file b.yaml", `name "x" is taken by a.yaml`}},
		{"unknown annotation", map[string]string{"a.yaml": "name: a\nannotations: {VirtletMachinType: q35}\n"},
			[]string{"preset file a.yaml", "annotation VirtletMachinType", "VirtletMachineType"}},
		{"not a Virtlet annotation", map[string]string{"a.yaml": "name: a\nannotations: {machineType: q35}\n"},
			[]string{"preset file a.yaml", `"machineType" is not a Virtlet annotation`}},
		{"bad value", map[string]string{"a.yaml": "name: a\nannotations: {VirtletWatchdog: ib700}\n"},
			[]string{"preset file a.yaml", "annotation VirtletWatchdog", "ib700"}},
		{"preset in a preset", map[string]string{"a.yaml": "name: a\nannotations: {VirtletPreset: b}\n"}, []string{"cannot select another"}},
		{"vcpus twice", map[string]string{"a.yaml": "name: a\nvcpus: 2\nannotations: {VirtletVCPUCount: \"4\"}\n"}, []string{"vcpus and annotation VirtletVCPUCount"}},
		{"bad memory", map[string]string{"a.yaml": "name: a\nmemory: lots\n"}, []string{`memory "lots"`, "2Gi"}},
		{"empty selector", map[string]string{"a.yaml": "name: a\nselector: {}\n"}, []string{"selector: empty"}},
		{"bad operator", map[string]string{"a.yaml": "name: a\nselector: {matchExpressions: [{key: k, operator: Equals, values: [v]}]}\n"},
			[]string{"selector.matchExpressions[0]", `operator "Equals"`}},
		{"In without values", map[string]string{"a.yaml": "name: a\nselector: {matchExpressions: [{key: k, operator: In}]}\n"},
			[]string{"operator In needs values"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string][]byte{}
			for n, c := range tc.files {
				files[n] = []byte(c)
			}
			_, err := Load(files)
			if err == nil || !errors.Is(err, ports.ErrInvalidArgument) {
				t.Fatalf("Load: %v, want an InvalidArgument error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
