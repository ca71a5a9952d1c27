package cloudinit

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"testing"
	"unicode/utf8"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/ports"
)

// pyYAMLImplicit are the implicit types of YAML 1.1 as PyYAML (cloud-init's
// parser) resolves plain scalars (yaml/resolver.py): a plain scalar that
// matches one is not read as a string.
var pyYAMLImplicit = map[string]*regexp.Regexp{
	"bool":      regexp.MustCompile(`^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$`),
	"float":     regexp.MustCompile(`^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$`),
	"int":       regexp.MustCompile(`^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$`),
	"merge":     regexp.MustCompile(`^(?:<<)$`),
	"null":      regexp.MustCompile(`^(?:~|null|Null|NULL|)$`),
	"timestamp": regexp.MustCompile(`^(?:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?)$`),
	"value":     regexp.MustCompile(`^(?:=)$`),
}

// numericKeys are the network-config keys whose values are numbers.
var numericKeys = map[string]bool{"mtu": true, "version": true}

// checkPyYAMLStrings fails when cloud-init would read one of the document's
// strings as something else.
func checkPyYAMLStrings(t *testing.T, doc []byte) {
	t.Helper()
	var root yamlv3.Node
	if err := yamlv3.Unmarshal(doc, &root); err != nil {
		t.Fatalf("network-config is not YAML: %v\n%s", err, doc)
	}
	var walk func(n *yamlv3.Node, key string)
	walk = func(n *yamlv3.Node, key string) {
		switch n.Kind {
		case yamlv3.DocumentNode, yamlv3.SequenceNode:
			for _, c := range n.Content {
				walk(c, key)
			}
		case yamlv3.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(n.Content[i+1], n.Content[i].Value)
			}
		case yamlv3.ScalarNode:
			if n.Style != 0 || numericKeys[key] {
				return
			}
			for typ, re := range pyYAMLImplicit {
				if re.MatchString(n.Value) {
					t.Fatalf("%s: %q is written plain, and cloud-init (YAML 1.1) reads it as a %s:\n%s", key, n.Value, typ, doc)
				}
			}
		}
	}
	walk(&root, "")
}

// FuzzNetworkConfig: from any attachment a network plugin could hand over,
// network-config is made, or refused exactly when the attachment does not
// check (ports.NetworkAttachment.Validate). What is accepted is sound (MACs,
// addresses, gateways of their family, routes, DNS servers), and what is
// made says what the attachment says, to cloud-init's YAML 1.1 parser too:
// one physical entry per interface with its name, MAC and addresses (DHCP
// without any), at most one default route per address family, each route
// once, under an address of its family.
func FuzzNetworkConfig(f *testing.F) {
	f.Add("eth0", "52:54:00:a1:b2:c3", 1450, "198.18.0.5/24", "198.18.0.1", "fd00:198:18::5/64", "fd00:198:18::1",
		"198.19.0.0/16", "198.18.0.254", "198.18.0.10", "svc.cluster.local")
	f.Add("net1", "0a:58:c6:12:11:07", 0, "198.18.17.7/24", "198.18.17.1", "", "", "0.0.0.0/0", "198.18.17.1", "", "")
	f.Add("eth0", "52:54:00:12:34:56", 1500, "10.1.2.3/8", "", "10.1.2.4/8", "10.0.0.1", "::/0", "fe80::1", "fd00::10", "")
	f.Add("yes", "12:30", -1, "", "", "x", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, name, mac string, mtu int, addr1, gw1, addr2, gw2, routeDst, routeGw, dns, search string) {
		for _, s := range []string{name, mac, addr1, gw1, addr2, gw2, routeDst, routeGw, dns, search} {
			if !utf8.ValidString(s) {
				return // attachments come over gRPC, whose strings are UTF-8
			}
		}
		iface := ports.NetworkInterface{Name: name, MAC: mac, MTU: mtu}
		for _, ip := range []ports.IPConfig{{Address: addr1, Gateway: gw1}, {Address: addr2, Gateway: gw2}} {
			if ip.Address != "" {
				iface.IPs = append(iface.IPs, ip)
			}
		}
		// A second interface, addressed after the first, gets the rest.
		second := ports.NetworkInterface{Name: name + "1", MAC: mac, IPs: []ports.IPConfig{{Address: "198.18.99.2/24", Gateway: "198.18.99.1"}}}
		att := &ports.NetworkAttachment{Interfaces: []ports.NetworkInterface{iface, second}}
		if routeDst != "" || routeGw != "" {
			att.Routes = []ports.Route{{Destination: routeDst, Gateway: routeGw}, {Destination: "198.20.0.0/16", Gateway: "198.18.99.254"}}
		}
		if dns != "" || search != "" {
			att.DNS = &ports.DNSConfig{}
			if dns != "" {
				att.DNS.Servers = []string{dns}
			}
			if search != "" {
				att.DNS.Searches = []string{search}
			}
		}
		out, err := networkConfigV1(att)
		if verr := att.Validate(); (err == nil) != (verr == nil) {
			t.Fatalf("the attachment checks as %v, and network-config fails with %v", verr, err)
		}
		if err != nil {
			return
		}
		// What is accepted is sound, whatever Validate's rules.
		for _, iface := range att.Interfaces {
			if mac, err := net.ParseMAC(iface.MAC); err != nil || len(mac) != 6 {
				t.Fatalf("MAC %q accepted", iface.MAC)
			}
			for _, ip := range iface.IPs {
				addr, _, err := net.ParseCIDR(ip.Address)
				gw := net.ParseIP(ip.Gateway)
				if err != nil || ip.Gateway != "" && (gw == nil || (gw.To4() == nil) != (addr.To4() == nil)) {
					t.Fatalf("address %q with gateway %q accepted", ip.Address, ip.Gateway)
				}
			}
		}
		for _, r := range att.Routes {
			_, dst, err := net.ParseCIDR(r.Destination)
			gw := net.ParseIP(r.Gateway)
			if err != nil || gw == nil || (gw.To4() == nil) != (dst.IP.To4() == nil) {
				t.Fatalf("route %+v accepted", r)
			}
		}
		if att.DNS != nil {
			for _, s := range att.DNS.Servers {
				if net.ParseIP(s) == nil {
					t.Fatalf("DNS server %q accepted", s)
				}
			}
		}
		checkPyYAMLStrings(t, out)
		var doc struct {
			Version int `json:"version"`
			Config  []struct {
				Type    string   `json:"type"`
				Name    string   `json:"name"`
				MAC     string   `json:"mac_address"`
				MTU     int      `json:"mtu"`
				Address []string `json:"address"`
				Search  []string `json:"search"`
				Subnets []struct {
					Type    string `json:"type"`
					Address string `json:"address"`
					Gateway string `json:"gateway"`
					Routes  []struct {
						Network string `json:"network"`
						Gateway string `json:"gateway"`
					} `json:"routes"`
				} `json:"subnets"`
			} `json:"config"`
		}
		if err := yaml.UnmarshalStrict(out, &doc); err != nil {
			t.Fatalf("network-config does not read back: %v\n%s", err, out)
		}
		if doc.Version != 1 || len(doc.Config) < 2 {
			t.Fatalf("network-config:\n%s", out)
		}
		gateways := map[bool]int{}
		defaultVia := map[bool]string{} // each family's gateway in network-config
		podDefault := map[bool]string{} // the pod's first default route of each family
		for _, r := range att.Routes {
			_, dst, _ := net.ParseCIDR(r.Destination)
			if ones, _ := dst.Mask.Size(); ones == 0 && podDefault[dst.IP.To4() != nil] == "" {
				podDefault[dst.IP.To4() != nil] = r.Gateway
			}
		}
		roles, _ := att.AddressRoles()
		var routes []string
		for i, want := range att.Interfaces {
			got := doc.Config[i]
			if got.Type != "physical" || got.Name != want.Name || got.MAC != want.MAC || got.MTU != max(want.MTU, 0) {
				t.Fatalf("interface %d: %+v, want %+v\n%s", i, got, want, out)
			}
			if len(want.IPs) == 0 {
				if len(got.Subnets) != 1 || got.Subnets[0].Type != "dhcp" {
					t.Fatalf("interface %d without addresses: %+v", i, got.Subnets)
				}
				continue
			}
			if len(got.Subnets) != len(want.IPs) {
				t.Fatalf("interface %d: subnets %+v, addresses %+v", i, got.Subnets, want.IPs)
			}
			for j, sn := range got.Subnets {
				addr, subnet, _ := net.ParseCIDR(want.IPs[j].Address)
				v4 := addr.To4() != nil
				if sn.Type == "dhcp" {
					// Only for an IPv4 address whose gateway is on the
					// link, outside its subnet: DHCP says what it is.
					gw := net.ParseIP(roles[[2]int{i, j}].Gateway)
					if !v4 || gw == nil || subnet.Contains(gw) {
						t.Fatalf("interface %d subnet %d: dhcp for %+v (gateway %v)", i, j, want.IPs[j], gw)
					}
					gateways[v4]++
					defaultVia[v4] = gw.String()
					continue
				}
				if sn.Type != "static" || sn.Address != want.IPs[j].Address || (sn.Gateway != "" && sn.Gateway != want.IPs[j].Gateway && sn.Gateway != podDefault[v4]) {
					t.Fatalf("interface %d subnet %d: %+v, want %+v", i, j, sn, want.IPs[j])
				}
				if sn.Gateway != "" {
					gateways[v4]++
					defaultVia[v4] = sn.Gateway
				}
				for _, r := range sn.Routes {
					_, dst, err := net.ParseCIDR(r.Network)
					if err != nil || net.ParseIP(r.Gateway) == nil {
						t.Fatalf("route %+v", r)
					}
					if (dst.IP.To4() != nil) != v4 {
						t.Fatalf("route %+v under an address of the other family: %+v", r, sn)
					}
					if ones, _ := dst.Mask.Size(); ones == 0 {
						gateways[v4]++
					}
					routes = append(routes, fmt.Sprint(r))
				}
			}
		}
		if gateways[true] > 1 || gateways[false] > 1 {
			t.Fatalf("several default routes of a family:\n%s", out)
		}
		for v4, gw := range podDefault {
			if hasFamily := defaultVia[v4] != "" || slices.ContainsFunc(att.Interfaces, func(i ports.NetworkInterface) bool {
				return slices.ContainsFunc(i.IPs, func(c ports.IPConfig) bool { a, _, _ := net.ParseCIDR(c.Address); return (a.To4() != nil) == v4 })
			}); hasFamily && defaultVia[v4] != gw {
				t.Fatalf("the pod's default route via %s is not the guest's (%q):\n%s", gw, defaultVia[v4], out)
			}
		}
		for _, r := range routes {
			if n := len(slices.DeleteFunc(slices.Clone(routes), func(s string) bool { return s != r })); n > 1 {
				t.Fatalf("route %s given %d times:\n%s", r, n, out)
			}
		}
		if att.DNS != nil {
			ns := doc.Config[len(doc.Config)-1]
			if ns.Type != "nameserver" || !slices.Equal(ns.Address, att.DNS.Servers) || !slices.Equal(ns.Search, att.DNS.Searches) {
				t.Fatalf("nameserver %+v, want %+v", ns, att.DNS)
			}
		}
	})
}
