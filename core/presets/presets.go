// Package presets holds the operator's VM presets (KubeVirt's
// VirtualMachinePreset and instance types, for VM pods): named sets of
// Virtlet annotations and vCPU/memory defaults, which a pod selects by
// name (VirtletPreset) or which select pods by their labels. It is pure:
// the daemon reads the files, the core applies the presets to a pod.
package presets

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

// Preset is one preset file.
type Preset struct {
	// Name is how a pod selects it (VirtletPreset); unique on the node.
	Name string `json:"name"`
	// Selector, when set, applies the preset to every VM pod whose labels
	// it matches, as a Kubernetes label selector does.
	Selector *Selector `json:"selector,omitempty"`
	// Annotations are Virtlet annotations the pod gets unless it sets them
	// itself.
	Annotations map[string]string `json:"annotations,omitempty"`
	// VCPUs is VirtletVCPUCount's default.
	VCPUs int `json:"vcpus,omitempty"`
	// Memory is the VM's memory (a quantity such as 2Gi) when its container
	// has no memory limit.
	Memory string `json:"memory,omitempty"`

	memoryBytes int64
	source      string // the file, for errors
}

// Selector is a Kubernetes label selector: every matchLabels pair and
// every expression must hold.
type Selector struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []Requirement     `json:"matchExpressions,omitempty"`
}

// Requirement is one matchExpressions entry.
type Requirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"` // In, NotIn, Exists, DoesNotExist
	Values   []string `json:"values,omitempty"`
}

// Set is the node's presets.
type Set struct {
	byName map[string]*Preset
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Load reads preset files (file name → YAML). Every error names the file
// and what is wrong in it: a daemon with a bad preset does not start.
func Load(files map[string][]byte) (*Set, error) {
	s := &Set{byName: map[string]*Preset{}}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		p, err := parse(f, files[f])
		if err != nil {
			return nil, fmt.Errorf("preset file %s: %w", f, err)
		}
		if other, ok := s.byName[p.Name]; ok {
			return nil, fmt.Errorf("preset file %s: name %q is taken by %s: %w", f, p.Name, other.source, ports.ErrInvalidArgument)
		}
		s.byName[p.Name] = p
	}
	return s, nil
}

func parse(file string, data []byte) (*Preset, error) {
	var p Preset
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return nil, fmt.Errorf("%w: %w", err, ports.ErrInvalidArgument)
	}
	p.source = file
	if !nameRE.MatchString(p.Name) {
		return nil, fmt.Errorf("name %q: want a DNS label (lowercase letters, digits, '-'): %w", p.Name, ports.ErrInvalidArgument)
	}
	// Virtlet* keys are checked by the parser below (which names the one
	// meant); a preset sets nothing else.
	for k := range p.Annotations {
		if !strings.HasPrefix(k, "Virtlet") {
			return nil, fmt.Errorf("annotations: %q is not a Virtlet annotation (a preset sets only those; see README): %w", k, ports.ErrInvalidArgument)
		}
	}
	if _, ok := p.Annotations[annotations.Preset]; ok {
		return nil, fmt.Errorf("annotations: a preset cannot select another (%s): %w", annotations.Preset, ports.ErrInvalidArgument)
	}
	if p.VCPUs != 0 {
		if _, ok := p.Annotations[annotations.VCPUCount]; ok {
			return nil, fmt.Errorf("vcpus and annotation %s both set the vCPU count: %w", annotations.VCPUCount, ports.ErrInvalidArgument)
		}
	}
	if p.Memory != "" {
		n, err := annotations.ParseBytes(p.Memory)
		if err != nil {
			return nil, fmt.Errorf("memory %q: %v; want a quantity such as 2Gi: %w", p.Memory, err, ports.ErrInvalidArgument)
		}
		p.memoryBytes = n
	}
	// The values are checked as a pod's would be.
	if _, err := annotations.Parse(p.own()); err != nil {
		return nil, err
	}
	if sel := p.Selector; sel != nil {
		if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
			return nil, fmt.Errorf("selector: empty (it would select every VM pod; leave it out and select the preset by name): %w", ports.ErrInvalidArgument)
		}
		for i, r := range sel.MatchExpressions {
			if err := r.check(); err != nil {
				return nil, fmt.Errorf("selector.matchExpressions[%d]: %w", i, err)
			}
		}
	}
	return &p, nil
}

func (r Requirement) check() error {
	switch r.Operator {
	case "In", "NotIn":
		if len(r.Values) == 0 {
			return fmt.Errorf("operator %s needs values: %w", r.Operator, ports.ErrInvalidArgument)
		}
	case "Exists", "DoesNotExist":
		if len(r.Values) > 0 {
			return fmt.Errorf("operator %s takes no values: %w", r.Operator, ports.ErrInvalidArgument)
		}
	default:
		return fmt.Errorf("operator %q: want In, NotIn, Exists or DoesNotExist: %w", r.Operator, ports.ErrInvalidArgument)
	}
	if r.Key == "" {
		return fmt.Errorf("no key: %w", ports.ErrInvalidArgument)
	}
	return nil
}

// own is the annotations the preset gives, vcpus among them.
func (p *Preset) own() map[string]string {
	out := make(map[string]string, len(p.Annotations)+1)
	for k, v := range p.Annotations {
		out[k] = v
	}
	if p.VCPUs != 0 {
		out[annotations.VCPUCount] = strconv.Itoa(p.VCPUs)
	}
	return out
}

func (s *Selector) matches(labels map[string]string) bool {
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range s.MatchExpressions {
		v, ok := labels[r.Key]
		in := ok && slices.Contains(r.Values, v)
		switch r.Operator {
		case "In":
			if !in {
				return false
			}
		case "NotIn":
			if in {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		}
	}
	return true
}

// Names lists the presets.
func (s *Set) Names() []string {
	if s == nil {
		return nil
	}
	names := make([]string, 0, len(s.byName))
	for n := range s.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Applied is a pod's annotations with its presets' under them.
type Applied struct {
	// Annotations: the presets' annotations, then the pod's own over them.
	Annotations map[string]string
	// MemoryBytes is the presets' memory for a container without a memory
	// limit (0: none).
	MemoryBytes int64
	// Presets names the presets applied, in order.
	Presets []string
}

// Apply gives a pod its presets: the one its VirtletPreset names and every
// one whose selector matches its labels. Two presets that set one key to
// different values are an error naming both; the pod's own annotations,
// and its container's memory limit (memoryLimit, 0 for none), win over
// every preset.
func (s *Set) Apply(labels, podAnnotations map[string]string, memoryLimit int64) (Applied, error) {
	var chosen []*Preset
	if name, ok := podAnnotations[annotations.Preset]; ok {
		p, found := s.lookup(name)
		if !found {
			allowed := "one of the node's presets: " + strings.Join(s.Names(), ", ")
			if len(s.Names()) == 0 {
				allowed = "no preset: this node has none (the daemon's --presets-dir)"
			}
			return Applied{}, &ports.InvalidError{Field: "annotation " + annotations.Preset, Value: name,
				Reason: "no such preset on this node", Allowed: allowed}
		}
		chosen = append(chosen, p)
	}
	for _, n := range s.Names() {
		p := s.byName[n]
		if p.Selector != nil && p.Selector.matches(labels) && (len(chosen) == 0 || chosen[0] != p) {
			chosen = append(chosen, p)
		}
	}
	a := Applied{Annotations: map[string]string{}}
	from := map[string]string{} // key → the preset that set it
	var memoryFrom string
	for _, p := range chosen {
		a.Presets = append(a.Presets, p.Name)
		for k, v := range p.own() {
			if _, podSets := podAnnotations[k]; podSets {
				continue // the pod's own value wins over both
			}
			if prev, ok := a.Annotations[k]; ok && prev != v {
				return Applied{}, conflict(from[k], p.Name, k, prev, v)
			}
			a.Annotations[k], from[k] = v, p.Name
		}
		if p.memoryBytes != 0 && memoryLimit == 0 {
			if a.MemoryBytes != 0 && a.MemoryBytes != p.memoryBytes {
				return Applied{}, conflict(memoryFrom, p.Name, "memory", strconv.FormatInt(a.MemoryBytes, 10), strconv.FormatInt(p.memoryBytes, 10))
			}
			a.MemoryBytes, memoryFrom = p.memoryBytes, p.Name
		}
	}
	for k, v := range podAnnotations {
		a.Annotations[k] = v
	}
	return a, nil
}

func conflict(first, second, key, v1, v2 string) error {
	return &ports.InvalidError{Field: "presets " + first + " and " + second, Value: key,
		Reason:  fmt.Sprintf("both apply to the pod and set %s differently (%q, %q)", key, v1, v2),
		Allowed: "presets that agree, or the pod setting it itself (an annotation, or the container's memory limit)"}
}

func (s *Set) lookup(name string) (*Preset, bool) {
	if s == nil {
		return nil, false
	}
	p, ok := s.byName[name]
	return p, ok
}
