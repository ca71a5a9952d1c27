// Package nodeinspect reads the node's own state for `virtletctl diag
// dump` (ports.NodeInspector): interfaces, addresses and routes through
// netlink (the node's and in Virtlet's pod network namespaces), processes
// from /proc, the list of network namespaces, and libvirt's logs. It runs
// no tool: what `ip` or `ps` would print is read where they read it.
// Every file is bounded and has secrets redacted (redact.go).
package nodeinspect

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// DefaultMaxFileBytes bounds each file of a report: a longer log keeps its
// end, a longer listing its start, and says so.
const DefaultMaxFileBytes = 1 << 20

// DefaultMaxReportBytes bounds a whole report: the files past it are
// left out, each named in the report's problems.
const DefaultMaxReportBytes = 64 << 20

// Inspector reads the node. Its zero value is not usable: use New.
type Inspector struct {
	// ProcDir is procfs (/proc).
	ProcDir string
	// NetNSDir holds the named network namespaces (ip netns's, where
	// Virtlet's CNI plugin makes the pods': /var/run/netns).
	NetNSDir string
	// LibvirtLogDir is libvirt's log directory: libvirtd.log, and each
	// domain's QEMU log in qemu/<domain>.log.
	LibvirtLogDir string
	// MaxFileBytes and MaxReportBytes bound the files and the report.
	MaxFileBytes, MaxReportBytes int
	Log                          logrus.FieldLogger
}

var _ ports.NodeInspector = (*Inspector)(nil)

// New returns an inspector of this host, as libvirt and ip lay it out.
func New(log logrus.FieldLogger) *Inspector {
	return &Inspector{ProcDir: "/proc", NetNSDir: "/var/run/netns", LibvirtLogDir: "/var/log/libvirt",
		MaxFileBytes: DefaultMaxFileBytes, MaxReportBytes: DefaultMaxReportBytes, Log: log}
}

// InspectNode gathers what req asks for; each part that fails is a problem
// of the report and the others are still gathered.
func (in *Inspector) InspectNode(ctx context.Context, req ports.NodeInspection) ports.NodeReport {
	r := &report{maxFile: in.MaxFileBytes, maxAll: in.MaxReportBytes}
	if req.Node {
		in.node(ctx, req, r)
	}
	for _, ns := range req.NetNS {
		if ctx.Err() != nil {
			break
		}
		in.podNetNS(ns, r)
	}
	for _, vm := range req.VMs {
		if ctx.Err() != nil {
			break
		}
		in.qemuLog(vm, r)
	}
	if err := ctx.Err(); err != nil {
		r.problem(fmt.Errorf("node inspection cut short: %w", err))
	}
	in.Log.WithFields(logrus.Fields{"node": req.Node, "namespaces": len(req.NetNS), "vms": len(req.VMs),
		"files": len(r.files), "bytes": r.total, "problems": len(r.problems)}).Debug("node inspected")
	return ports.NodeReport{Files: r.files, Problems: r.problems}
}

// node gathers the node-wide files.
func (in *Inspector) node(ctx context.Context, req ports.NodeInspection, r *report) {
	if links, routes, err := readNetwork(""); err != nil {
		r.problem(fmt.Errorf("the node's interfaces and routes: %w", err))
	} else {
		r.addText("ip-a.txt", links)
		r.addText("ip-r.txt", routes)
	}
	if ps, err := processList(ctx, in.ProcDir); err != nil {
		r.problem(fmt.Errorf("the node's processes: %w", err))
	} else {
		r.addText("ps.txt", redact(ps))
	}
	netns, err := netnsList(in.NetNSDir, req.NetNS)
	if err != nil {
		r.problem(err)
	}
	r.addText("netns.txt", netns)
	r.addLog("libvirt/libvirtd.log", filepath.Join(in.LibvirtLogDir, "libvirtd.log"), true)
}

// podNetNS adds `ip a` and `ip r` as seen in one pod's network namespace.
func (in *Inspector) podNetNS(ns ports.PodNetNS, r *report) {
	name := filepath.Base(ns.Path)
	if !filepath.IsAbs(ns.Path) || !plainName(name) {
		r.problem(fmt.Errorf("network namespace of pod %s: %q is not a namespace's path", ns.Pod, ns.Path))
		return
	}
	links, routes, err := readNetwork(ns.Path)
	if err != nil {
		r.problem(fmt.Errorf("network namespace %s of pod %s: %w", ns.Path, ns.Pod, err))
		return
	}
	header := fmt.Sprintf("# pod %s, network namespace %s\n", ns.Pod, ns.Path)
	r.addText("netns/"+name+"/ip-a.txt", header+links)
	r.addText("netns/"+name+"/ip-r.txt", header+routes)
}

// qemuLog adds one VM's QEMU log, as libvirt writes it.
func (in *Inspector) qemuLog(vm string, r *report) {
	if !plainName(vm) {
		r.problem(fmt.Errorf("QEMU log of VM %q: not a domain's name", vm))
		return
	}
	r.addLog("libvirt/qemu/"+vm+".log", filepath.Join(in.LibvirtLogDir, "qemu", vm+".log"), false)
}

// plainName is a name that is one path component and nothing else.
func plainName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00") && len(s) <= 255
}
