package ports

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"unicode"
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
	// Gateway is the family's default route, set on one address per
	// family: a guest gets one default route per family (two would fight,
	// and ifupdown fails on the second). It is the pod's first default
	// route of the family, with the address whose subnet reaches its
	// gateway (else the family's first); without one, the gateway of the
	// family's first address that has one.
	Gateway string
	// Routes are the pod's routes (other than that default route) whose
	// gateway this address's subnet reaches; a route no subnet reaches goes
	// with the first address of its family.
	Routes []Route
}

// Validate checks what the VM's NICs, cloud-init's network configuration
// and DHCP are made from: an attachment comes from a network plugin (a
// third party's, or CNI's result), and a name, MAC, address or gateway that
// is not one would otherwise break them far from its cause.
func (att *NetworkAttachment) Validate() error {
	for i, iface := range att.Interfaces {
		if !ifNameRE.MatchString(iface.Name) || iface.Name == "." || iface.Name == ".." {
			return fmt.Errorf("interface %d: name %q is not a network interface name (1-15 letters, digits, '-', '_' or '.')", i, iface.Name)
		}
		if mac, err := net.ParseMAC(iface.MAC); err != nil || len(mac) != 6 {
			return fmt.Errorf("interface %s: %q is not an Ethernet MAC address", iface.Name, iface.MAC)
		}
		if iface.MTU < 0 || iface.MTU > 65535 {
			return fmt.Errorf("interface %s: MTU %d", iface.Name, iface.MTU)
		}
		for _, ip := range iface.IPs {
			ipnet, err := parseCIDR(ip.Address)
			if err != nil {
				return fmt.Errorf("interface %s address %q: %w", iface.Name, ip.Address, err)
			}
			if ip.Gateway != "" && !sameFamily(ip.Gateway, ipnet) {
				return fmt.Errorf("interface %s address %s: gateway %q is not an address of its family", iface.Name, ip.Address, ip.Gateway)
			}
		}
	}
	for _, r := range att.Routes {
		dst, err := parseCIDR(r.Destination)
		if err != nil || !sameFamily(r.Gateway, dst) {
			return fmt.Errorf("route to %q via %q: a route needs a destination CIDR and a gateway of its family", r.Destination, r.Gateway)
		}
	}
	if dns := att.DNS; dns != nil {
		for _, s := range dns.Servers {
			if net.ParseIP(s) == nil {
				return fmt.Errorf("DNS server %q is not an IP address", s)
			}
		}
		for _, s := range dns.Searches {
			if len(s) > 254 || !searchRE.MatchString(s) {
				return fmt.Errorf("DNS search domain %q is not a domain name", s)
			}
		}
		for _, s := range dns.Options {
			if s == "" || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0 {
				return fmt.Errorf("DNS option %q is empty or holds spaces or control characters", s)
			}
		}
	}
	return nil
}

// parseCIDR parses an address in CIDR form, refusing an IPv4 address
// written as IPv6 (::ffff:a.b.c.d/n): its mask would be IPv6's.
func parseCIDR(s string) (*net.IPNet, error) {
	ip, ipnet, err := net.ParseCIDR(s)
	if err != nil {
		return nil, err
	}
	if ip.To4() != nil && strings.Contains(s, ":") {
		return nil, fmt.Errorf("an IPv4 address in IPv6 notation")
	}
	return ipnet, nil
}

func sameFamily(ip string, n *net.IPNet) bool {
	a := net.ParseIP(ip)
	return a != nil && (a.To4() != nil) == (n.IP.To4() != nil)
}

var (
	// ifNameRE is within Linux's rule for interface names (dev_valid_name),
	// in the characters names are made of: other characters are no use to a
	// guest, and some ("=", "<<") mean something else to the YAML 1.1 parser
	// of cloud-init.
	ifNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
	// searchRE is a domain name, or the root.
	searchRE = regexp.MustCompile(`^(\.|[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?)$`)
)

// AddressRoles decides, for every address of every interface (keyed by
// interface and address index), its gateway and routes. It fails on an
// attachment that Validate refuses.
func (att *NetworkAttachment) AddressRoles() (map[[2]int]*AddressRole, error) {
	if err := att.Validate(); err != nil {
		return nil, err
	}
	roles := map[[2]int]*AddressRole{}
	type subnet struct {
		key [2]int
		net *net.IPNet
		v4  bool
	}
	var subnets []subnet
	gwOwner := map[bool]*AddressRole{} // the address with the family's default route
	explicit := map[bool]bool{}        // the default route is the pod's own
	for i, iface := range att.Interfaces {
		for j, ip := range iface.IPs {
			addr, ipnet, _ := net.ParseCIDR(ip.Address) // checked by Validate
			v4 := addr.To4() != nil
			role := &AddressRole{}
			if ip.Gateway != "" && gwOwner[v4] == nil {
				role.Gateway, gwOwner[v4] = ip.Gateway, role
			}
			roles[[2]int{i, j}] = role
			subnets = append(subnets, subnet{key: [2]int{i, j}, net: ipnet, v4: v4})
		}
	}
	for _, r := range att.Routes {
		_, dst, _ := net.ParseCIDR(r.Destination) // checked by Validate
		gw := net.ParseIP(r.Gateway)
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
		if ones, _ := dst.Mask.Size(); ones == 0 {
			// CNI applies the routes it returns, and an address's gateway
			// is no route by itself: the pod's own default route is the
			// family's, in place of an address's gateway; a second one
			// would fight it.
			if !explicit[v4] {
				explicit[v4] = true
				if old := gwOwner[v4]; old != nil {
					old.Gateway = ""
				}
				target.Gateway, gwOwner[v4] = r.Gateway, target
			}
			continue
		}
		target.Routes = append(target.Routes, r)
	}
	return roles, nil
}
