// Package flexopts checks the options of Virtlet flexvolumes the way every
// volume plugin needs: a schema of known options (kubelet's own
// kubernetes.io/ keys pass), errors naming the option, and Virtlet's
// capacity sizes.
package flexopts

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/virtlet/virtlet/ports"
)

// KubeletPrefix starts the keys kubelet adds to a flexvolume's options
// (kubernetes.io/fsType, kubernetes.io/pod.name, ...).
const KubeletPrefix = "kubernetes.io/"

// FSTypeKey is kubelet's key for the flexVolume's fsType.
const FSTypeKey = KubeletPrefix + "fsType"

// Schema lists a volume type's options.
type Schema struct {
	Type     string
	Required []string
	Optional []string
}

// Check refuses unknown and missing options, naming the volume and the
// option.
func (s Schema) Check(volume string, opts map[string]string) error {
	known := map[string]bool{}
	for _, k := range append(append([]string{}, s.Required...), s.Optional...) {
		known[k] = true
	}
	var unknown []string
	for k := range opts {
		if !known[k] && k != "type" && !strings.HasPrefix(k, KubeletPrefix) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	if len(unknown) > 0 {
		return &ports.InvalidError{Field: s.field(volume, unknown[0]), Reason: "unknown option", Allowed: s.allowed()}
	}
	for _, k := range s.Required {
		if strings.TrimSpace(opts[k]) == "" {
			return &ports.InvalidError{Field: s.field(volume, k), Reason: "missing", Allowed: s.allowed()}
		}
	}
	return nil
}

func (s Schema) field(volume, option string) string {
	return fmt.Sprintf("%s volume %s option %s", s.Type, volume, option)
}

// Invalid is an error about one option of a volume.
func (s Schema) Invalid(volume, option, value, reason, allowed string) error {
	return &ports.InvalidError{Field: s.field(volume, option), Value: value, Reason: reason, Allowed: allowed}
}

func (s Schema) allowed() string {
	var parts []string
	for _, k := range s.Required {
		parts = append(parts, k+" (required)")
	}
	parts = append(parts, s.Optional...)
	if len(parts) == 0 {
		return "no options"
	}
	return "the options " + strings.Join(parts, ", ")
}

// Own returns the options of the schema and the flexVolume's fsType,
// without kubelet's other keys.
func (s Schema) Own(opts map[string]string) map[string]string {
	out := map[string]string{}
	for _, k := range append(append([]string{FSTypeKey}, s.Required...), s.Optional...) {
		if v, ok := opts[k]; ok {
			out[k] = v
		}
	}
	return out
}

var capacityRE = regexp.MustCompile(`^\s*(\d+)\s*([A-Za-z]*)\s*$`)

// capacityUnits are libvirt's storage units (as Virtlet accepted them:
// KB is 1000 bytes, K and KiB 1024) and Kubernetes' binary suffixes.
var capacityUnits = map[string]int64{
	"": 1, "B": 1, "bytes": 1,
	"KB": 1e3, "K": 1 << 10, "KiB": 1 << 10, "Ki": 1 << 10,
	"MB": 1e6, "M": 1 << 20, "MiB": 1 << 20, "Mi": 1 << 20,
	"GB": 1e9, "G": 1 << 30, "GiB": 1 << 30, "Gi": 1 << 30,
	"TB": 1e12, "T": 1 << 40, "TiB": 1 << 40, "Ti": 1 << 40,
	"PB": 1e15, "P": 1 << 50, "PiB": 1 << 50, "Pi": 1 << 50,
	"EB": 1e18, "E": 1 << 60, "EiB": 1 << 60, "Ei": 1 << 60,
}

// CapacityAllowed describes what Capacity accepts.
const CapacityAllowed = "a whole number with an optional unit: B, KB, K, KiB, MB, M, MiB, GB, G, GiB, TB, T, TiB (KB = 1000 bytes, K = KiB = 1024), or Ki, Mi, Gi, Ti"

// Capacity parses a size such as "1024MB" or "2048MiB".
func Capacity(s string) (int64, error) {
	m := capacityRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("not a size")
	}
	unit, ok := capacityUnits[m[2]]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q", m[2])
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/unit {
		return 0, fmt.Errorf("not a positive size that fits in 63 bits")
	}
	return n * unit, nil
}

// FSTypes are the file systems a plugin may ask the guest to make.
var FSTypes = []string{"ext4", "ext3", "ext2", "xfs", "btrfs"}

// FSType returns kubelet's fsType option (the flexVolume's fsType) or def,
// refusing types the guest is not asked to make.
func (s Schema) FSType(volume string, opts map[string]string, def string) (string, error) {
	t := strings.TrimSpace(opts[FSTypeKey])
	if t == "" {
		return def, nil
	}
	for _, ok := range FSTypes {
		if t == ok {
			return t, nil
		}
	}
	return "", &ports.InvalidError{Field: fmt.Sprintf("%s volume %s fsType", s.Type, volume), Value: t, Allowed: strings.Join(FSTypes, ", ")}
}
