package cni

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/virtlet/virtlet/ports"
)

// FuzzLeases: from any CNI result, the attachment is refused, or every
// pod interface with an IPv4 address gets a DHCP lease whose OFFER and ACK
// carry, byte for byte, what the lease says (the address, its mask, one
// default route, the routes, DNS, search domains, MTU and hostname), a
// REQUEST for another address gets a NAK, and the lease answers the same
// after the record's round trip through JSON (a daemon restart).
func FuzzLeases(f *testing.F) {
	f.Add(`{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"0a:58:c6:12:05:07","sandbox":"/run/netns/x"}],`+
		`"ips":[{"interface":0,"address":"198.18.5.7/24","gateway":"198.18.5.1"},{"interface":0,"address":"fd00:198:18:5::7/64","gateway":"fd00:198:18:5::1"}],`+
		`"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"},{"dst":"198.19.0.0/16","gw":"198.18.5.254"}],"dns":{"nameservers":["198.18.5.10"],"search":["svc.cluster.local"]}}`,
		"vm", "", "", uint16(1500))
	f.Add(`{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/n"},{"name":"net1","mac":"0a:58:c6:12:11:07","sandbox":"/n"}],`+
		`"ips":[{"interface":0,"address":"198.18.16.5/24","gateway":"198.18.16.1"},{"interface":1,"address":"198.18.17.7/24","gateway":"198.18.17.1"}],`+
		`"routes":[{"dst":"0.0.0.0/0","gw":"198.18.16.1"},{"dst":"198.19.128.0/17","gw":"198.18.17.1"}]}`,
		"two-nics", "198.18.0.10", "default.svc.cluster.local", uint16(9000))
	f.Add(`{"cniVersion":"0.4.0","ips":[{"address":"10.1.2.3/8"}]}`, "", "", "", uint16(0))
	f.Fuzz(func(t *testing.T, result, podName, dnsServer, search string, mtu uint16) {
		if !utf8.ValidString(podName + dnsServer + search) {
			return // kubelet's strings come over gRPC: UTF-8
		}
		var res types100.Result
		if err := json.Unmarshal([]byte(result), &res); err != nil {
			return
		}
		ifaces := podInterfaces(&res)
		if len(ifaces) > maxInterfaces {
			return
		}
		const sandbox = "0123456789abcdef"
		r := &record{SandboxID: sandbox, NetNS: "/run/netns/virtlet-" + sandbox}
		for i, pi := range ifaces {
			r.Links = append(r.Links, plumbingFor(sandbox, i, pi.name))
			ifaces[i].wired = podInterface{MAC: net.HardwareAddr{0x0a, 0x58, 0, 0, 0, byte(i)}, MTU: int(mtu)}
		}
		req := ports.NetworkRequest{SandboxID: sandbox, PodName: podName}
		if dnsServer != "" || search != "" {
			req.DNS = &ports.DNSConfig{Servers: strings.Split(dnsServer, ","), Searches: strings.Split(search, ",")}
		}
		att, err := attachment(r, &res, ifaces, req)
		if err != nil {
			return
		}
		leases := leasesFor(att, r.Links, podName)
		for k, iface := range att.Interfaces {
			hasV4 := slices.ContainsFunc(iface.IPs, func(c ports.IPConfig) bool {
				ip, _, err := net.ParseCIDR(c.Address)
				return err == nil && ip.To4() != nil
			})
			n := 0
			for _, l := range leases {
				if l.Bridge == r.Links[k].PodBridge {
					n++
				}
			}
			if hasV4 && n != 1 {
				t.Fatalf("interface %d (%+v) has an IPv4 address and %d leases: %+v", k, iface, n, leases)
			}
		}
		if len(leases) > 0 && att.DNS != nil {
			// The first lease carries the search list: every name of it
			// that is a DNS name (Kubernetes accepts longer labels in a
			// dnsConfig, which the option cannot carry), and nothing else.
			for _, name := range leases[0].Search {
				if name == "" || !slices.Contains(att.DNS.Searches, name) && !slices.Contains(att.DNS.Searches, name+".") {
					t.Fatalf("search %q, asked for %q", leases[0].Search, att.DNS.Searches)
				}
			}
			for _, name := range att.DNS.Searches {
				name = strings.TrimSuffix(name, ".")
				if isDNSName(name) && !slices.Contains(leases[0].Search, name) {
					t.Fatalf("search %q lacks %q", leases[0].Search, name)
				}
			}
		}
		for _, l := range leases {
			// The pod's name as host name, when it is a DNS name.
			if valid := isDNSName(podName); valid && l.Hostname != podName || !valid && l.Hostname != "" {
				t.Fatalf("host name %q for pod %q", l.Hostname, podName)
			}
			want := checkLease(t, l)
			raw, err := json.Marshal(l)
			if err != nil {
				t.Fatalf("lease %+v cannot be recorded: %v", l, err)
			}
			var restored lease
			if err := json.Unmarshal(raw, &restored); err != nil {
				t.Fatalf("recorded lease does not read back: %v\n%s", err, raw)
			}
			if got := checkLease(t, restored); got != want {
				t.Fatalf("the restored lease answers otherwise:\n%s\n%s", want, got)
			}
		}
	})
}

// isDNSName: a Kubernetes DNS subdomain whose labels DNS can carry.
func isDNSName(s string) bool {
	valid := len(validation.IsDNS1123Subdomain(s)) == 0
	for _, label := range strings.Split(s, ".") {
		valid = valid && len(validation.IsDNS1123Label(label)) == 0
	}
	return valid
}

// checkLease checks the lease's answers and returns them, for comparison.
func checkLease(t *testing.T, l lease) string {
	t.Helper()
	if len(l.IP.To4()) != 4 || len(l.Mask) != 4 {
		t.Fatalf("lease of %v/%v is not IPv4", l.IP, l.Mask)
	}
	var answers []string
	for _, asked := range []struct {
		typ dhcpv4.MessageType
		ip  net.IP
	}{{dhcpv4.MessageTypeDiscover, nil}, {dhcpv4.MessageTypeRequest, l.IP}, {dhcpv4.MessageTypeRequest, net.IPv4(198, 51, 100, 1)}} {
		m, err := dhcpv4.New(dhcpv4.WithHwAddr(l.MAC), dhcpv4.WithMessageType(asked.typ))
		if err != nil {
			t.Fatal(err)
		}
		m.TransactionID = dhcpv4.TransactionID{1, 2, 3, 4} // answers compare as a whole
		if asked.ip != nil {
			m.UpdateOption(dhcpv4.OptRequestedIPAddress(asked.ip))
		}
		reply, err := l.reply(m)
		if err != nil {
			t.Fatalf("reply to %s for %v: %v", asked.typ, asked.ip, err)
		}
		wire := reply.ToBytes()
		got, err := dhcpv4.FromBytes(wire)
		if err != nil {
			t.Fatalf("reply to %s does not parse: %v", asked.typ, err)
		}
		if asked.ip != nil && !asked.ip.Equal(l.IP) {
			if got.MessageType() != dhcpv4.MessageTypeNak {
				t.Fatalf("a REQUEST for %v, not the VM's %v, got %s", asked.ip, l.IP, got.MessageType())
			}
			continue
		}
		wantType := dhcpv4.MessageTypeOffer
		if asked.typ == dhcpv4.MessageTypeRequest {
			wantType = dhcpv4.MessageTypeAck
		}
		if got.MessageType() != wantType || !got.YourIPAddr.Equal(l.IP) || net.IP(got.SubnetMask()).String() != net.IP(l.Mask).String() ||
			!got.ServerIdentifier().Equal(l.serverID()) {
			t.Fatalf("%s: %s\nfor lease %+v", wantType, got.Summary(), l)
		}
		if l.Gateway != nil && (len(got.Router()) != 1 || !got.Router()[0].Equal(l.Gateway)) {
			t.Fatalf("router %v, want %v", got.Router(), l.Gateway)
		}
		routes := got.ClasslessStaticRoute()
		if len(routes) != len(l.Routes) {
			t.Fatalf("classless routes %v, want %v", routes, l.Routes)
		}
		defaults := 0
		for i, rt := range routes {
			if rt.Dest.String() != l.Routes[i].Dest.String() || !rt.Router.Equal(l.Routes[i].Router) {
				t.Fatalf("classless route %d: %v, want %v", i, rt, l.Routes[i])
			}
			if ones, _ := rt.Dest.Mask.Size(); ones == 0 {
				defaults++
			}
		}
		if len(routes) == 0 && l.Gateway != nil {
			defaults++ // clients that get no classless routes take the router option
		}
		if defaults > 1 {
			t.Fatalf("%d default routes: %v, router %v", defaults, routes, got.Router())
		}
		if dns := got.DNS(); fmt.Sprint(dns) != fmt.Sprint(l.DNS) {
			t.Fatalf("DNS %v, want %v", dns, l.DNS)
		}
		var searches []string
		if s := got.DomainSearch(); s != nil {
			searches = s.Labels
		}
		if !slices.Equal(searches, l.Search) {
			t.Fatalf("search %q, want %q", searches, l.Search)
		}
		if mtu := got.Options.Get(dhcpv4.OptionInterfaceMTU); l.MTU > 0 && (len(mtu) != 2 || int(mtu[0])<<8|int(mtu[1]) != l.MTU) {
			t.Fatalf("MTU %v, want %d", mtu, l.MTU)
		}
		if got.HostName() != l.Hostname {
			t.Fatalf("hostname %q, want %q", got.HostName(), l.Hostname)
		}
		answers = append(answers, got.Summary())
	}
	return strings.Join(answers, "\n")
}
