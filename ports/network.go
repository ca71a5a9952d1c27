package ports

import "context"

// Network attaches VM pods to the pod network.
type Network interface {
	// Ready reports whether pod networking can work (e.g. a CNI config exists).
	Ready(ctx context.Context) (NetworkReadiness, error)
	// Setup creates the pod's network and returns how the VM attaches to it.
	Setup(ctx context.Context, req NetworkRequest) (NetworkAttachment, error)
	// Teardown removes everything Setup made. It is idempotent.
	Teardown(ctx context.Context, req NetworkRequest) error
}

// NetworkReadiness is the network's readiness with a reason when not ready.
type NetworkReadiness struct {
	Ready   bool
	Reason  string
	Message string
}

// NetworkRequest identifies a pod to the network.
type NetworkRequest struct {
	SandboxID    string
	PodName      string
	PodNamespace string
	PodUID       string
	DNS          *DNSConfig
	PortMappings []PortMapping
	Annotations  map[string]string
}

// NetworkAttachment is the pod's network as the VM sees it.
type NetworkAttachment struct {
	NetNSPath  string
	Interfaces []NetworkInterface
	Routes     []Route
	DNS        *DNSConfig
}

// NetworkInterface is one pod interface and its addresses.
type NetworkInterface struct {
	Name string
	MAC  string
	MTU  int
	// Bridge is the host bridge the VM's NIC joins; the hypervisor makes
	// the tap.
	Bridge string
	IPs    []IPConfig
}

// IPConfig is an address in CIDR form with its gateway.
type IPConfig struct {
	Address string // e.g. 198.18.0.5/24
	Gateway string
}

// Route is a route the VM needs.
type Route struct {
	Destination string // CIDR
	Gateway     string
}

// DNSConfig is the pod's resolver configuration.
type DNSConfig struct {
	Servers  []string
	Searches []string
	Options  []string
}

// PortMapping is a hostPort mapping.
type PortMapping struct {
	Protocol      string // TCP, UDP, SCTP
	ContainerPort int32
	HostPort      int32
	HostIP        string
}
