package cloudinit

import (
	"net"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/ports"
)

// networkConfigV1 is NoCloud's network-config (version 1): one physical
// interface per pod interface, matched by MAC, with static addresses,
// routes and the pod's DNS.
func networkConfigV1(att *ports.NetworkAttachment) ([]byte, error) {
	roles, err := att.AddressRoles()
	if err != nil {
		return nil, err
	}
	var config []interface{}
	for i, iface := range att.Interfaces {
		phys := map[string]interface{}{"type": "physical", "name": iface.Name, "mac_address": iface.MAC}
		if iface.MTU > 0 {
			phys["mtu"] = iface.MTU
		}
		var subnets []interface{}
		for j, ip := range iface.IPs {
			role := roles[[2]int{i, j}]
			if onLinkGateway(ip.Address, role.Gateway) {
				// network-config v1 cannot say that a gateway lies on the
				// link outside the subnet (Calico's 169.254.1.1 for a /32):
				// its renderers route "via" it, which ifupdown, for one,
				// refuses. DHCP can: the pod's DHCP server answers with this
				// address, the gateway on the link, and its routes.
				subnets = append(subnets, map[string]interface{}{"type": "dhcp"})
				continue
			}
			sn := map[string]interface{}{"type": "static", "address": ip.Address}
			if role.Gateway != "" {
				sn["gateway"] = role.Gateway
			}
			var routes []interface{}
			for _, r := range role.Routes {
				routes = append(routes, map[string]interface{}{"network": r.Destination, "gateway": r.Gateway})
			}
			if len(routes) > 0 {
				sn["routes"] = routes
			}
			subnets = append(subnets, sn)
		}
		if len(subnets) == 0 {
			subnets = []interface{}{map[string]interface{}{"type": "dhcp"}}
		}
		phys["subnets"] = subnets
		config = append(config, phys)
	}
	if dns := att.DNS; dns != nil && (len(dns.Servers) > 0 || len(dns.Searches) > 0) {
		ns := map[string]interface{}{"type": "nameserver"}
		if len(dns.Servers) > 0 {
			ns["address"] = dns.Servers
		}
		if len(dns.Searches) > 0 {
			ns["search"] = dns.Searches
		}
		config = append(config, ns)
	}
	return yaml.Marshal(map[string]interface{}{"version": 1, "config": config})
}

// onLinkGateway reports whether an IPv4 address's gateway lies outside its
// subnet, reached on the link (IPv6 gateways are link-local as a rule,
// which every renderer handles).
func onLinkGateway(address, gateway string) bool {
	ip, subnet, err := net.ParseCIDR(address)
	gw := net.ParseIP(gateway)
	return err == nil && gw != nil && ip.To4() != nil && gw.To4() != nil && !subnet.Contains(gw)
}
