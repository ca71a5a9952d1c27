package nodeinspect

import (
	"fmt"
	"net"
	"runtime"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// readNetwork prints the interfaces with their addresses (as `ip a`) and
// the main table's routes (as `ip r`, IPv4 and IPv6) of the network
// namespace at path, or of the daemon's own (the node's) when path is "".
func readNetwork(path string) (links, routes string, err error) {
	if path == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return "", "", fmt.Errorf("netlink: %w", err)
		}
		defer h.Close()
		return dump(h)
	}
	type result struct {
		links, routes string
		err           error
	}
	done := make(chan result, 1)
	go func() {
		// The handle's sockets are made inside the namespace, on this
		// thread, which then returns to the node's namespace. The thread
		// stays locked: should it fail to return, it ends with this
		// goroutine instead of serving others inside a pod's namespace.
		runtime.LockOSThread()
		var r result
		r.links, r.routes, r.err = dumpAt(path)
		done <- r
	}()
	r := <-done
	return r.links, r.routes, r.err
}

func dumpAt(path string) (string, string, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return "", "", fmt.Errorf("open %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return "", "", fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	return dump(h)
}

// dump reads the links, addresses and routes through one handle.
func dump(h *netlink.Handle) (string, string, error) {
	links, err := h.LinkList()
	if err != nil {
		return "", "", fmt.Errorf("list links: %w", err)
	}
	addrs := map[int][]netlink.Addr{}
	for _, l := range links {
		a, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return "", "", fmt.Errorf("addresses of %s: %w", l.Attrs().Name, err)
		}
		addrs[l.Attrs().Index] = a
	}
	routes, err := h.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return "", "", fmt.Errorf("list routes: %w", err)
	}
	names := linkNames(links)
	return formatLinks(links, addrs, names), formatRoutes(routes, names), nil
}

func linkNames(links []netlink.Link) map[int]string {
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	return names
}

// formatLinks prints links as `ip a` does, closely enough to read alike.
func formatLinks(links []netlink.Link, addrs map[int][]netlink.Addr, names map[int]string) string {
	sort.Slice(links, func(i, j int) bool { return links[i].Attrs().Index < links[j].Attrs().Index })
	var b strings.Builder
	for _, l := range links {
		a := l.Attrs()
		flags := ""
		if a.Flags != 0 {
			flags = strings.ToUpper(strings.ReplaceAll(a.Flags.String(), "|", ","))
		}
		fmt.Fprintf(&b, "%d: %s: <%s> mtu %d state %s type %s", a.Index, a.Name, flags, a.MTU, a.OperState, l.Type())
		if a.MasterIndex != 0 {
			fmt.Fprintf(&b, " master %s", nameOf(names, a.MasterIndex))
		}
		fmt.Fprintf(&b, "\n    link/%s", linkKind(a))
		if len(a.HardwareAddr) > 0 {
			fmt.Fprintf(&b, " %s", a.HardwareAddr)
		}
		b.WriteString("\n")
		for _, ad := range addrs[a.Index] {
			family := "inet"
			if ad.IP.To4() == nil {
				family = "inet6"
			}
			fmt.Fprintf(&b, "    %s %s scope %s", family, ad.IPNet, netlink.Scope(ad.Scope))
			if ad.Label != "" {
				fmt.Fprintf(&b, " %s", ad.Label)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func linkKind(a *netlink.LinkAttrs) string {
	switch {
	case a.Flags&net.FlagLoopback != 0:
		return "loopback"
	case len(a.HardwareAddr) == 6:
		return "ether"
	}
	return "none"
}

// formatRoutes prints routes as `ip r` (and `ip -6 r`) do.
func formatRoutes(routes []netlink.Route, names map[int]string) string {
	var b strings.Builder
	for _, r := range routes {
		dst := "default"
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones > 0 {
				dst = r.Dst.String()
			}
		}
		b.WriteString(dst)
		if r.Gw != nil {
			fmt.Fprintf(&b, " via %s", r.Gw)
		}
		for _, nh := range r.MultiPath {
			fmt.Fprintf(&b, " nexthop via %s dev %s", nh.Gw, nameOf(names, nh.LinkIndex))
		}
		if r.LinkIndex != 0 {
			fmt.Fprintf(&b, " dev %s", nameOf(names, r.LinkIndex))
		}
		fmt.Fprintf(&b, " proto %s scope %s", r.Protocol, r.Scope)
		if r.Src != nil {
			fmt.Fprintf(&b, " src %s", r.Src)
		}
		if r.Priority != 0 {
			fmt.Fprintf(&b, " metric %d", r.Priority)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func nameOf(names map[int]string, index int) string {
	if n, ok := names[index]; ok {
		return n
	}
	return fmt.Sprintf("if%d", index)
}
