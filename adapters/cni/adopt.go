package cni

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// AdoptMACs serves the pod's interfaces under the MACs a restored VM's
// NICs keep (ports.MACAdopter): the attachment names them, and the pod's
// DHCP servers answer them. The MACs come from a checkpoint, which anyone
// may have written: each must be a unicast Ethernet address that no other
// pod on this node uses, or the VM could take another pod's frames on the
// node's bridges.
func (n *Network) AdoptMACs(ctx context.Context, req ports.NetworkRequest, macs []string) (ports.NetworkAttachment, error) {
	if err := validSandboxID(req.SandboxID); err != nil {
		return ports.NetworkAttachment{}, err
	}
	defer n.lockPod(req.SandboxID)()
	r, err := n.load(req.SandboxID)
	if errors.Is(err, os.ErrNotExist) || err == nil && !r.Ready {
		return ports.NetworkAttachment{}, fmt.Errorf("pod %s/%s has no network set up: %w", req.PodNamespace, req.PodName, ports.ErrFailedPrecondition)
	}
	if err != nil {
		return ports.NetworkAttachment{}, err
	}
	if len(macs) != len(r.Attachment.Interfaces) {
		return ports.NetworkAttachment{}, &ports.InvalidError{Field: "NIC MACs", Value: strings.Join(macs, ","),
			Reason:  fmt.Sprintf("the pod has %d interfaces, the VM %d NICs", len(r.Attachment.Interfaces), len(macs)),
			Allowed: "one MAC per pod interface"}
	}
	// One adoption at a time on the node: two pods must not both find a
	// MAC free and take it.
	n.adoptMu.Lock()
	defer n.adoptMu.Unlock()
	inUse, err := n.macsInUse(req.SandboxID)
	if err != nil {
		return ports.NetworkAttachment{}, err
	}
	parsed := make([]string, len(macs))
	for i, m := range macs {
		mac, err := net.ParseMAC(m)
		switch {
		case err != nil || len(mac) != 6:
			return ports.NetworkAttachment{}, &ports.InvalidError{Field: "NIC MAC", Value: m, Reason: "not an Ethernet MAC address", Allowed: "xx:xx:xx:xx:xx:xx"}
		case mac[0]&1 != 0 || net.HardwareAddr(mac).String() == "00:00:00:00:00:00":
			return ports.NetworkAttachment{}, &ports.InvalidError{Field: "NIC MAC", Value: m, Reason: "a multicast or zero address", Allowed: "a unicast MAC address"}
		case inUse[mac.String()] != "":
			return ports.NetworkAttachment{}, fmt.Errorf("NIC MAC %s is the MAC of pod %s on this node: a VM restored here cannot keep it: %w",
				mac, inUse[mac.String()], ports.ErrAlreadyExists)
		}
		parsed[i] = mac.String()
	}
	for i := range r.Attachment.Interfaces {
		r.Attachment.Interfaces[i].MAC = parsed[i]
	}
	r.Leases = leasesFor(r.Attachment, r.Links, r.PodName)
	if err := n.serve(r); err != nil {
		return ports.NetworkAttachment{}, err
	}
	if err := n.save(r); err != nil {
		return ports.NetworkAttachment{}, fmt.Errorf("record pod network: %w", err)
	}
	n.Log.WithFields(logrus.Fields{"sandbox": r.SandboxID, "macs": strings.Join(parsed, ",")}).Info("pod interfaces serve the restored VM's MACs")
	return r.Attachment, nil
}

// macsInUse maps the MACs of the other pods' interfaces on this node to
// their pods.
func (n *Network) macsInUse(except string) (map[string]string, error) {
	entries, err := os.ReadDir(n.records)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || id == except || validSandboxID(id) != nil {
			continue
		}
		r, err := n.load(id)
		if err != nil {
			continue // unreadable records are set aside at start
		}
		for _, iface := range r.Attachment.Interfaces {
			out[strings.ToLower(iface.MAC)] = r.Namespace + "/" + r.PodName
		}
	}
	return out, nil
}

var _ ports.MACAdopter = (*Network)(nil)
