package cloudinit

import (
	"encoding/json"
	"fmt"
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
	roles, err := att.AddressRoles()
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
			addr, ipnet, _ := net.ParseCIDR(ip.Address) // checked by AddressRoles
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
