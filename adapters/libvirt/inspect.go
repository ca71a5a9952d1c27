package libvirt

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"os/exec"
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

// readOnlyVerbs are the virsh commands `virtletctl virsh` may run: they
// only read, and they run on a read-only connection besides, so libvirt
// refuses any change even if one of them could make it.
var readOnlyVerbs = map[string]bool{
	"dominfo": true, "domstate": true, "dumpxml": true, "domstats": true, "domblklist": true, "domblkinfo": true,
	"domblkstat": true, "domiflist": true, "domifstat": true, "dommemstat": true, "domdisplay": true, "vncdisplay": true,
	"vcpuinfo": true, "vcpucount": true, "domjobinfo": true, "domcontrol": true, "domuuid": true, "domid": true,
	"domname": true, "domifaddr": true, "ttyconsole": true,
}

// virshTimeout bounds one virsh run.
const virshTimeout = 20 * time.Second

func allowedVerbs() string {
	var vs []string
	for v := range readOnlyVerbs {
		vs = append(vs, v)
	}
	sort.Strings(vs)
	return strings.Join(vs, ", ")
}

// Inspect runs `virsh --readonly <verb> <domain> <args...>`.
func (h *Hypervisor) Inspect(ctx context.Context, id string, args []string) (ports.CommandOutput, error) {
	h.mu.Lock()
	r := h.records[id]
	uri := h.cfg.URI
	h.mu.Unlock()
	if r == nil {
		return ports.CommandOutput{}, fmt.Errorf("VM %s: %w", id, ports.ErrNotFound)
	}
	if len(args) == 0 || !readOnlyVerbs[args[0]] {
		verb := ""
		if len(args) > 0 {
			verb = args[0]
		}
		return ports.CommandOutput{}, &ports.InvalidError{Field: "virsh command", Value: verb,
			Reason: "only commands that read a VM's state are served", Allowed: allowedVerbs()}
	}
	for _, a := range args[1:] {
		if strings.HasPrefix(a, "-c") || strings.HasPrefix(a, "--connect") {
			return ports.CommandOutput{}, &ports.InvalidError{Field: "virsh argument", Value: a, Reason: "the connection is the plugin's"}
		}
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
func (h *Hypervisor) Diagnose(ctx context.Context, id string) (ports.VMDiagnostics, error) {
	r, dom, err := h.lookup(id)
	if err != nil {
		return ports.VMDiagnostics{}, err
	}
	defer dom.Free()
	def, err := dom.GetXMLDesc(0) // not DOMAIN_XML_SECURE: no passwords
	if err != nil {
		return ports.VMDiagnostics{}, libvirtError("domain XML of "+r.Spec.Name, err)
	}
	h.mu.Lock()
	details := map[string]string{
		"state": string(r.State), "domain": r.Spec.Name, "consoleLog": r.ConsoleLog, "accelerator": h.accel.Name,
		"reason": r.Reason, "exitCode": strconv.Itoa(int(r.ExitCode)),
	}
	for disk, p := range r.DiskPaths {
		details["disk."+disk] = p
	}
	h.mu.Unlock()
	if state, reason, err := dom.GetState(); err == nil {
		details["libvirtState"] = fmt.Sprintf("%d (reason %d)", state, reason)
	}
	if ok, err := agentConnected(dom); err == nil {
		details["guestAgent"] = map[bool]string{true: "connected", false: "disconnected"}[ok]
	}
	h.consoleMu.Lock()
	if hub := h.consoles[id]; hub != nil {
		hub.mu.Lock()
		details["consoleViewers"] = strconv.Itoa(len(hub.viewers))
		hub.mu.Unlock()
	}
	h.consoleMu.Unlock()
	return ports.VMDiagnostics{Definition: def, Details: details}, nil
}

// Display reports the running VM's VNC address (autoport: from the live
// domain).
func (h *Hypervisor) Display(ctx context.Context, id string) (ports.Display, error) {
	r, dom, err := h.lookup(id)
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
			if v := g.VNC; v != nil && v.Port > 0 {
				host := "127.0.0.1"
				if len(v.Listeners) > 0 && v.Listeners[0].Address != nil && v.Listeners[0].Address.Address != "" {
					host = v.Listeners[0].Address.Address
				}
				return ports.Display{Protocol: "vnc", Address: net.JoinHostPort(host, strconv.Itoa(v.Port))}, nil
			}
		}
	}
	return ports.Display{}, fmt.Errorf("VM %s has no VNC display: %w", r.Spec.Name, ports.ErrFailedPrecondition)
}

var _ ports.VMInspector = (*Hypervisor)(nil)
