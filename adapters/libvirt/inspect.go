package libvirt

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virtlet/virtlet/ports"
)

// Diagnostics for virtletctl: the live domain XML, a read-only virsh, and
// where the VNC display listens.

// virshVerb is what one virsh command served to `virtletctl virsh` may
// be given besides the domain, which is always the pod's own and always
// the first argument: boolean options, options with a value, and at most
// args plain arguments (a device or an interface of that domain). Nothing
// else passes: no option names another domain or connection (domstats
// takes no plain argument, as each would be one more domain), and values
// are plain names, never virsh syntax. The connection is read-only
// besides, so libvirt refuses any change even if a command could make it.
type virshVerb struct {
	flags  []string
	values []string
	args   int
}

var virshVerbs = map[string]virshVerb{
	"dominfo":    {},
	"domstate":   {flags: []string{"--reason"}},
	"dumpxml":    {flags: []string{"--inactive", "--update-cpu", "--migratable"}},
	"domstats":   {flags: []string{"--state", "--cpu-total", "--balloon", "--vcpu", "--interface", "--block", "--perf", "--iothread", "--memory", "--raw", "--backing", "--nowait"}},
	"domblklist": {flags: []string{"--inactive", "--details"}},
	"domblkinfo": {flags: []string{"--human", "--all"}, values: []string{"--device"}, args: 1},
	"domblkstat": {flags: []string{"--human"}, values: []string{"--device"}, args: 1},
	"domiflist":  {flags: []string{"--inactive"}},
	"domifstat":  {values: []string{"--interface"}, args: 1},
	"domifaddr":  {flags: []string{"--full"}, values: []string{"--interface", "--source"}, args: 1},
	"dommemstat": {flags: []string{"--live", "--config", "--current"}},
	"domdisplay": {flags: []string{"--all"}, values: []string{"--type"}},
	"vncdisplay": {},
	"vcpuinfo":   {flags: []string{"--pretty"}},
	"vcpucount":  {flags: []string{"--maximum", "--active", "--live", "--config", "--current"}},
	"domjobinfo": {flags: []string{"--completed"}},
	"domcontrol": {},
	"domuuid":    {},
	"domid":      {},
	"ttyconsole": {},
}

// virshTimeout bounds one virsh run.
const virshTimeout = 20 * time.Second

// virshName is a plain argument or option value: a device, an interface,
// a MAC address, a source or display type.
var virshName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`)

// allowedVerbs lists the commands served, for error messages.
func allowedVerbs() string {
	var vs []string
	for v := range virshVerbs {
		vs = append(vs, v)
	}
	sort.Strings(vs)
	return strings.Join(vs, ", ")
}

// checkVirshArgs checks a command against its verb's allow-list.
func checkVirshArgs(args []string) error {
	if len(args) == 0 {
		return &ports.InvalidError{Field: "virsh command", Reason: "none given", Allowed: allowedVerbs()}
	}
	verb, ok := virshVerbs[args[0]]
	if !ok {
		return &ports.InvalidError{Field: "virsh command", Value: args[0],
			Reason: "only commands that read this VM's state are served", Allowed: allowedVerbs()}
	}
	plain := 0
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			if plain++; plain > verb.args {
				return &ports.InvalidError{Field: "virsh " + args[0] + " argument", Value: a,
					Reason: fmt.Sprintf("%s takes %d argument(s) besides the pod's own domain", args[0], verb.args)}
			}
			if !virshName.MatchString(a) {
				return &ports.InvalidError{Field: "virsh " + args[0] + " argument", Value: a, Reason: "not a device or interface name"}
			}
			continue
		}
		name, value, hasValue := strings.Cut(a, "=")
		switch {
		case slices.Contains(verb.flags, name) && !hasValue:
		case slices.Contains(verb.values, name):
			if !hasValue {
				if i+1 == len(args) {
					return &ports.InvalidError{Field: "virsh " + args[0] + " option " + name, Reason: "needs a value"}
				}
				i++
				value = args[i]
			}
			if !virshName.MatchString(value) {
				return &ports.InvalidError{Field: "virsh " + args[0] + " option " + name, Value: value, Reason: "not a plain name"}
			}
		default:
			allowed := strings.Join(append(slices.Clone(verb.flags), verb.values...), ", ")
			if allowed == "" {
				allowed = "none"
			}
			return &ports.InvalidError{Field: "virsh " + args[0] + " option", Value: a,
				Reason: "not served (the domain is always the pod's own, the connection the plugin's)", Allowed: allowed}
		}
	}
	return nil
}

// inspector serves virtletctl's diagnostics of a VM: a read-only virsh
// (Inspect), the live definition and what the plugin knows (Diagnose),
// and where its display listens (Display).
type inspector struct {
	vms      vmSource
	consoles *consoles
}

// Inspect runs `virsh --readonly <verb> <domain> <args...>` once the
// command passed its verb's allow-list.
func (in inspector) Inspect(ctx context.Context, id string, args []string) (ports.CommandOutput, error) {
	r := in.vms.record(id)
	uri := in.vms.settings().cfg.URI
	if r == nil {
		return ports.CommandOutput{}, fmt.Errorf("VM %s: %w", id, ports.ErrNotFound)
	}
	if err := checkVirshArgs(args); err != nil {
		return ports.CommandOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, virshTimeout)
	defer cancel()
	full := append([]string{"--readonly", "--connect", uri, args[0], r.Spec.Name}, args[1:]...)
	cmd := exec.CommandContext(ctx, "virsh", full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out := ports.CommandOutput{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		out.ExitCode = int32(ee.ExitCode())
	case err != nil:
		return ports.CommandOutput{}, fmt.Errorf("run virsh: %w", err)
	}
	return out, nil
}

// Diagnose returns the live domain XML and what the plugin knows.
func (in inspector) Diagnose(ctx context.Context, id string) (ports.VMDiagnostics, error) {
	r, dom, err := in.vms.lookup(id)
	if err != nil {
		return ports.VMDiagnostics{}, err
	}
	defer dom.Free()
	def, err := dom.GetXMLDesc(0) // not DOMAIN_XML_SECURE: no passwords
	if err != nil {
		return ports.VMDiagnostics{}, libvirtError("domain XML of "+r.Spec.Name, err)
	}
	accel := in.vms.settings().accel
	var details map[string]string
	in.vms.locked(func() {
		details = map[string]string{
			"state": string(r.State), "domain": r.Spec.Name, "consoleLog": r.ConsoleLog, "accelerator": accel.Name,
			"reason": r.Reason, "exitCode": strconv.Itoa(int(r.ExitCode)),
		}
		for disk, p := range r.DiskPaths {
			details["disk."+disk] = p
		}
	})
	if state, reason, err := dom.GetState(); err == nil {
		details["libvirtState"] = fmt.Sprintf("%d (reason %d)", state, reason)
	}
	if s, err := agentStateOf(dom); err == nil {
		details["guestAgent"] = s.String()
	}
	if n, open := in.consoles.viewers(id); open {
		details["consoleViewers"] = strconv.Itoa(n)
	}
	return ports.VMDiagnostics{Definition: def, Details: details}, nil
}

// Display reports the running VM's VNC address (autoport: from the live
// domain).
func (in inspector) Display(ctx context.Context, id string) (ports.Display, error) {
	r, dom, err := in.vms.lookup(id)
	if err != nil {
		return ports.Display{}, err
	}
	defer dom.Free()
	if state, _, err := dom.GetState(); err != nil || state != libvirt.DOMAIN_RUNNING {
		return ports.Display{}, fmt.Errorf("display of VM %s: the VM is not running: %w", r.Spec.Name, ports.ErrFailedPrecondition)
	}
	raw, err := dom.GetXMLDesc(0)
	if err != nil {
		return ports.Display{}, libvirtError("domain XML of "+r.Spec.Name, err)
	}
	var d libvirtxml.Domain
	if err := xml.Unmarshal([]byte(raw), &d); err != nil {
		return ports.Display{}, err
	}
	if d.Devices != nil {
		for _, g := range d.Devices.Graphics {
			v := g.VNC
			if v == nil {
				continue
			}
			sock := v.Socket
			for _, l := range v.Listeners {
				if l.Socket != nil && l.Socket.Socket != "" {
					sock = l.Socket.Socket
				}
			}
			if sock != "" {
				// libvirt makes it in the domain's directory below its
				// QEMU state directory; the daemon dials it as root.
				if dir := filepath.Clean(in.vms.settings().cfg.QEMUStateDir); !strings.HasPrefix(filepath.Clean(sock), dir+"/") {
					return ports.Display{}, fmt.Errorf("VM %s's VNC socket %s is not below libvirt's %s", r.Spec.Name, sock, dir)
				}
				return ports.Display{Protocol: "vnc", Network: "unix", Address: sock}, nil
			}
			// A domain defined before VNC moved to a socket.
			if v.Port > 0 {
				host := "127.0.0.1"
				if len(v.Listeners) > 0 && v.Listeners[0].Address != nil && v.Listeners[0].Address.Address != "" {
					host = v.Listeners[0].Address.Address
				}
				return ports.Display{Protocol: "vnc", Network: "tcp", Address: net.JoinHostPort(host, strconv.Itoa(v.Port))}, nil
			}
		}
	}
	return ports.Display{}, fmt.Errorf("VM %s has no VNC display: %w", r.Spec.Name, ports.ErrFailedPrecondition)
}

var _ ports.VMInspector = (*Hypervisor)(nil)
