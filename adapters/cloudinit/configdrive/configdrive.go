// Package configdrive is cloud-init's ConfigDrive (OpenStack) datasource:
// an ISO labelled config-2 holding openstack/latest/meta_data.json,
// user_data and network_data.json (docs/cloud-init.md). It owns OpenStack's forms:
// the meta-data repeats the instance-id as uuid and the hostname as
// hostname and names the keys public_keys, and the network is OpenStack's
// network_data.json.
package configdrive

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/virtlet/virtlet/adapters/cloudinit/iso"
	"github.com/virtlet/virtlet/ports"
)

// New returns the ConfigDrive datasource adapter.
func New() *iso.Media {
	return &iso.Media{Name: "configdrive", Label: "config-2", Layout: Layout}
}

// Layout lays a VM's cloud-init data out as a config drive.
func Layout(req ports.MediaRequest) (map[string][]byte, error) {
	md, err := metaData(req.MetaData)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{"openstack/latest/meta_data.json": md}
	if len(req.UserData) > 0 {
		files["openstack/latest/user_data"] = req.UserData
	}
	if req.Network != nil {
		nd, err := networkData(req.Network)
		if err != nil {
			return nil, err
		}
		files["openstack/latest/network_data.json"] = nd
	}
	return files, nil
}

// metaData adds what OpenStack's meta_data.json repeats, unless the pod's
// VirtletCloudInitMetaData set it: uuid (the instance-id), hostname (the
// local-hostname) and public_keys (the keys by name).
func metaData(raw []byte) ([]byte, error) {
	md := map[string]interface{}{}
	if err := json.Unmarshal(raw, &md); err != nil {
		return nil, fmt.Errorf("meta-data is not a JSON object: %v: %w", err, ports.ErrInvalidArgument)
	}
	if _, ok := md["uuid"]; !ok {
		md["uuid"] = md["instance-id"]
	}
	if _, ok := md["hostname"]; !ok {
		md["hostname"] = md["local-hostname"]
	}
	// OpenStack's own name for the keys, which cloud-init's ConfigDrive
	// reader also understands.
	if list, ok := md["public-keys"].([]interface{}); ok {
		if _, set := md["public_keys"]; !set {
			named := map[string]interface{}{}
			for i, k := range list {
				named[fmt.Sprintf("key%d", i)] = k
			}
			md["public_keys"] = named
		}
	}
	return json.MarshalIndent(md, "", "  ")
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
