package ports

import "context"

// NodeInspector reads what the node itself shows about Virtlet's pods and
// VMs, for `virtletctl diag dump`: interfaces and routes (the node's and
// in the pods' network namespaces), processes, and the hypervisor's logs.
// It only reads; it never runs what a request names.
type NodeInspector interface {
	// InspectNode gathers what req asks for. What cannot be read is a
	// problem in the report, not an error: the rest is still worth having.
	InspectNode(ctx context.Context, req NodeInspection) NodeReport
}

// NodeInspection says what to gather.
type NodeInspection struct {
	// Node: the node-wide part (its interfaces, routes, processes, the
	// list of network namespaces, the hypervisor daemon's log). It shows
	// every pod of the node: only the node's operator may see it.
	Node bool
	// NetNS are Virtlet's pod network namespaces whose interfaces and
	// routes to include.
	NetNS []PodNetNS
	// VMs are the names the hypervisor knows Virtlet's VMs by, whose
	// hypervisor logs (QEMU's) to include.
	VMs []string
}

// PodNetNS is one pod's network namespace.
type PodNetNS struct {
	Pod  string // namespace/name
	Path string // e.g. /run/netns/<name>
}

// NodeReport is what was gathered: files named by relative, slash-separated
// paths (ip-a.txt, netns/<name>/ip-r.txt, libvirt/qemu/<vm>.log).
type NodeReport struct {
	Files    []NodeFile
	Problems []string
}

// NodeFile is one file of a NodeReport. Secrets are redacted from it, and
// it holds at most the inspector's bound of bytes: the end of a longer
// file (logs grow at their end).
type NodeFile struct {
	Name string
	Data []byte
	// Size is the whole file's size when Data holds only its end.
	Size int64
	// Truncated: Data is the end of Size bytes.
	Truncated bool
}
