package cni

import (
	"cmp"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/virtlet/virtlet/ports"
)

// A meta plugin need not describe every interface it makes: Multus
// returns its master network's result alone, and its other attachments
// (net1, net2…) exist only in the pod's network namespace (and in the
// pod's network-status annotation, which a runtime does not see). The
// namespace's links that the result leaves out are therefore read from
// the namespace itself, and reach the VM like the others.

// nsLink is a link of the pod's network namespace as netlink reports it.
type nsLink struct {
	Name      string
	MAC       net.HardwareAddr
	Up        bool // administratively
	Loopback  bool
	HasMaster bool // a port of a bridge or bond in the namespace
	Addrs     []*net.IPNet
	Routes    []nsRoute // in the main table, through this link
}

// nsRoute is a route through a link.
type nsRoute struct {
	Dst      *net.IPNet // nil: the default route
	GW       net.IP
	Protocol int // RTPROT_*: the kernel's own and router advertisements' are not CNI's
}

// virtletLinks are the names Virtlet gives its own links in the pod
// namespace (plumbingFor).
var virtletLinks = regexp.MustCompile(`^(br|vm)[0-9]$`)

// undescribed returns, as pod interfaces, the namespace's links that the
// result's interfaces (described) leave out and that look like a network
// attachment: up, Ethernet, not a port of another link, neither the
// loopback nor Virtlet's. They come in the order of their names, with
// numbers compared as numbers (net2 before net10), each with its own
// addresses and the routes through it.
func undescribed(links []nsLink, described []podIface) []podIface {
	var out []podIface
	for _, l := range links {
		if !isAttachment(l) || slices.ContainsFunc(described, func(d podIface) bool { return d.name == l.Name }) {
			continue
		}
		out = append(out, scannedIface(l))
	}
	slices.SortFunc(out, func(a, b podIface) int { return compareNames(a.name, b.name) })
	return out
}

func isAttachment(l nsLink) bool {
	return l.Up && !l.Loopback && !l.HasMaster && len(l.MAC) == 6 && !virtletLinks.MatchString(l.Name)
}

// scannedIface is a link's addresses and routes as the VM takes them:
// each address with the gateway of the link's routes that it reaches
// (the default route's first), the routes that have a gateway (a route
// without one cannot be expressed by the VM's DHCP or network-config).
func scannedIface(l nsLink) podIface {
	pi := podIface{name: l.Name, index: -1, scanned: true}
	routes := slices.Clone(l.Routes)
	slices.SortStableFunc(routes, func(a, b nsRoute) int { return cmp.Compare(prefixLen(a), prefixLen(b)) })
	for _, a := range l.Addrs {
		c := ports.IPConfig{Address: a.String()}
		for _, r := range routes {
			if r.GW != nil && a.Contains(r.GW) {
				c.Gateway = r.GW.String()
				break
			}
		}
		pi.ips = append(pi.ips, c)
	}
	for _, r := range l.Routes {
		if r.GW == nil || r.Protocol == unix.RTPROT_KERNEL || r.Protocol == unix.RTPROT_RA {
			continue
		}
		pi.routes = append(pi.routes, ports.Route{Destination: destination(r).String(), Gateway: r.GW.String()})
	}
	return pi
}

// prefixLen is a route's destination prefix length (0 for the default
// route).
func prefixLen(r nsRoute) int {
	if r.Dst == nil {
		return 0
	}
	ones, _ := r.Dst.Mask.Size()
	return ones
}

// destination is the route's destination, the default route's of its
// gateway's family when netlink gives none.
func destination(r nsRoute) *net.IPNet {
	if r.Dst != nil {
		return r.Dst
	}
	if r.GW.To4() != nil {
		return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
}

// compareNames orders interface names by their stem, then by the number
// that ends them.
func compareNames(a, b string) int {
	sa, na := splitNumber(a)
	sb, nb := splitNumber(b)
	return cmp.Or(strings.Compare(sa, sb), cmp.Compare(na, nb), strings.Compare(a, b))
}

func splitNumber(name string) (string, int) {
	stem := strings.TrimRight(name, "0123456789")
	n, err := strconv.Atoi(name[len(stem):])
	if err != nil {
		return stem, -1
	}
	return stem, n
}

// readNSLinks lists the links of the network namespace at nsPath, with
// their global addresses and the main table's routes through them.
func readNSLinks(nsPath string) ([]nsLink, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("links of %s: %w", nsPath, err)
	}
	out := make([]nsLink, 0, len(links))
	for _, l := range links {
		nl, err := readNSLink(h, l)
		if err != nil {
			return nil, fmt.Errorf("pod interface %s: %w", l.Attrs().Name, err)
		}
		out = append(out, nl)
	}
	return out, nil
}

func readNSLink(h *netlink.Handle, l netlink.Link) (nsLink, error) {
	a := l.Attrs()
	nl := nsLink{Name: a.Name, MAC: a.HardwareAddr, Up: a.Flags&net.FlagUp != 0,
		Loopback: a.Flags&net.FlagLoopback != 0, HasMaster: a.MasterIndex != 0}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nl, fmt.Errorf("addresses: %w", err)
	}
	for _, ad := range addrs {
		if !ad.IP.IsLinkLocalUnicast() {
			nl.Addrs = append(nl.Addrs, ad.IPNet)
		}
	}
	routes, err := h.RouteList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nl, fmt.Errorf("routes: %w", err)
	}
	for _, r := range routes {
		nl.Routes = append(nl.Routes, nsRoute{Dst: defaultAsNil(r.Dst), GW: r.Gw, Protocol: int(r.Protocol)})
	}
	return nl, nil
}

// defaultAsNil gives the default route's destination as older netlink
// versions do: nil.
func defaultAsNil(dst *net.IPNet) *net.IPNet {
	if dst == nil {
		return nil
	}
	if ones, _ := dst.Mask.Size(); ones == 0 {
		return nil
	}
	return dst
}
