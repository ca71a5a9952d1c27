package ports

import (
	"context"
	"fmt"
	"net"
)

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

// AddressRole is what one address of a pod's interfaces carries into the
// guest's network configuration (cloud-init network-config, DHCP).
type AddressRole struct {
	// Gateway is set on the first address of each family that has one: a
	// guest gets one default route per family (two would fight, and
	// ifupdown fails on the second).
	Gateway string
	// Routes are the pod's routes (other than that default route) whose
	// gateway this address's subnet reaches; a route no subnet reaches goes
	// with the first address of its family.
	Routes []Route
}

// AddressRoles decides, for every address of every interface (keyed by
// interface and address index), its gateway and routes.
func (att *NetworkAttachment) AddressRoles() (map[[2]int]*AddressRole, error) {
	roles := map[[2]int]*AddressRole{}
	type subnet struct {
		key [2]int
		net *net.IPNet
		v4  bool
	}
	var subnets []subnet
	gwDone := map[bool]bool{}
	for i, iface := range att.Interfaces {
		for j, ip := range iface.IPs {
			addr, ipnet, err := net.ParseCIDR(ip.Address)
			if err != nil {
				return nil, fmt.Errorf("interface %s address %q: %w", iface.Name, ip.Address, err)
			}
			v4 := addr.To4() != nil
			role := &AddressRole{}
			if ip.Gateway != "" && !gwDone[v4] {
				role.Gateway, gwDone[v4] = ip.Gateway, true
			}
			roles[[2]int{i, j}] = role
			subnets = append(subnets, subnet{key: [2]int{i, j}, net: ipnet, v4: v4})
		}
	}
	for _, r := range att.Routes {
		_, dst, err := net.ParseCIDR(r.Destination)
		gw := net.ParseIP(r.Gateway)
		if err != nil || gw == nil {
			return nil, fmt.Errorf("route to %q via %q: a route needs a destination CIDR and a gateway", r.Destination, r.Gateway)
		}
		v4 := dst.IP.To4() != nil
		var target *AddressRole
		for _, sn := range subnets {
			if sn.v4 != v4 {
				continue
			}
			if target == nil || sn.net.Contains(gw) {
				target = roles[sn.key]
				if sn.net.Contains(gw) {
					break
				}
			}
		}
		if target == nil {
			continue // no address of the family: the guest cannot use it
		}
		if ones, _ := dst.Mask.Size(); ones == 0 && gw.Equal(net.ParseIP(target.Gateway)) {
			continue // the subnet's gateway is this default route already
		}
		target.Routes = append(target.Routes, r)
	}
	return roles, nil
}
