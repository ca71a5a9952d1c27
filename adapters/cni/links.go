package cni

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// plumbing names the links that hand one pod interface to the VM: two in
// the pod's namespace and two on the host (15 characters at most).
type plumbing struct {
	IfName     string `json:"ifName"`     // the CNI interface in the pod
	PodBridge  string `json:"podBridge"`  // joins it and the link to the VM
	PodVeth    string `json:"podVeth"`    // pod end of the veth pair towards the host
	HostBridge string `json:"hostBridge"` // the bridge libvirt attaches the VM's tap to
	HostVeth   string `json:"hostVeth"`   // host end of the veth pair into the pod
}

// plumbingFor names the links of the pod's i-th interface. Every host
// bridge is named vlb…: the first vlb-<id11>, the i-th vlb<i><id11>, so
// that one pattern (vlb+) names them all.
func plumbingFor(sandboxID string, i int, ifName string) plumbing {
	id := sandboxID
	if len(id) > 11 {
		id = id[:11]
	}
	if i == 0 {
		return plumbing{IfName: ifName, PodBridge: "br0", PodVeth: "vm0", HostBridge: "vlb-" + id, HostVeth: "vlh-" + id}
	}
	return plumbing{IfName: ifName, PodBridge: fmt.Sprintf("br%d", i), PodVeth: fmt.Sprintf("vm%d", i),
		HostBridge: fmt.Sprintf("vlb%d%s", i, id), HostVeth: fmt.Sprintf("vlh%d%s", i, id)}
}

// maxInterfaces bounds the interfaces a pod may have (the link names hold
// one digit).
const maxInterfaces = 10

// podInterface is what CNI configured on the pod's interface, before the
// VM takes it over.
type podInterface struct {
	MAC   net.HardwareAddr
	MTU   int
	Addrs []netlink.Addr
}

// wireVM hands the pod's CNI interface over to the VM: its addresses are
// removed (the VM will carry them), it gets a new random MAC (the VM takes
// the CNI MAC), and it joins a bridge with one end of a veth pair whose
// other end sits on a host bridge, where libvirt plugs the VM's tap:
//
//	VM ─tap─ vlb-<id> (host) ─ vlh-<id> ══ vm0 ─ br0 ─ eth0 (CNI) ─▶ pod network
//
// The DHCP server listens on br0. The host bridge takes no part in IP: it
// answers no ARP or neighbour discovery and forwards nothing, so the VM's
// traffic always goes through the pod's namespace, never around it.
func wireVM(nsPath string, p plumbing) (podInterface, error) {
	ifName := p.IfName
	var pi podInterface
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return pi, fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	defer ns.Close()
	pod, err := netlink.NewHandleAt(ns)
	if err != nil {
		return pi, fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	defer pod.Close()
	host, err := netns.Get()
	if err != nil {
		return pi, err
	}
	defer host.Close()

	eth, err := pod.LinkByName(ifName)
	if err != nil {
		return pi, fmt.Errorf("pod interface %s: %w", ifName, err)
	}
	if vf, err := sriovVF(nsPath, ifName); err != nil {
		return pi, fmt.Errorf("pod interface %s: %w", ifName, err)
	} else if vf != "" {
		return pi, errSRIOV(ifName, vf)
	}
	pi.MAC, pi.MTU = eth.Attrs().HardwareAddr, eth.Attrs().MTU
	addrs, err := pod.AddrList(eth, netlink.FAMILY_ALL)
	if err != nil {
		return pi, fmt.Errorf("addresses of %s: %w", ifName, err)
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		pi.Addrs = append(pi.Addrs, a)
		if err := pod.AddrDel(eth, &a); err != nil {
			return pi, fmt.Errorf("move address %s off %s: %w", a.IPNet, ifName, err)
		}
	}
	if err := pod.LinkSetDown(eth); err != nil {
		return pi, err
	}
	if err := pod.LinkSetHardwareAddr(eth, randomMAC()); err != nil {
		return pi, fmt.Errorf("new MAC for %s: %w", ifName, err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: p.PodBridge, MTU: pi.MTU}}
	if err := pod.LinkAdd(br); err != nil {
		return pi, fmt.Errorf("pod bridge %s: %w", p.PodBridge, err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.PodVeth, MTU: pi.MTU},
		PeerName: p.HostVeth, PeerNamespace: netlink.NsFd(int(host))}
	if err := pod.LinkAdd(veth); err != nil {
		return pi, fmt.Errorf("veth pair %s/%s: %w", p.PodVeth, p.HostVeth, err)
	}
	for _, name := range []string{ifName, p.PodVeth} {
		l, err := pod.LinkByName(name)
		if err != nil {
			return pi, err
		}
		if err := pod.LinkSetMaster(l, br); err != nil {
			return pi, fmt.Errorf("join %s to %s: %w", name, p.PodBridge, err)
		}
		if err := pod.LinkSetUp(l); err != nil {
			return pi, err
		}
	}
	if err := pod.LinkSetUp(br); err != nil {
		return pi, err
	}

	hbr := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: p.HostBridge, MTU: pi.MTU}}
	if err := netlink.LinkAdd(hbr); err != nil {
		return pi, fmt.Errorf("host bridge %s: %w", p.HostBridge, err)
	}
	hveth, err := netlink.LinkByName(p.HostVeth)
	if err != nil {
		return pi, err
	}
	for _, name := range []string{p.HostBridge, p.HostVeth} {
		if err := noIP(name); err != nil {
			return pi, err
		}
	}
	if err := netlink.LinkSetMaster(hveth, hbr); err != nil {
		return pi, fmt.Errorf("join %s to %s: %w", p.HostVeth, p.HostBridge, err)
	}
	// The host links name the pod's network namespace in their alias
	// (ip link shows it), so that links outliving their pod (a daemon
	// killed before the teardown) can be traced to it.
	for _, l := range []netlink.Link{hveth, hbr} {
		if err := netlink.LinkSetAlias(l, filepath.Base(nsPath)); err != nil {
			return pi, fmt.Errorf("alias of %s: %w", l.Attrs().Name, err)
		}
	}
	for _, l := range []netlink.Link{hveth, hbr} {
		if err := netlink.LinkSetUp(l); err != nil {
			return pi, err
		}
	}
	return pi, nil
}

// unwireHost deletes the host-side links (the veth's pod end goes with
// its peer); missing links are not an error.
func unwireHost(p plumbing) error {
	var errs []error
	for _, name := range []string{p.HostVeth, p.HostBridge} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				continue
			}
			errs = append(errs, fmt.Errorf("find %s: %w", name, err))
			continue
		}
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// randomMAC is a locally administered unicast address.
func randomMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	rand.Read(mac)
	mac[0] = (mac[0] | 0x02) &^ 0x01
	return mac
}

// noIP keeps a host link out of IP: no IPv6, no ARP answers for the host's
// addresses, no forwarding of what arrives on it.
func noIP(link string) error {
	for _, kv := range [][2]string{
		{"ipv6/conf/" + link + "/disable_ipv6", "1"},
		{"ipv4/conf/" + link + "/arp_ignore", "8"},
		{"ipv4/conf/" + link + "/forwarding", "0"},
	} {
		err := os.WriteFile("/proc/sys/net/"+kv[0], []byte(kv[1]), 0o644)
		if errors.Is(err, os.ErrNotExist) && strings.HasPrefix(kv[0], "ipv6/") {
			continue // a host booted without IPv6
		}
		if err != nil {
			return fmt.Errorf("sysctl net.%s: %w", strings.ReplaceAll(kv[0], "/", "."), err)
		}
	}
	return nil
}
