// Command virtlet-test-cni-calico is a test-only CNI plugin that sets a pod
// up the way Calico does, so tests can meet Calico's addressing with no
// Calico: a veth pair whose host end (named hostPrefix + the container ID's
// first characters) answers ARP for any address (proxy_arp) and routes the
// pod's address; in the pod, the address as a /32, an on-link route to the
// link-local gateway 169.254.1.1 and the default route through it; and a
// result with the /32 address, no gateway, and a default route without
// one, as Calico reports.
//
//	{"cniVersion": "1.0.0", "name": "calico", "type": "virtlet-test-cni-calico",
//	 "subnet": "198.18.7.0/24", "hostPrefix": "vtXcali"}
//
// The pod's address is picked in subnet from a hash of the container ID:
// the tests that use it run a few pods, and no state is kept.
package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// gateway is Calico's link-local gateway.
var gateway = net.IPv4(169, 254, 1, 1)

type netConf struct {
	types.NetConf
	Subnet     string `json:"subnet"`
	HostPrefix string `json:"hostPrefix"`
}

func parse(args *skel.CmdArgs) (*netConf, *net.IPNet, error) {
	var c netConf
	if err := json.Unmarshal(args.StdinData, &c); err != nil {
		return nil, nil, fmt.Errorf("parse config: %w", err)
	}
	_, subnet, err := net.ParseCIDR(c.Subnet)
	if err != nil || subnet.IP.To4() == nil {
		return nil, nil, fmt.Errorf("subnet %q: want an IPv4 CIDR", c.Subnet)
	}
	if c.HostPrefix == "" || len(c.HostPrefix) > 8 {
		return nil, nil, fmt.Errorf("hostPrefix %q: want 1 to 8 characters", c.HostPrefix)
	}
	return &c, subnet, nil
}

// address picks the pod's address in subnet from the container ID.
func address(subnet *net.IPNet, containerID string) net.IP {
	ones, bits := subnet.Mask.Size()
	size := uint32(1) << (bits - ones)
	h := sha256.Sum256([]byte(containerID))
	host := 2 + binary.BigEndian.Uint32(h[:4])%(size-3) // not the network, .1 or the broadcast
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, binary.BigEndian.Uint32(subnet.IP.To4())+host)
	return ip
}

func hostName(c *netConf, containerID string) string {
	return c.HostPrefix + containerID[:min(len(containerID), 15-len(c.HostPrefix))]
}

func cmdAdd(args *skel.CmdArgs) error {
	c, subnet, err := parse(args)
	if err != nil {
		return err
	}
	ip := address(subnet, args.ContainerID)
	pod, err := netns.GetFromPath(args.Netns)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", args.Netns, err)
	}
	defer pod.Close()
	host := hostName(c, args.ContainerID)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: args.IfName, PeerNamespace: netlink.NsFd(int(pod))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", host, err)
	}
	hostLink, err := netlink.LinkByName(host)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv4/conf", host, "proxy_arp"), []byte("1"), 0o644); err != nil {
		return fmt.Errorf("proxy_arp on %s: %w", host, err)
	}
	if err := netlink.LinkSetUp(hostLink); err != nil {
		return err
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: hostLink.Attrs().Index, Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("host route to %s: %w", ip, err)
	}
	h, err := netlink.NewHandleAt(pod)
	if err != nil {
		return err
	}
	defer h.Close()
	podLink, err := h.LinkByName(args.IfName)
	if err != nil {
		return err
	}
	if err := h.AddrAdd(podLink, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}}); err != nil {
		return err
	}
	if err := h.LinkSetUp(podLink); err != nil {
		return err
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: podLink.Attrs().Index, Dst: &net.IPNet{IP: gateway, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("pod route to %s: %w", gateway, err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: podLink.Attrs().Index, Gw: gateway}); err != nil {
		return fmt.Errorf("pod default route: %w", err)
	}
	zero := 0
	result := &types100.Result{
		CNIVersion: c.CNIVersion,
		Interfaces: []*types100.Interface{{Name: args.IfName, Mac: podLink.Attrs().HardwareAddr.String(), Sandbox: args.Netns}},
		IPs:        []*types100.IPConfig{{Interface: &zero, Address: net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}}},
		Routes:     []*types.Route{{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}},
	}
	return types.PrintResult(result, c.CNIVersion)
}

func cmdDel(args *skel.CmdArgs) error {
	c, _, err := parse(args)
	if err != nil {
		return err
	}
	if l, err := netlink.LinkByName(hostName(c, args.ContainerID)); err == nil {
		return netlink.LinkDel(l)
	}
	return nil
}

func cmdCheck(*skel.CmdArgs) error { return nil }

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck}, version.All, "virtlet-test-cni-calico")
}
