package cloudinit

import (
	"encoding/json"
	"fmt"
	"net"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/ports"
)

// subnetRole says what one address of the pod's interfaces carries into
// the guest's network configuration.
type subnetRole struct {
	// Gateway is set on the first address of each family that has one: a
	// guest gets one default route per family (two would fight, and
	// ifupdown fails on the second).
	Gateway string
	// Routes are the pod's routes (other than that default route) whose
	// gateway this address's subnet reaches; a route no subnet reaches goes
	// with the first address of its family.
	Routes []ports.Route
}

// subnetRoles decides, for every address of every interface (by interface
// and address index), its gateway and routes.
func subnetRoles(att *ports.NetworkAttachment) (map[[2]int]*subnetRole, error) {
	roles := map[[2]int]*subnetRole{}
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
			role := &subnetRole{}
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
		var target *subnetRole
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

// networkConfigV1 is NoCloud's network-config (version 1): one physical
// interface per pod interface, matched by MAC, with static addresses,
// routes and the pod's DNS.
func networkConfigV1(att *ports.NetworkAttachment) ([]byte, error) {
	roles, err := subnetRoles(att)
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

// networkData is ConfigDrive's network_data.json (OpenStack's format).
func networkData(att *ports.NetworkAttachment) ([]byte, error) {
	roles, err := subnetRoles(att)
	if err != nil {
		return nil, err
	}
	var links, networks, services []interface{}
	for i, iface := range att.Interfaces {
		link := map[string]interface{}{"id": iface.Name, "type": "phy", "ethernet_mac_address": iface.MAC}
		if iface.MTU > 0 {
			link["mtu"] = iface.MTU
		}
		links = append(links, link)
		for j, ip := range iface.IPs {
			addr, ipnet, _ := net.ParseCIDR(ip.Address) // checked by subnetRoles
			kind, mask := "ipv4", net.IP(ipnet.Mask).String()
			if addr.To4() == nil {
				kind = "ipv6"
				ones, _ := ipnet.Mask.Size()
				mask = fmt.Sprint(ones)
			}
			n := map[string]interface{}{
				"id": fmt.Sprintf("network%d-%d", i, j), "type": kind, "link": iface.Name,
				"ip_address": addr.String(), "netmask": mask,
			}
			role := roles[[2]int{i, j}]
			var routes []interface{}
			if role.Gateway != "" {
				def, defMask := "0.0.0.0", "0.0.0.0"
				if kind == "ipv6" {
					def, defMask = "::", "0"
				}
				routes = append(routes, map[string]interface{}{"network": def, "netmask": defMask, "gateway": role.Gateway})
			}
			for _, r := range role.Routes {
				_, rn, _ := net.ParseCIDR(r.Destination)
				m := net.IP(rn.Mask).String()
				if kind == "ipv6" {
					ones, _ := rn.Mask.Size()
					m = fmt.Sprint(ones)
				}
				routes = append(routes, map[string]interface{}{"network": rn.IP.String(), "netmask": m, "gateway": r.Gateway})
			}
			if len(routes) > 0 {
				n["routes"] = routes
			}
			networks = append(networks, n)
		}
	}
	if dns := att.DNS; dns != nil {
		for _, s := range dns.Servers {
			services = append(services, map[string]interface{}{"type": "dns", "address": s})
		}
	}
	return json.MarshalIndent(map[string]interface{}{"links": links, "networks": networks, "services": services}, "", "  ")
}
