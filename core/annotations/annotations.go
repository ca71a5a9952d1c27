// Package annotations turns the annotations of a VM pod into typed VM
// options, with Virtlet's names and defaults (docs/vm-pods.md lists them), and
// refuses bad values with errors that name the annotation, the value and
// what is allowed.
package annotations

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/ports"
)

// Annotation keys recognised on VM pods.
const (
	TargetRuntime      = "kubernetes.io/target-runtime"
	TargetRuntimeValue = "virtlet.cloud"

	VCPUCount                       = "VirtletVCPUCount"
	DiskDriver                      = "VirtletDiskDriver"
	CPUModel                        = "VirtletCPUModel"
	LibvirtCPUSetting               = "VirtletLibvirtCPUSetting"
	CloudInitImageType              = "VirtletCloudInitImageType"
	CloudInitMetaData               = "VirtletCloudInitMetaData"
	CloudInitUserData               = "VirtletCloudInitUserData"
	CloudInitUserDataOverwrite      = "VirtletCloudInitUserDataOverwrite"
	CloudInitUserDataScript         = "VirtletCloudInitUserDataScript"
	CloudInitUserDataSource         = "VirtletCloudInitUserDataSource"
	CloudInitUserDataSourceKey      = "VirtletCloudInitUserDataSourceKey"
	CloudInitUserDataSourceEncoding = "VirtletCloudInitUserDataSourceEncoding"
	SSHKeys                         = "VirtletSSHKeys"
	SSHKeySource                    = "VirtletSSHKeySource"
	FilesFromDataSource             = "VirtletFilesFromDataSource"
	RootVolumeSize                  = "VirtletRootVolumeSize"
	Chown9pfsMounts                 = "VirtletChown9pfsMounts"
	SystemUUID                      = "VirtletSystemUUID"
	ForceDHCPNetworkConfig          = "VirtletForceDHCPNetworkConfig"
	// PersistentRootfsReinit lets a pod overwrite a persistent root
	// filesystem that holds another image (or data that is not one).
	PersistentRootfsReinit = "VirtletPersistentRootfsReinit"
	// MachineType is the VM's machine type: pc (the default), q35, or a
	// versioned one the node's QEMU offers.
	MachineType = "VirtletMachineType"
	// Clock is the guest's hardware clock: utc (the default), localtime
	// (the node's zone), an IANA time zone, or a signed offset from UTC in
	// seconds.
	Clock = "VirtletClock"
	// ClockTimers tunes the guest's timers: name:policy pairs, comma
	// separated (rtc and pit take a tick policy, every timer yes or no).
	ClockTimers = "VirtletClockTimers"
	// Watchdog adds a watchdog device: i6300esb, or itco (q35 machines).
	Watchdog = "VirtletWatchdog"
	// CPUTopology lays the vCPUs out: sockets=S,cores=C,threads=T (each
	// 1 when left out), S×C×T being the vCPU count.
	CPUTopology = "VirtletCPUTopology"
	// WatchdogAction is what the watchdog does when the guest stops petting
	// it: reset (the default), poweroff, shutdown or dump.
	WatchdogAction = "VirtletWatchdogAction"
	// Preset names the operator's preset the pod starts from (core/presets
	// applies it before these annotations are parsed).
	Preset = "VirtletPreset"
	// Firmware is the VM's firmware: bios (the default) or uefi (OVMF, with
	// an NVRAM store of the VM's own).
	Firmware = "VirtletFirmware"
	// SecureBoot, "true", makes a UEFI q35 VM boot with Secure Boot on and
	// Microsoft's keys enrolled.
	SecureBoot = "VirtletSecureBoot"
	// MaxMemory is the most memory the VM can be resized to while it runs
	// (in-place pod resize through the balloon); the default is its memory.
	MaxMemory = "VirtletMaxMemory"
	// HyperV, "true", gives the guest Hyper-V enlightenments (paravirtual
	// interfaces Windows uses under a hypervisor) and the Hyper-V clock.
	HyperV = "VirtletHyperV"
	// MaxVCPUCount is the most vCPUs the VM can have while it runs: with
	// it, the VM's vCPU count follows its container's CPU limit (rounded
	// up, at least VirtletVCPUCount), and an in-place resize of the limit
	// hot-plugs or unplugs vCPUs.
	MaxVCPUCount = "VirtletMaxVCPUCount"
	// MemorySharing, "false", keeps the host from merging the VM's memory
	// pages with other VMs' (KSM).
	MemorySharing = "VirtletMemorySharing"
	// MigrateFrom makes the pod the receiving end of a live migration
	// (virtletctl migrate writes it): JSON naming the migrating VM, its
	// pod and node (MigrationSource).
	MigrateFrom = "VirtletMigrateFrom"
)

// MaxVCPUs is the largest VirtletVCPUCount accepted.
const MaxVCPUs = 255

// Cloud-init image types.
const (
	ImageTypeNoCloud     = "nocloud"
	ImageTypeConfigDrive = "configdrive"
)

// Encodings of a user-data source key.
const (
	EncodingPlain  = "plain"
	EncodingBase64 = "base64"
)

// DefaultSSHKeyName is the key read from a VirtletSSHKeySource object when
// the annotation names none.
const DefaultSSHKeyName = "authorized_keys"

// ObjectKind is the kind of Kubernetes object a data-source annotation names.
type ObjectKind string

const (
	ConfigMap ObjectKind = "configmap"
	Secret    ObjectKind = "secret"
)

// ObjectRef names a ConfigMap or Secret in the pod's namespace, and
// optionally one of its keys.
type ObjectRef struct {
	Kind ObjectKind `json:"kind"`
	Name string     `json:"name"`
	Key  string     `json:"key,omitempty"`
}

func (r ObjectRef) String() string {
	s := string(r.Kind) + "/" + r.Name
	if r.Key != "" {
		s += "/" + r.Key
	}
	return s
}

// VMOptions are a VM pod's annotations, parsed and defaulted.
type VMOptions struct {
	VCPUCount int `json:"vcpuCount"`
	// MaxVCPUCount: VirtletMaxVCPUCount (0: the vCPU count is fixed).
	MaxVCPUCount int               `json:"maxVCPUCount,omitempty"`
	DiskDriver   ports.DiskBus     `json:"diskDriver"`
	CPUModel     string            `json:"cpuModel,omitempty"`
	CPUSetting   *ports.CPUSetting `json:"cpuSetting,omitempty"`
	// MachineType: "" for pc; the hypervisor checks that its QEMU has it.
	MachineType string `json:"machineType,omitempty"`
	// Firmware: "" for BIOS, or ports.FirmwareUEFI.
	Firmware   string `json:"firmware,omitempty"`
	SecureBoot bool   `json:"secureBoot,omitempty"`
	// HyperV: VirtletHyperV.
	HyperV bool `json:"hyperV,omitempty"`
	// Clock is the guest's clock and timers (zero: UTC, the hypervisor's
	// timers).
	Clock ports.ClockSpec `json:"clock,omitempty"`
	// Watchdog is the VM's watchdog device; nil: none.
	Watchdog *ports.Watchdog `json:"watchdog,omitempty"`

	CloudInitImageType string `json:"cloudInitImageType"`
	// MetaData overrides keys of the generated meta-data.
	MetaData map[string]interface{} `json:"metaData,omitempty"`
	// UserData is merged into the generated user-data.
	UserData          map[string]interface{} `json:"userData,omitempty"`
	UserDataOverwrite bool                   `json:"userDataOverwrite,omitempty"`
	// UserDataScript, when set, replaces the user-data entirely.
	UserDataScript         string     `json:"userDataScript,omitempty"`
	UserDataSource         *ObjectRef `json:"userDataSource,omitempty"`
	UserDataSourceEncoding string     `json:"userDataSourceEncoding"`

	SSHKeys      []string   `json:"sshKeys,omitempty"`
	SSHKeySource *ObjectRef `json:"sshKeySource,omitempty"`

	FilesFromDataSource *ObjectRef `json:"filesFromDataSource,omitempty"`

	// RootVolumeSize in bytes; 0 when not set.
	RootVolumeSize int64 `json:"rootVolumeSize,omitempty"`
	// MaxMemoryBytes: VirtletMaxMemory (0: the VM's memory).
	MaxMemoryBytes  int64  `json:"maxMemoryBytes,omitempty"`
	Chown9pfsMounts bool   `json:"chown9pfsMounts,omitempty"`
	SystemUUID      string `json:"systemUUID,omitempty"`
	ForceDHCP       bool   `json:"forceDHCPNetworkConfig,omitempty"`
	// RootfsReinit allows overwriting a persistent root filesystem that
	// holds something else than the pod's image.
	RootfsReinit bool `json:"persistentRootfsReinit,omitempty"`
	// NoMemorySharing: VirtletMemorySharing "false".
	NoMemorySharing bool `json:"noMemorySharing,omitempty"`
	// MigrateFrom: VirtletMigrateFrom (nil: the VM boots).
	MigrateFrom *MigrationSource `json:"migrateFrom,omitempty"`
}

// MigrationSource is the VM a receiving pod's VM comes from, as
// VirtletMigrateFrom names it.
type MigrationSource struct {
	Pod    string   `json:"pod"`    // namespace/name
	UID    string   `json:"uid"`    // the pod's UID
	Node   string   `json:"node"`   // the node it runs on
	Domain string   `json:"domain"` // its domain's name
	UUID   string   `json:"uuid"`   // its domain's UUID
	MACs   []string `json:"macs"`   // its NICs' MACs, in order
}

// Defaults returns the options of a VM pod without Virtlet annotations.
func Defaults() VMOptions {
	return VMOptions{
		VCPUCount:              1,
		DiskDriver:             ports.BusSCSI,
		CloudInitImageType:     ImageTypeNoCloud,
		UserDataSourceEncoding: EncodingPlain,
	}
}

// Parse reads every Virtlet annotation. All problems are reported together,
// each as a *ports.InvalidError naming its annotation; errors.Is(err,
// ports.ErrInvalidArgument) holds for the result.
func Parse(annotations map[string]string) (VMOptions, error) {
	p := parser{values: annotations, opts: Defaults()}
	p.unknown()
	p.vcpus()
	p.maxVCPUs()
	p.diskDriver()
	p.cpu()
	p.cpuTopology()
	p.machineType()
	p.clock()
	p.watchdog()
	p.firmware()
	p.cloudInit()
	p.sshKeys()
	p.files()
	p.rootVolume()
	p.maxMemory()
	p.misc()
	p.migrateFrom()
	if len(p.errs) == 0 {
		return p.opts, nil
	}
	sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].Field < p.errs[j].Field })
	errs := make([]error, len(p.errs))
	for i, e := range p.errs {
		errs[i] = e
	}
	return VMOptions{}, &Error{errs: errs}
}

// Error lists every invalid annotation of a pod.
type Error struct{ errs []error }

func (e *Error) Error() string {
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

// Unwrap exposes the individual *ports.InvalidError values.
func (e *Error) Unwrap() []error { return e.errs }

type parser struct {
	values map[string]string
	opts   VMOptions
	errs   []*ports.InvalidError
}

func (p *parser) fail(key, value, allowed, reason string) {
	p.errs = append(p.errs, &ports.InvalidError{
		Field: "annotation " + key, Value: quotable(key, value), Allowed: allowed, Reason: reason,
	})
}

// mayHoldSecrets are the annotations whose values may carry passwords or
// keys (user-data, meta-data, scripts, SSH keys): an error, which reaches
// the daemon's log and kubectl describe, never quotes them.
var mayHoldSecrets = map[string]bool{
	CloudInitUserData: true, CloudInitMetaData: true, CloudInitUserDataScript: true, SSHKeys: true,
}

// quotable is what an error may quote of an annotation's value: an
// abbreviation, or nothing for an annotation that may hold secrets or
// that is unknown (a misspelt user-data annotation is still user-data).
func quotable(key, value string) string {
	known := false
	for _, k := range Known {
		known = known || k == key
	}
	if mayHoldSecrets[key] || !known {
		return ""
	}
	return abbreviate(value)
}

// get returns the annotation's value and whether it is set to something
// other than blanks.
func (p *parser) get(key string) (string, bool) {
	v, ok := p.values[key]
	if !ok || strings.TrimSpace(v) == "" {
		return v, false
	}
	return v, true
}

// strictBool reads one of our own annotations that take "true" or
// "false" (unset: false); anything else fails naming the annotation.
func (p *parser) strictBool(key string) bool {
	v, ok := p.get(key)
	switch {
	case !ok || v == "false":
		return false
	case v == "true":
		return true
	}
	p.fail(key, v, "true or false", "")
	return false
}

// boolean follows Virtlet's rule: only the lowercase string "true" is true,
// every other value is false.
func (p *parser) boolean(key string) bool {
	return p.values[key] == "true"
}

func (p *parser) unknown() {
	known := make(map[string]bool, len(Known))
	for _, k := range Known {
		known[k] = true
	}
	for key, value := range p.values {
		if !strings.HasPrefix(key, "Virtlet") || known[key] {
			continue
		}
		allowed := "one of the Virtlet annotations"
		if s := suggest(key); s != "" {
			allowed = "did you mean " + s + "?"
		}
		p.errs = append(p.errs, &ports.InvalidError{
			Field: "annotation " + key, Value: quotable(key, value),
			Reason: "unknown Virtlet annotation", Allowed: allowed,
		})
	}
}

func (p *parser) vcpus() {
	v, ok := p.get(VCPUCount)
	if !ok {
		return
	}
	const allowed = "an integer from 1 to 255"
	n, err := strconv.Atoi(strings.TrimSpace(v))
	switch {
	case err != nil:
		p.fail(VCPUCount, v, allowed, "not an integer")
	case n < 1 || n > MaxVCPUs:
		p.fail(VCPUCount, v, allowed, "out of range")
	default:
		p.opts.VCPUCount = n
	}
}

// maxVCPUs runs after vcpus.
func (p *parser) maxVCPUs() {
	v, ok := p.get(MaxVCPUCount)
	if !ok {
		return
	}
	allowed := fmt.Sprintf("an integer from the vCPU count (%s, %d) to %d", VCPUCount, p.opts.VCPUCount, MaxVCPUs)
	n, err := strconv.Atoi(strings.TrimSpace(v))
	switch {
	case err != nil:
		p.fail(MaxVCPUCount, v, allowed, "not an integer")
	case n < p.opts.VCPUCount || n > MaxVCPUs:
		p.fail(MaxVCPUCount, v, allowed, "out of range")
	default:
		p.opts.MaxVCPUCount = n
	}
}

// machineNames are QEMU's machine type names (pc, q35, pc-q35-7.2,
// pc-i440fx-7.2, ...): whether the node's QEMU has the one asked for is
// the hypervisor's to say, when the VM is defined.
var machineNames = regexp.MustCompile(`^[a-z][a-z0-9._-]{0,63}$`)

func (p *parser) machineType() {
	v, ok := p.get(MachineType)
	if !ok {
		return
	}
	if !machineNames.MatchString(v) {
		p.fail(MachineType, v, "pc, q35, or a machine type of the node's QEMU such as pc-q35-7.2 (lower-case letters, digits, '.', '_', '-')", "")
		return
	}
	p.opts.MachineType = v
}

// clockTimers are the timers VirtletClockTimers tunes and the tick policies
// each takes (hpet and kvmclock: present or not only).
var clockTimers = map[string][]string{
	"rtc": {"delay", "catchup"}, "pit": {"delay", "catchup", "discard"}, "hpet": nil, "kvmclock": nil,
}

const maxClockOffset = 100 * 365 * 24 * 3600 // a century, in seconds

func (p *parser) clock() {
	if v, ok := p.get(Clock); ok {
		switch s := strings.TrimSpace(v); {
		case s == "utc" || s == "localtime":
			p.opts.Clock.Offset = s
		case strings.HasPrefix(s, "+") || strings.HasPrefix(s, "-"):
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n > maxClockOffset || n < -maxClockOffset {
				p.fail(Clock, v, "utc, localtime, a time zone such as Europe/Berlin, or a signed offset in seconds such as +3600", "not an offset within a century")
				break
			}
			p.opts.Clock.Offset, p.opts.Clock.AdjustmentSeconds = "variable", n
		default:
			if _, err := time.LoadLocation(s); err != nil || s == "" || s == "Local" {
				p.fail(Clock, v, "utc, localtime, a time zone such as Europe/Berlin, or a signed offset in seconds such as +3600", "no such time zone on the node")
				break
			}
			p.opts.Clock.Offset, p.opts.Clock.Timezone = "timezone", s
		}
	}
	v, ok := p.get(ClockTimers)
	if !ok {
		return
	}
	names := make([]string, 0, len(clockTimers))
	for n := range clockTimers {
		names = append(names, n)
	}
	sort.Strings(names)
	seen := map[string]bool{}
	for _, item := range strings.Split(v, ",") {
		name, policy, found := strings.Cut(strings.TrimSpace(item), ":")
		policies, known := clockTimers[name]
		switch {
		case !found || !known:
			p.fail(ClockTimers, v, "comma-separated name:policy pairs, names "+strings.Join(names, ", "), fmt.Sprintf("%q is not one", strings.TrimSpace(item)))
			return
		case seen[name]:
			p.fail(ClockTimers, v, "each timer once", name+" is given twice")
			return
		case policy == "yes" || policy == "no":
			p.opts.Clock.Timers = append(p.opts.Clock.Timers, ports.ClockTimer{Name: name, Present: policy})
		case contains(policies, policy):
			p.opts.Clock.Timers = append(p.opts.Clock.Timers, ports.ClockTimer{Name: name, TickPolicy: policy})
		default:
			p.fail(ClockTimers, v, name+": "+strings.Join(append(append([]string(nil), policies...), "yes", "no"), ", "), fmt.Sprintf("%s takes no policy %q", name, policy))
			return
		}
		seen[name] = true
	}
}

var (
	watchdogModels  = []string{"i6300esb", "itco"}
	watchdogActions = []string{"reset", "poweroff", "shutdown", "dump"}
)

// q35Machine: iTCO is the Q35 chipset's own watchdog.
func q35Machine(m string) bool { return m == "q35" || strings.HasPrefix(m, "pc-q35-") }

func (p *parser) watchdog() {
	model, hasModel := p.get(Watchdog)
	action, hasAction := p.get(WatchdogAction)
	switch {
	case !hasModel && hasAction:
		p.fail(WatchdogAction, action, "an action together with "+Watchdog, "no "+Watchdog+" is set")
		return
	case !hasModel:
		return
	case !contains(watchdogModels, model):
		p.fail(Watchdog, model, strings.Join(watchdogModels, " or "), "")
		return
	case model == "itco" && !q35Machine(p.opts.MachineType):
		p.fail(Watchdog, model, "i6300esb, or itco with "+MachineType+" q35", "itco is the Q35 chipset's watchdog")
		return
	}
	if !hasAction {
		action = "reset"
	} else if !contains(watchdogActions, action) {
		p.fail(WatchdogAction, action, strings.Join(watchdogActions, ", "), "")
		return
	}
	p.opts.Watchdog = &ports.Watchdog{Model: model, Action: action}
}

func (p *parser) firmware() {
	if v, ok := p.get(Firmware); ok {
		switch v {
		case "bios":
		case ports.FirmwareUEFI:
			p.opts.Firmware = v
		default:
			p.fail(Firmware, v, "bios or uefi", "")
		}
	}
	p.opts.HyperV = p.strictBool(HyperV)
	v, _ := p.get(SecureBoot)
	switch {
	case !p.strictBool(SecureBoot):
	case p.opts.Firmware != ports.FirmwareUEFI:
		p.fail(SecureBoot, v, "true together with "+Firmware+" uefi", "Secure Boot is a UEFI feature")
	case !q35Machine(p.opts.MachineType):
		p.fail(SecureBoot, v, "true together with "+MachineType+" q35", "OVMF's Secure Boot needs SMM, which the Q35 machine has")
	default:
		p.opts.SecureBoot = true
	}
}

func (p *parser) diskDriver() {
	v, ok := p.get(DiskDriver)
	if !ok {
		return
	}
	switch ports.DiskBus(v) {
	case ports.BusSCSI, ports.BusVirtio:
		p.opts.DiskDriver = ports.DiskBus(v)
	default:
		p.fail(DiskDriver, v, `"scsi" or "virtio"`, "")
	}
}

var (
	cpuModes     = []string{"custom", "host-model", "host-passthrough", "maximum"}
	cpuMatches   = []string{"minimum", "exact", "strict"}
	cpuChecks    = []string{"none", "partial", "full"}
	cpuFallbacks = []string{"allow", "forbid"}
	cpuPolicies  = []string{"force", "require", "optional", "disable", "forbid"}
	cacheModes   = []string{"emulate", "passthrough", "disable"}
	onOff        = []string{"on", "off"}
)

func (p *parser) cpu() {
	if v, ok := p.get(CPUModel); ok {
		if v == "host-model" {
			p.opts.CPUModel = v
		} else {
			p.fail(CPUModel, v, `"" or "host-model"`, "")
		}
	}
	v, ok := p.get(LibvirtCPUSetting)
	if !ok {
		return
	}
	var s ports.CPUSetting
	if err := yaml.UnmarshalStrict([]byte(v), &s); err != nil {
		p.fail(LibvirtCPUSetting, v, "YAML of libvirt's <cpu> element with capitalised keys (Mode, Match, Check, Model: {Fallback, VendorID, Value}, Vendor, Topology, Features: [{Policy, Name}], Cache, Numa)", yamlReason(err))
		return
	}
	check := func(field, value string, allowed []string) bool {
		if value == "" || contains(allowed, value) {
			return true
		}
		p.fail(LibvirtCPUSetting, value, "one of "+strings.Join(allowed, ", "), field+" is not valid")
		return false
	}
	good := check("Mode", s.Mode, cpuModes) && check("Match", s.Match, cpuMatches) &&
		check("Check", s.Check, cpuChecks) && check("Migratable", s.Migratable, onOff)
	if s.Model != nil {
		good = check("Model.Fallback", s.Model.Fallback, cpuFallbacks) && good
	}
	for i, f := range s.Features {
		if f.Name == "" {
			p.fail(LibvirtCPUSetting, v, "a Name for every feature", fmt.Sprintf("Features[%d].Name is empty", i))
			good = false
		}
		good = check(fmt.Sprintf("Features[%d].Policy", i), f.Policy, cpuPolicies) && good
	}
	if s.Cache != nil {
		good = check("Cache.Mode", s.Cache.Mode, cacheModes) && good
	}
	if t := s.Topology; t != nil && (t.Sockets < 0 || t.Dies < 0 || t.Cores < 0 || t.Threads < 0) {
		p.fail(LibvirtCPUSetting, v, "non-negative counts", "Topology has a negative count")
		good = false
	}
	if good {
		p.opts.CPUSetting = &s
	}
}

// cpuTopology runs after vcpus and cpu: it checks the layout against the
// vCPU count and puts it into the CPU definition.
func (p *parser) cpuTopology() {
	v, ok := p.get(CPUTopology)
	if !ok {
		return
	}
	const allowed = "sockets=S,cores=C,threads=T (each a positive integer, 1 when left out) whose product is the vCPU count (the most vCPUs, with " + MaxVCPUCount + ")"
	t := ports.CPUTopology{Sockets: 1, Cores: 1, Threads: 1}
	seen := map[string]bool{}
	for _, item := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(item), "=")
		n, err := strconv.Atoi(val)
		switch {
		case seen[k]:
			p.fail(CPUTopology, v, allowed, k+" is given twice")
			return
		case err != nil || n < 1 || n > MaxVCPUs:
			p.fail(CPUTopology, v, allowed, fmt.Sprintf("%q is not a count", strings.TrimSpace(item)))
			return
		}
		seen[k] = true
		switch k {
		case "sockets":
			t.Sockets = n
		case "cores":
			t.Cores = n
		case "threads":
			t.Threads = n
		default:
			p.fail(CPUTopology, v, allowed, fmt.Sprintf("%q is not sockets, cores or threads", k))
			return
		}
	}
	top, topName := p.opts.VCPUCount, VCPUCount
	if p.opts.MaxVCPUCount > 0 {
		top, topName = p.opts.MaxVCPUCount, MaxVCPUCount
	}
	if n := t.Sockets * t.Cores * t.Threads; n != top {
		p.fail(CPUTopology, v, allowed, fmt.Sprintf("%d×%d×%d is %d vCPUs, the pod has %d (%s)", t.Sockets, t.Cores, t.Threads, n, top, topName))
		return
	}
	switch s := p.opts.CPUSetting; {
	case s != nil && s.Topology != nil:
		p.fail(CPUTopology, v, "one topology: this annotation or the Topology of "+LibvirtCPUSetting, "both are set")
	case s != nil:
		copied := *s
		copied.Topology = &t
		p.opts.CPUSetting = &copied
	default:
		// A CPU definition with the topology alone, in the mode asked for.
		p.opts.CPUSetting = &ports.CPUSetting{Mode: p.opts.CPUModel, Topology: &t}
	}
}

func (p *parser) cloudInit() {
	if v, ok := p.get(CloudInitImageType); ok {
		// Any datasource plugin's type is allowed; the runtime checks that
		// one is installed.
		if dnsLabel.MatchString(v) {
			p.opts.CloudInitImageType = v
		} else {
			p.fail(CloudInitImageType, v, `"nocloud", "configdrive", or the type of another installed datasource plugin`,
				"not a datasource type name (lowercase letters, digits and '-')")
		}
	}
	p.opts.MetaData = p.mapping(CloudInitMetaData, "a JSON or YAML mapping of meta-data keys")
	p.opts.UserData = p.mapping(CloudInitUserData, "a JSON or YAML mapping of cloud-config keys")
	p.opts.UserDataOverwrite = p.boolean(CloudInitUserDataOverwrite)
	if v, ok := p.get(CloudInitUserDataScript); ok {
		p.opts.UserDataScript = v
	}
	src := p.objectRef(CloudInitUserDataSource, false)
	if v, ok := p.get(CloudInitUserDataSourceKey); ok {
		switch {
		case !validKey(v):
			p.fail(CloudInitUserDataSourceKey, v, "a ConfigMap/Secret key (letters, digits, '-', '_', '.')", "")
		case src == nil:
			p.fail(CloudInitUserDataSourceKey, v, "only together with "+CloudInitUserDataSource, "no user-data source is set")
		default:
			src.Key = v
		}
	}
	p.opts.UserDataSource = src
	if v, ok := p.get(CloudInitUserDataSourceEncoding); ok {
		switch v {
		case EncodingPlain, EncodingBase64:
			p.opts.UserDataSourceEncoding = v
		default:
			p.fail(CloudInitUserDataSourceEncoding, v, `"plain" or "base64"`, "")
		}
	}
}

// mapping parses a JSON/YAML mapping annotation.
func (p *parser) mapping(key, allowed string) map[string]interface{} {
	v, ok := p.get(key)
	if !ok {
		return nil
	}
	var out interface{}
	if err := yaml.Unmarshal([]byte(v), &out); err != nil {
		p.fail(key, v, allowed, yamlReason(err))
		return nil
	}
	m, isMap := out.(map[string]interface{})
	if !isMap {
		p.fail(key, v, allowed, fmt.Sprintf("the document is a %s, not a mapping", yamlKind(out)))
		return nil
	}
	return m
}

func (p *parser) sshKeys() {
	if v, ok := p.get(SSHKeys); ok {
		for _, line := range strings.Split(v, "\n") {
			if line = strings.TrimSpace(line); line != "" {
				p.opts.SSHKeys = append(p.opts.SSHKeys, line)
			}
		}
	}
	if ref := p.objectRef(SSHKeySource, true); ref != nil {
		if ref.Key == "" {
			ref.Key = DefaultSSHKeyName
		}
		p.opts.SSHKeySource = ref
	}
}

func (p *parser) files() {
	p.opts.FilesFromDataSource = p.objectRef(FilesFromDataSource, false)
}

// objectRef parses "kind/name" (and "kind/name/key" when withKey).
func (p *parser) objectRef(key string, withKey bool) *ObjectRef {
	v, ok := p.get(key)
	if !ok {
		return nil
	}
	allowed := `kind/name with kind configmap or secret, e.g. "configmap/<name>" or "secret/<name>"`
	if withKey {
		allowed = `kind/name[/key] with kind configmap or secret, e.g. "configmap/<name>[/<key>]" or "secret/<name>[/<key>]"`
	}
	parts := strings.Split(v, "/")
	if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && !withKey) {
		p.fail(key, v, allowed, "wrong number of '/'-separated parts")
		return nil
	}
	ref := &ObjectRef{Kind: ObjectKind(parts[0]), Name: parts[1]}
	if ref.Kind != ConfigMap && ref.Kind != Secret {
		p.fail(key, v, allowed, fmt.Sprintf("kind %q is neither configmap nor secret", parts[0]))
		return nil
	}
	if !validName(ref.Name) {
		p.fail(key, v, allowed, fmt.Sprintf("%q is not a valid object name (lowercase DNS subdomain)", ref.Name))
		return nil
	}
	if len(parts) == 3 {
		if !validKey(parts[2]) {
			p.fail(key, v, allowed, fmt.Sprintf("%q is not a valid key (letters, digits, '-', '_', '.')", parts[2]))
			return nil
		}
		ref.Key = parts[2]
	}
	return ref
}

// quantity reads key as a positive number of bytes (0 when unset).
func (p *parser) quantity(key, allowed string) int64 {
	v, ok := p.get(key)
	if !ok {
		return 0
	}
	n, err := ParseBytes(strings.TrimSpace(v))
	if err != nil {
		p.fail(key, v, allowed, err.Error())
		return 0
	}
	return n
}

func (p *parser) maxMemory() {
	p.opts.MaxMemoryBytes = p.quantity(MaxMemory, "a positive Kubernetes quantity such as 4Gi, at least the container's memory limit")
}

func (p *parser) rootVolume() {
	p.opts.RootVolumeSize = p.quantity(RootVolumeSize, "a positive Kubernetes quantity such as 1Gi, 512Mi or 10G")
}

func (p *parser) misc() {
	p.opts.Chown9pfsMounts = p.boolean(Chown9pfsMounts)
	p.opts.ForceDHCP = p.boolean(ForceDHCPNetworkConfig)
	p.opts.RootfsReinit = p.boolean(PersistentRootfsReinit)
	if v, ok := p.get(MemorySharing); ok {
		switch v {
		case "true":
		case "false":
			p.opts.NoMemorySharing = true
		default:
			p.fail(MemorySharing, v, "true or false", "")
		}
	}
	if v, ok := p.get(SystemUUID); ok {
		id, err := uuid.Parse(strings.TrimSpace(v))
		switch {
		case err != nil:
			p.fail(SystemUUID, v, "a UUID such as 4a9c4d3e-0b1f-4a57-9e3c-6f7f2f6f1c2d", "not a UUID")
		case id == uuid.Nil:
			p.fail(SystemUUID, v, "a non-nil UUID", "the nil UUID")
		default:
			p.opts.SystemUUID = id.String()
		}
	}
}

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	configKey    = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)
)

func validName(s string) bool { return len(s) <= 253 && dnsSubdomain.MatchString(s) }
func validKey(s string) bool {
	return len(s) <= 253 && configKey.MatchString(s) && s != "." && s != ".."
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// suggest finds the known annotation closest to a misspelt one.
func suggest(key string) string {
	best, bestDist := "", 4
	for _, k := range Known {
		if strings.EqualFold(k, key) {
			return k
		}
		if d := distance(strings.ToLower(k), strings.ToLower(key)); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// abbreviate keeps error messages readable when a value is a whole document.
func abbreviate(v string) string {
	const max = 64
	if i := strings.IndexByte(v, '\n'); i >= 0 && i < len(v)-1 {
		v = v[:i] + "…"
	}
	if len(v) > max {
		v = v[:max] + "…"
	}
	return v
}

func yamlReason(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "error converting YAML to JSON: ")
	msg = strings.TrimPrefix(msg, "error unmarshaling JSON: ")
	msg = strings.TrimPrefix(msg, "while decoding JSON: ")
	return "cannot parse: " + msg
}

func yamlKind(v interface{}) string {
	switch v.(type) {
	case nil:
		return "null"
	case []interface{}:
		return "list"
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64, json.Number, int64:
		return "number"
	default:
		return fmt.Sprintf("%T", v)
	}
}

var macRE = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)

func (p *parser) migrateFrom() {
	v, ok := p.values[MigrateFrom]
	if !ok {
		return
	}
	const allowed = `{"pod": "NAMESPACE/NAME", "uid": "...", "node": "...", "domain": "...", "uuid": "...", "macs": ["..."]} (virtletctl migrate writes it)`
	var m MigrationSource
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		p.fail(MigrateFrom, v, allowed, "it is not that JSON: "+err.Error())
		return
	}
	ns, name, _ := strings.Cut(m.Pod, "/")
	switch {
	case ns == "" || name == "":
		p.fail(MigrateFrom, v, allowed, "pod is not NAMESPACE/NAME")
	case m.UID == "" || m.Node == "" || m.Domain == "" || m.UUID == "":
		p.fail(MigrateFrom, v, allowed, "uid, node, domain and uuid must all be given")
	default:
		for _, mac := range m.MACs {
			if !macRE.MatchString(mac) {
				p.fail(MigrateFrom, v, "lowercase MACs such as 52:54:00:12:34:56", fmt.Sprintf("%q is not a MAC", mac))
				return
			}
		}
		p.opts.MigrateFrom = &m
	}
}
