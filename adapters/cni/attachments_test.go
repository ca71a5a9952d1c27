package cni

import (
	"encoding/json"
	"net"
	"reflect"
	"testing"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/ports"
)

func cidr(t *testing.T, s string) *net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip
	return n
}

func mac(i byte) net.HardwareAddr { return net.HardwareAddr{0x0a, 0x58, 0, 0, 0, i} }

// The links of a pod namespace that a CNI result leaves out become pod
// interfaces, in name order, with their addresses, gateways and routes;
// the loopback, Virtlet's links, links that are down, not Ethernet or a
// port of another, and the described ones stay out.
func TestUndescribedLinks(t *testing.T) {
	eth0 := []podIface{{name: "eth0", index: 0}}
	net1 := nsLink{Name: "net1", MAC: mac(1), Up: true,
		Addrs: []*net.IPNet{cidr(t, "198.18.6.7/24"), cidr(t, "fd00:6::7/64")},
		Routes: []nsRoute{
			{Dst: cidr(t, "198.18.6.0/24"), Protocol: unix.RTPROT_KERNEL},
			{Dst: cidr(t, "198.19.128.0/17"), GW: net.ParseIP("198.18.6.254"), Protocol: unix.RTPROT_BOOT},
			{GW: net.ParseIP("198.18.6.1"), Protocol: unix.RTPROT_BOOT},
			{Dst: cidr(t, "fd00:7::/64"), GW: net.ParseIP("fe80::1"), Protocol: unix.RTPROT_RA},
		}}
	for _, tc := range []struct {
		name      string
		links     []nsLink
		described []podIface
		want      []podIface
	}{
		{name: "multus attachment", links: []nsLink{{Name: "lo", Up: true, Loopback: true}, {Name: "eth0", MAC: mac(0), Up: true}, net1},
			described: eth0,
			want: []podIface{{name: "net1", index: -1, scanned: true,
				ips: []ports.IPConfig{{Address: "198.18.6.7/24", Gateway: "198.18.6.1"}, {Address: "fd00:6::7/64"}},
				routes: []ports.Route{{Destination: "198.19.128.0/17", Gateway: "198.18.6.254"},
					{Destination: "0.0.0.0/0", Gateway: "198.18.6.1"}}}}},
		{name: "numeric order", described: eth0, links: []nsLink{
			{Name: "net10", MAC: mac(10), Up: true}, {Name: "net2", MAC: mac(2), Up: true}, {Name: "net1", MAC: mac(1), Up: true}},
			want: []podIface{{name: "net1", index: -1, scanned: true}, {name: "net2", index: -1, scanned: true}, {name: "net10", index: -1, scanned: true}}},
		{name: "only a route through a gateway outside the subnet", described: eth0, links: []nsLink{{Name: "net1", MAC: mac(1), Up: true,
			Addrs: []*net.IPNet{cidr(t, "198.18.6.7/24")}, Routes: []nsRoute{{GW: net.ParseIP("198.18.9.1"), Protocol: unix.RTPROT_BOOT}}}},
			want: []podIface{{name: "net1", index: -1, scanned: true, ips: []ports.IPConfig{{Address: "198.18.6.7/24"}},
				routes: []ports.Route{{Destination: "0.0.0.0/0", Gateway: "198.18.9.1"}}}}},
		{name: "left out", described: eth0, links: []nsLink{
			{Name: "eth0", MAC: mac(0), Up: true},
			{Name: "tunl0", Up: false},                                  // a fallback tunnel, down and no Ethernet
			{Name: "gretap0", MAC: mac(9), Up: false},                   // down
			{Name: "sit1", MAC: net.HardwareAddr{1, 2, 3, 4}, Up: true}, // not Ethernet
			{Name: "bond-port", MAC: mac(3), Up: true, HasMaster: true},
			{Name: "br1", MAC: mac(4), Up: true}, {Name: "vm0", MAC: mac(5), Up: true}, // Virtlet's
		}},
		{name: "the implicit eth0 of a result without interfaces", described: []podIface{{name: IfName, index: -1}},
			links: []nsLink{{Name: "eth0", MAC: mac(0), Up: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := undescribed(tc.links, tc.described); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// A Multus result describes eth0 alone: net1, read from the namespace,
// becomes the VM's second NIC with its own address, and its default route
// yields to eth0's in the DHCP leases while its other route goes with it.
func TestAttachmentOfUndescribedInterface(t *testing.T) {
	var res types100.Result
	if err := json.Unmarshal([]byte(`{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"0a:58:c6:12:05:07","sandbox":"/n"}],
	  "ips":[{"interface":0,"address":"198.18.5.7/24","gateway":"198.18.5.1"}],"routes":[{"dst":"0.0.0.0/0"}]}`), &res); err != nil {
		t.Fatal(err)
	}
	const sandbox = "0123456789abcdef"
	r := &record{SandboxID: sandbox, NetNS: "/n"}
	ifaces := append(podInterfaces(&res), podIface{name: "net1", index: -1, scanned: true,
		ips:    []ports.IPConfig{{Address: "198.18.6.7/24", Gateway: "198.18.6.1"}},
		routes: []ports.Route{{Destination: "198.19.128.0/17", Gateway: "198.18.6.254"}, {Destination: "0.0.0.0/0", Gateway: "198.18.6.1"}}})
	for i, pi := range ifaces {
		r.Links = append(r.Links, plumbingFor(sandbox, i, pi.name))
		ifaces[i].wired = podInterface{MAC: mac(byte(i)), MTU: 1500}
	}
	att, err := attachment(r, &res, ifaces, ports.NetworkRequest{SandboxID: sandbox, PodName: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if len(att.Interfaces) != 2 || att.Interfaces[1].Name != "net1" || att.Interfaces[1].MAC != mac(1).String() ||
		!reflect.DeepEqual(att.Interfaces[1].IPs, ifaces[1].ips) || att.Interfaces[1].Bridge != "vlb1"+sandbox[:11] {
		t.Fatalf("interfaces %+v", att.Interfaces)
	}
	wantRoutes := []ports.Route{{Destination: "0.0.0.0/0", Gateway: "198.18.5.1"},
		{Destination: "198.19.128.0/17", Gateway: "198.18.6.254"}, {Destination: "0.0.0.0/0", Gateway: "198.18.6.1"}}
	if !reflect.DeepEqual(att.Routes, wantRoutes) {
		t.Errorf("routes %+v, want %+v", att.Routes, wantRoutes)
	}
	leases := leasesFor(att, r.Links, "p")
	if len(leases) != 2 {
		t.Fatalf("leases %+v: want one per NIC", leases)
	}
	l1 := leases[1]
	if l1.Bridge != "br1" || !l1.IP.Equal(net.ParseIP("198.18.6.7")) || l1.Gateway != nil || !l1.ServerID.Equal(net.ParseIP("198.18.6.1")) ||
		len(l1.Routes) != 1 || l1.Routes[0].Dest.String() != "198.19.128.0/17" {
		t.Errorf("net1 lease %+v: want its address, no router, its gateway as server, its route", l1)
	}
	if !leases[0].Gateway.Equal(net.ParseIP("198.18.5.1")) {
		t.Errorf("eth0 lease %+v: want the default route's gateway", leases[0])
	}
}
