package cni

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Names of the links inside a pod's network namespace.
const (
	podBridge = "br0" // joins the CNI interface and the link to the VM
	podVeth   = "vm0" // pod end of the veth pair towards the host bridge
)

// plumbing names the host-side links of one pod (15 characters at most).
type plumbing struct {
	HostBridge string `json:"hostBridge"` // the bridge libvirt attaches the VM's tap to
	HostVeth   string `json:"hostVeth"`   // host end of the veth pair into the pod
}

func plumbingFor(sandboxID string) plumbing {
	id := sandboxID
	if len(id) > 11 {
		id = id[:11]
	}
	return plumbing{HostBridge: "vlb-" + id, HostVeth: "vlh-" + id}
}

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
// The DHCP server listens on br0.
func wireVM(nsPath, ifName string, p plumbing) (podInterface, error) {
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
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: podBridge, MTU: pi.MTU}}
	if err := pod.LinkAdd(br); err != nil {
		return pi, fmt.Errorf("pod bridge: %w", err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: podVeth, MTU: pi.MTU},
		PeerName: p.HostVeth, PeerNamespace: netlink.NsFd(int(host))}
	if err := pod.LinkAdd(veth); err != nil {
		return pi, fmt.Errorf("veth pair %s/%s: %w", podVeth, p.HostVeth, err)
	}
	for _, name := range []string{ifName, podVeth} {
		l, err := pod.LinkByName(name)
		if err != nil {
			return pi, err
		}
		if err := pod.LinkSetMaster(l, br); err != nil {
			return pi, fmt.Errorf("join %s to %s: %w", name, podBridge, err)
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
	if err := netlink.LinkSetMaster(hveth, hbr); err != nil {
		return pi, fmt.Errorf("join %s to %s: %w", p.HostVeth, p.HostBridge, err)
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
