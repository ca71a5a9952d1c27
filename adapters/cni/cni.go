// Package cni is the pod network of VM pods on CNI (libcni): a network
// namespace per pod, CNI ADD/DEL/CHECK with kubelet's arguments, the CNI
// interface handed over to the VM through a bridge and a veth pair to a
// host bridge that libvirt plugs the VM's tap into, and a per-pod DHCP
// server that answers the VM with the CNI result.
package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/internal/atomicfile"
	"github.com/virtlet/virtlet/adapters/internal/keyedmutex"
	"github.com/virtlet/virtlet/ports"
)

// Config is the plugin's manifest config.
type Config struct {
	// The first config in lexical order is used, as kubelet-era runtimes do.
	ConfDir       string   `json:"confDir" jsonschema_description:"directory of CNI network configs (*.conflist, *.conf, *.json); the first in lexical order is used"`
	BinDirs       []string `json:"binDirs" jsonschema_description:"directories searched for CNI plugin binaries"`
	TeardownRetry string   `json:"teardownRetry,omitempty" jsonschema_description:"how often a pod network whose teardown failed (its CNI DEL, say) is torn down again, until it goes: a duration such as 1m"`
	// Daemons sharing a host (a test's beside a node's, several nodes'
	// worth) each name theirs apart.
	NetNSPrefix string `json:"netnsPrefix,omitempty" jsonschema:"pattern=^[a-z0-9][-a-z0-9.]{0\\,39}$" jsonschema_description:"the start of each pod's network namespace name, before the sandbox ID's first 16 characters"`
}

// DefaultNetNSPrefix begins the names of pods' network namespaces.
const DefaultNetNSPrefix = "virtlet-"

// netnsPrefixPattern is what a NetNSPrefix may be: a file name's start.
var netnsPrefixPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,39}$`)

// Defaults: the CNI conventions, plus where Debian installs its plugins.
var (
	DefaultConfDir = "/etc/cni/net.d"
	DefaultBinDirs = []string{"/opt/cni/bin", "/usr/lib/cni"}
)

// IfName is the pod's CNI interface.
const IfName = "eth0"

// Network is the CNI network adapter.
type Network struct {
	Log logrus.FieldLogger

	cfg      Config
	cni      *libcni.CNIConfig
	records  string // directory of per-pod records
	mu       sync.Mutex
	servers  map[string][]*dhcpServer // by sandbox ID
	configOK bool
	stop     chan struct{}  // ends the teardown retries
	pods     keyedmutex.Map // by sandbox ID: one change of a pod's network at a time
	adoptMu  sync.Mutex     // one MAC adoption at a time (AdoptMACs)
}

// lockPod serialises the changes of one pod's network: the core's calls
// and the teardown retries.
func (n *Network) lockPod(id string) func() { return n.pods.Lock(id) }

// New returns an unconfigured adapter.
func New(log logrus.FieldLogger) *Network {
	return &Network{Log: log, servers: map[string][]*dhcpServer{}}
}

func (n *Network) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "cni", Kind: ports.KindNetwork}
}

// DefaultConfig declares the plugin's config (ports.ConfigDefaulter).
func (n *Network) DefaultConfig() any {
	return Config{ConfDir: DefaultConfDir, BinDirs: DefaultBinDirs, TeardownRetry: "1m", NetNSPrefix: DefaultNetNSPrefix}
}

// Configure reads the config, and brings back the DHCP servers of the
// pods set up before a restart; it tears down what a crash interrupted.
func (n *Network) Configure(ctx context.Context, pc ports.PluginConfig) error {
	cfg := n.DefaultConfig().(Config)
	if err := pc.Decode(&cfg); err != nil {
		return err
	}
	if !netnsPrefixPattern.MatchString(cfg.NetNSPrefix) {
		return fmt.Errorf("cni config: netnsPrefix %q: want lower-case letters, digits, dots and dashes (at most 40), starting with a letter or digit: %w", cfg.NetNSPrefix, ports.ErrInvalidArgument)
	}
	if pc.StateDir == "" {
		return fmt.Errorf("cni: needs a state directory: %w", ports.ErrInvalidArgument)
	}
	n.cfg = cfg
	// The exec is given, not left to libcni: it fills a nil one in lazily,
	// on every call, which races when pods are set up concurrently.
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	n.cni = libcni.NewCNIConfigWithCacheDir(cfg.BinDirs, filepath.Join(pc.StateDir, "cache"), exec)
	n.records = filepath.Join(pc.StateDir, "pods")
	if err := os.MkdirAll(n.records, 0o700); err != nil {
		return err
	}
	if _, err := atomicfile.RemoveTemps(n.records); err != nil { // interrupted writes
		return err
	}
	if err := EnsureHostBridgeRules(); err != nil {
		return err
	}
	retry := time.Minute
	if cfg.TeardownRetry != "" {
		d, err := time.ParseDuration(cfg.TeardownRetry)
		if err != nil || d <= 0 {
			return fmt.Errorf("cni config: teardownRetry %q: want a duration such as 1m: %w", cfg.TeardownRetry, ports.ErrInvalidArgument)
		}
		retry = d
	}
	n.configOK = true
	if err := n.restore(ctx); err != nil {
		return err
	}
	n.mu.Lock()
	if n.stop == nil {
		n.stop = make(chan struct{})
		go n.retryTeardowns(retry, n.stop)
	}
	n.mu.Unlock()
	return nil
}

// retryTeardowns tears down again, every interval, the pod networks whose
// teardown failed: until CNI DEL succeeds the pod's address and namespace
// stay taken, and the core may have forgotten the pod (a failed
// RunPodSandbox) and never ask again.
func (n *Network) retryTeardowns(interval time.Duration, stop chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		entries, err := os.ReadDir(n.records)
		if err != nil {
			continue
		}
		for _, e := range entries {
			id, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok {
				continue
			}
			n.retryTeardown(id)
		}
	}
}

func (n *Network) retryTeardown(id string) {
	unlock := n.lockPod(id)
	defer unlock()
	r, err := n.load(id)
	if err != nil || !r.TeardownFailed {
		return
	}
	log := n.Log.WithFields(logrus.Fields{"sandbox": id, "pod": r.Namespace + "/" + r.PodName})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := n.teardown(ctx, r, false); err != nil {
		log.WithError(err).Warn("pod network teardown failed again; it will be retried")
		return
	}
	log.Info("pod network torn down on retry")
}

// networkConfig loads the first network config of ConfDir.
func (n *Network) networkConfig() (*libcni.NetworkConfigList, string, error) {
	files, err := libcni.ConfFiles(n.cfg.ConfDir, []string{".conflist", ".conf", ".json"})
	if err != nil {
		return nil, "", fmt.Errorf("read CNI config directory %s: %w", n.cfg.ConfDir, err)
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, "", fmt.Errorf("no CNI network config in %s: %w", n.cfg.ConfDir, ports.ErrFailedPrecondition)
	}
	f := files[0]
	var list *libcni.NetworkConfigList
	if strings.HasSuffix(f, ".conflist") {
		list, err = libcni.ConfListFromFile(f)
	} else {
		var c *libcni.NetworkConfig
		if c, err = libcni.ConfFromFile(f); err == nil {
			list, err = libcni.ConfListFromConf(c)
		}
	}
	if err != nil {
		return nil, f, fmt.Errorf("CNI config %s: %v: %w", f, err, ports.ErrFailedPrecondition)
	}
	return list, f, nil
}

// Ready reports whether a usable CNI config exists.
func (n *Network) Ready(ctx context.Context) (ports.NetworkReadiness, error) {
	if !n.configOK {
		return ports.NetworkReadiness{Reason: "NotConfigured", Message: "the CNI plugin is not configured"}, nil
	}
	if _, _, err := n.networkConfig(); err != nil {
		return ports.NetworkReadiness{Reason: "NoCNIConfig", Message: err.Error()}, nil
	}
	return ports.NetworkReadiness{Ready: true}, nil
}

// record is what the plugin keeps per pod, written before it acts so that
// a crash can be undone.
type record struct {
	SandboxID  string                  `json:"sandboxID"`
	PodName    string                  `json:"podName"`
	Namespace  string                  `json:"namespace"`
	PodUID     string                  `json:"podUID"`
	Ports      []ports.PortMapping     `json:"ports,omitempty"`
	NetNS      string                  `json:"netns"`
	Links      []plumbing              `json:"links,omitempty"`
	ConfList   json.RawMessage         `json:"confList"` // the config ADD used, for DEL
	Added      bool                    `json:"added"`    // CNI ADD succeeded: DEL must too, or the record stays
	Ready      bool                    `json:"ready"`    // set up completely, DHCP servers included
	Attachment ports.NetworkAttachment `json:"attachment"`
	Leases     []lease                 `json:"leases,omitempty"`
	// TeardownFailed: a teardown failed; it is retried (retryTeardowns).
	TeardownFailed bool `json:"teardownFailed,omitempty"`
}

func (n *Network) recordPath(id string) string { return filepath.Join(n.records, id+".json") }

func (n *Network) save(r *record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.Write(n.recordPath(r.SandboxID), data, 0o600)
}

func (n *Network) load(id string) (*record, error) {
	data, err := os.ReadFile(n.recordPath(id))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("pod network record %s: %w", id, err)
	}
	return &r, nil
}

func validSandboxID(id string) error {
	if len(id) < 12 || strings.ContainsAny(id, "/.") {
		return &ports.InvalidError{Field: "sandbox ID", Value: id, Allowed: "at least 12 characters, no '/' or '.'"}
	}
	return nil
}

// runtimeConf is what kubelet-era runtimes hand CNI: the pod's identity as
// CNI_ARGS, and the pod's hostPort mappings as the portMappings capability
// (for plugins such as portmap that ask for it).
func runtimeConf(r *record) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: r.SandboxID, NetNS: r.NetNS, IfName: IfName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", r.Namespace},
			{"K8S_POD_NAME", r.PodName},
			{"K8S_POD_INFRA_CONTAINER_ID", r.SandboxID},
			{"K8S_POD_UID", r.PodUID},
		},
	}
	var pm []map[string]interface{}
	for _, p := range r.Ports {
		if p.HostPort <= 0 {
			continue // kubelet passes container ports without a host port too
		}
		m := map[string]interface{}{"hostPort": p.HostPort, "containerPort": p.ContainerPort, "protocol": strings.ToLower(p.Protocol)}
		if p.HostIP != "" {
			m["hostIP"] = p.HostIP
		}
		pm = append(pm, m)
	}
	if len(pm) > 0 {
		rt.CapabilityArgs = map[string]interface{}{"portMappings": pm}
	}
	return rt
}

// Setup creates the pod's namespace, runs CNI ADD, hands each pod
// interface to the VM side and starts its DHCP server. On failure it undoes
// what it did before returning the error.
func (n *Network) Setup(ctx context.Context, req ports.NetworkRequest) (ports.NetworkAttachment, error) {
	if err := validSandboxID(req.SandboxID); err != nil {
		return ports.NetworkAttachment{}, err
	}
	defer n.lockPod(req.SandboxID)()
	if r, err := n.load(req.SandboxID); err == nil && r.Ready {
		return r.Attachment, nil // idempotent, even if the config changed since
	}
	list, file, err := n.networkConfig()
	if err != nil {
		return ports.NetworkAttachment{}, err
	}
	r := &record{SandboxID: req.SandboxID, PodName: req.PodName, Namespace: req.PodNamespace, PodUID: req.PodUID, Ports: req.PortMappings,
		NetNS: filepath.Join(NetNSDir, n.nsName(req.SandboxID)), ConfList: list.Bytes}
	if err := n.save(r); err != nil {
		return ports.NetworkAttachment{}, fmt.Errorf("record pod network: %w", err)
	}
	att, err := n.setup(ctx, r, list, req)
	if err != nil {
		if terr := n.teardown(context.WithoutCancel(ctx), r, !r.Added); terr != nil {
			n.Log.WithError(terr).WithField("sandbox", req.SandboxID).Warn("undo failed network setup")
		}
		return ports.NetworkAttachment{}, fmt.Errorf("CNI network %q (%s): %w", list.Name, file, err)
	}
	return att, nil
}

// nsOf is the name of the network namespace a pod's record names (one
// made under another NetNSPrefix keeps its own), else nsName's.
func (n *Network) nsOf(r *record) string {
	if dir, name := filepath.Split(r.NetNS); filepath.Clean(dir) == NetNSDir && name != "" && name != "." && name != ".." {
		return name
	}
	return n.nsName(r.SandboxID)
}

// nsName names the network namespace of a pod.
func (n *Network) nsName(sandboxID string) string {
	if len(sandboxID) > 16 {
		sandboxID = sandboxID[:16]
	}
	return n.cfg.NetNSPrefix + sandboxID
}

func (n *Network) setup(ctx context.Context, r *record, list *libcni.NetworkConfigList, req ports.NetworkRequest) (ports.NetworkAttachment, error) {
	// A namespace of this name can only be a lost earlier setup of this
	// very sandbox (its record gone with a wiped state directory).
	if err := deleteNetNS(n.nsOf(r)); err != nil {
		return ports.NetworkAttachment{}, err
	}
	if _, err := createNetNS(n.nsOf(r)); err != nil {
		return ports.NetworkAttachment{}, err
	}
	raw, err := n.cni.AddNetworkList(ctx, list, runtimeConf(r))
	if err != nil {
		return ports.NetworkAttachment{}, fmt.Errorf("CNI ADD: %w", err)
	}
	r.Added = true
	res, err := types100.NewResultFromResult(raw)
	if err != nil {
		return ports.NetworkAttachment{}, fmt.Errorf("CNI result: %w", err)
	}
	ifaces, err := allPodInterfaces(res, r.NetNS)
	if err != nil {
		return ports.NetworkAttachment{}, err
	}
	for i, pi := range ifaces {
		r.Links = append(r.Links, plumbingFor(r.SandboxID, i, pi.name))
	}
	// The link names are recorded before the links exist, so that a crash
	// in between leaves nothing a teardown cannot find.
	if err := n.save(r); err != nil {
		return ports.NetworkAttachment{}, fmt.Errorf("record pod network: %w", err)
	}
	for _, p := range r.Links {
		// Links of these names can only be left by a lost earlier setup of
		// this sandbox.
		if err := unwireHost(p); err != nil {
			return ports.NetworkAttachment{}, err
		}
	}
	for i := range ifaces {
		wired, err := wireVM(r.NetNS, r.Links[i])
		if err != nil {
			return ports.NetworkAttachment{}, fmt.Errorf("hand pod interface %s to the VM: %w", ifaces[i].name, err)
		}
		ifaces[i].wired = wired
	}
	att, err := attachment(r, res, ifaces, req)
	if err != nil {
		return ports.NetworkAttachment{}, err
	}
	r.Attachment, r.Leases = att, leasesFor(att, r.Links, req.PodName)
	if err := n.serve(r); err != nil {
		return ports.NetworkAttachment{}, err
	}
	r.Ready = true
	if err := n.save(r); err != nil {
		return ports.NetworkAttachment{}, fmt.Errorf("record pod network: %w", err)
	}
	return att, nil
}

// serve starts one DHCP server per NIC that has an IPv4 lease.
func (n *Network) serve(r *record) error {
	var srvs []*dhcpServer
	for _, l := range r.Leases {
		srv, err := startDHCP(r.NetNS, l, n.Log.WithFields(logrus.Fields{"sandbox": r.SandboxID, "bridge": l.Bridge}))
		if err != nil {
			for _, s := range srvs {
				s.Close()
			}
			return err
		}
		srvs = append(srvs, srv)
	}
	n.mu.Lock()
	for _, old := range n.servers[r.SandboxID] {
		old.Close()
	}
	n.servers[r.SandboxID] = srvs
	n.mu.Unlock()
	return nil
}

// podIface is one interface CNI made in the pod's namespace.
type podIface struct {
	name  string
	index int    // in the CNI result's interfaces, -1 when the result lists none
	mac   string // as the result reports it
	wired podInterface
	// scanned: the result does not describe it (a meta plugin's other
	// attachments); its addresses and routes are the namespace's.
	scanned bool
	ips     []ports.IPConfig
	routes  []ports.Route
}

// allPodInterfaces lists the pod's interfaces: the CNI result's, then the
// namespace's links the result leaves out (undescribed).
func allPodInterfaces(res *types100.Result, nsPath string) ([]podIface, error) {
	ifaces := podInterfaces(res)
	links, err := readNSLinks(nsPath)
	if err != nil {
		return nil, fmt.Errorf("find the pod interfaces the CNI result leaves out: %w", err)
	}
	ifaces = append(ifaces, undescribed(links, ifaces)...)
	if len(ifaces) > maxInterfaces {
		return nil, fmt.Errorf("the pod has %d interfaces; a VM pod takes at most %d", len(ifaces), maxInterfaces)
	}
	return ifaces, nil
}

// podInterfaces lists the pod's interfaces in the CNI result: those with a
// sandbox path, in the result's order (a meta plugin like CNI-Genie
// reports several). A result that lists no interface (some plugins do
// not) means the one interface runtimes always ask for.
func podInterfaces(res *types100.Result) []podIface {
	var out []podIface
	for i, in := range res.Interfaces {
		if in.Sandbox != "" {
			out = append(out, podIface{name: in.Name, index: i, mac: in.Mac})
		}
	}
	if len(out) == 0 {
		out = []podIface{{name: IfName, index: -1}}
	}
	return out
}

// attachment turns the CNI result into what the VM gets: per interface the
// CNI MAC and the addresses CNI gave it (the namespace's, for an interface
// the result leaves out), the routes with their gateways filled in (a CNI
// route without one goes through the interface's gateway), then the
// routes of the interfaces the result leaves out, and the pod's DNS.
func attachment(r *record, res *types100.Result, ifaces []podIface, req ports.NetworkRequest) (ports.NetworkAttachment, error) {
	att := ports.NetworkAttachment{NetNSPath: r.NetNS}
	for k, pi := range ifaces {
		iface := ports.NetworkInterface{Name: pi.name, MAC: pi.wired.MAC.String(), MTU: pi.wired.MTU, Bridge: r.Links[k].HostBridge}
		if pi.mac != "" {
			mac, err := net.ParseMAC(pi.mac)
			if err != nil || len(mac) != 6 {
				return ports.NetworkAttachment{}, fmt.Errorf("the CNI result gives interface %s the MAC %q, not an Ethernet MAC address", pi.name, pi.mac)
			}
			iface.MAC = mac.String()
		}
		iface.IPs = pi.ips
		if !pi.scanned {
			iface.IPs = resultIPs(res, pi, k == 0)
		}
		att.Interfaces = append(att.Interfaces, iface)
	}
	if len(att.Interfaces[0].IPs) == 0 {
		return ports.NetworkAttachment{}, errors.New("the CNI result has no IP address for the pod")
	}
	onLinkGateways(&att, res)
	att.Routes = resultRoutes(res, att.Interfaces)
	for _, pi := range ifaces {
		for _, route := range pi.routes {
			if !slices.Contains(att.Routes, route) {
				att.Routes = append(att.Routes, route)
			}
		}
	}
	att.DNS = req.DNS
	if att.DNS == nil && (len(res.DNS.Nameservers) > 0 || len(res.DNS.Search) > 0) {
		att.DNS = &ports.DNSConfig{Servers: res.DNS.Nameservers, Searches: res.DNS.Search, Options: res.DNS.Options}
	}
	if err := att.Validate(); err != nil {
		return ports.NetworkAttachment{}, fmt.Errorf("the CNI result: %w", err)
	}
	return att, nil
}

// resultIPs are the addresses the CNI result gives a pod interface; the
// first interface also takes the addresses attributed to none (or, when
// the result lists no interface, all of them).
func resultIPs(res *types100.Result, pi podIface, first bool) []ports.IPConfig {
	var out []ports.IPConfig
	for _, ip := range res.IPs {
		switch {
		case ip.Interface != nil && *ip.Interface == pi.index:
		case ip.Interface == nil && first: // unattributed addresses belong to the first interface
		case ip.Interface != nil && pi.index == -1 && first:
		default:
			continue
		}
		c := ports.IPConfig{Address: ip.Address.String()}
		if ip.Gateway != nil {
			c.Gateway = ip.Gateway.String()
		}
		out = append(out, c)
	}
	return out
}

// resultRoutes are the CNI result's routes, a route without a gateway
// going through the first interface's gateway of its family.
func resultRoutes(res *types100.Result, ifaces []ports.NetworkInterface) []ports.Route {
	var out []ports.Route
	for _, rt := range res.Routes {
		route := ports.Route{Destination: rt.Dst.String()}
		if rt.GW != nil {
			route.Gateway = rt.GW.String()
		} else if gw := gatewayFor(ifaces, rt.Dst.IP.To4() != nil); gw != "" {
			route.Gateway = gw
		} else {
			continue // no next hop known: the route cannot be expressed
		}
		if slices.Contains(out, route) {
			continue // a meta plugin's delegates may each report it
		}
		out = append(out, route)
	}
	return out
}

// CalicoGateway is the link-local gateway Calico gives pods (and answers
// ARP for on the host's end of their veth).
var CalicoGateway = net.IPv4(169, 254, 1, 1)

// onLinkGateways gives a Calico-style address its gateway: an IPv4 /32
// without one, in a result whose IPv4 default route has none either (Calico
// sets it up in the pod's namespace through 169.254.1.1, on-link, and
// reports neither). The VM then reaches 169.254.1.1 on its link, which
// Calico's host end answers, as Virtlet's Calico support had it; the DHCP
// lease says so as clients of a /32 lease expect (router outside the
// subnet, reached on-link).
func onLinkGateways(att *ports.NetworkAttachment, res *types100.Result) {
	deviceDefault := slices.ContainsFunc(res.Routes, func(r *cnitypes.Route) bool {
		ones, _ := r.Dst.Mask.Size()
		return ones == 0 && r.Dst.IP.To4() != nil && r.GW == nil
	})
	if !deviceDefault {
		return
	}
	for i := range att.Interfaces {
		for j, c := range att.Interfaces[i].IPs {
			ip, ipnet, err := net.ParseCIDR(c.Address)
			if err != nil || ip.To4() == nil || c.Gateway != "" {
				continue
			}
			if ones, _ := ipnet.Mask.Size(); ones == 32 {
				att.Interfaces[i].IPs[j].Gateway = CalicoGateway.String()
			}
		}
	}
}

// gatewayFor is the first gateway of the family among the interfaces.
func gatewayFor(ifaces []ports.NetworkInterface, v4 bool) string {
	for _, iface := range ifaces {
		for _, c := range iface.IPs {
			if gw := net.ParseIP(c.Gateway); gw != nil && (gw.To4() != nil) == v4 {
				return gw.String()
			}
		}
	}
	return ""
}

// leasesFor is the DHCP answer for each NIC with an IPv4 address: its first
// IPv4 address, its CNI gateway as server, and the gateway and routes that
// ports.NetworkAttachment.AddressRoles gives its IPv4 addresses (the rule
// cloud-init's network-config follows too: one default route, other routes
// with the subnet that reaches them). The first lease carries DNS.
func leasesFor(att ports.NetworkAttachment, links []plumbing, hostname string) []lease {
	roles, err := att.AddressRoles()
	if err != nil {
		return nil // attachment() built att from a parsed CNI result
	}
	hasV4Routes := slices.ContainsFunc(att.Routes, func(r ports.Route) bool {
		_, dst, err := net.ParseCIDR(r.Destination)
		return err == nil && dst.IP.To4() != nil
	})
	var out []lease
	for k, iface := range att.Interfaces {
		mac, err := net.ParseMAC(iface.MAC)
		if err != nil {
			continue
		}
		var l *lease
		for j, c := range iface.IPs {
			ip, ipnet, err := net.ParseCIDR(c.Address)
			if err != nil || ip.To4() == nil {
				continue
			}
			if l == nil {
				l = &lease{Bridge: links[k].PodBridge, MAC: mac, IP: ip.To4(), Mask: ipnet.Mask, MTU: iface.MTU,
					Hostname: dhcpHostname(hostname), ServerID: ipv4(c.Gateway)}
			}
			role := roles[[2]int{k, j}]
			if gw := ipv4(role.Gateway); gw != nil {
				l.Gateway = gw
			}
			for _, r := range role.Routes {
				_, dst, _ := net.ParseCIDR(r.Destination) // checked by AddressRoles
				l.Routes = append(l.Routes, &dhcpv4.Route{Dest: dst, Router: ipv4(r.Gateway)})
			}
		}
		if l == nil {
			continue
		}
		// Clients that take classless routes ignore the router option: the
		// default route must be among them.
		hasDefault := slices.ContainsFunc(l.Routes, func(r *dhcpv4.Route) bool { ones, _ := r.Dest.Mask.Size(); return ones == 0 })
		if l.Gateway != nil && hasV4Routes && !hasDefault {
			l.Routes = append([]*dhcpv4.Route{{Dest: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Router: l.Gateway}}, l.Routes...)
		}
		// A gateway outside the address's subnet (Calico's 169.254.1.1 for a
		// /32) is reached on its link: a host route to it through router
		// 0.0.0.0, which clients install as a route on the interface, comes
		// before the routes through it.
		if l.Gateway != nil && len(l.Routes) > 0 && !(&net.IPNet{IP: l.IP, Mask: l.Mask}).Contains(l.Gateway) {
			l.Routes = append([]*dhcpv4.Route{{Dest: &net.IPNet{IP: l.Gateway, Mask: net.CIDRMask(32, 32)}, Router: net.IPv4zero.To4()}}, l.Routes...)
		}
		out = append(out, *l)
	}
	if len(out) > 0 && att.DNS != nil {
		for _, s := range att.DNS.Servers {
			if ip := ipv4(s); ip != nil {
				out[0].DNS = append(out[0].DNS, ip)
			}
		}
		out[0].Search = dhcpSearch(att.DNS.Searches)
	}
	return out
}

var hostnameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// dhcpHostname is the pod's name as the host name option, when it is one
// (Kubernetes names are): a CRI client may send any name, and a guest's
// DHCP client hands the option to scripts.
func dhcpHostname(name string) string {
	if len(name) > 253 || !hostnameRE.MatchString(name) {
		return ""
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) > 63 {
			return ""
		}
	}
	return name
}

// dhcpSearch is the search list as the domain search option (RFC 3397)
// can carry it: names without their trailing dot (the option ends every
// name with the root label; "example.com." would gain an empty name), and
// without the root itself ("." is allowed in a pod's dnsConfig) or names
// that are not a sequence of 1-63 byte labels of at most 253 bytes, which
// the option cannot encode.
func dhcpSearch(searches []string) []string {
	var out []string
	for _, s := range searches {
		s = strings.TrimSuffix(s, ".")
		valid := s != "" && len(s) <= 253
		for _, label := range strings.Split(s, ".") {
			valid = valid && len(label) >= 1 && len(label) <= 63
		}
		if valid && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// ipv4 parses an IPv4 address; anything else is nil.
func ipv4(s string) net.IP {
	if ip := net.ParseIP(s); ip != nil {
		return ip.To4()
	}
	return nil
}

// Teardown stops the DHCP server, removes the host links, runs CNI DEL and
// deletes the namespace. Every step tolerates what is already gone.
func (n *Network) Teardown(ctx context.Context, req ports.NetworkRequest) error {
	if err := validSandboxID(req.SandboxID); err != nil {
		return err
	}
	defer n.lockPod(req.SandboxID)()
	r, err := n.load(req.SandboxID)
	if errors.Is(err, os.ErrNotExist) {
		// Nothing recorded: Setup never started, or a teardown finished.
		// Remove what the names point to anyway.
		r = &record{SandboxID: req.SandboxID, NetNS: filepath.Join(NetNSDir, n.nsName(req.SandboxID))}
	} else if err != nil {
		return err
	}
	return n.teardown(ctx, r, false)
}

// teardown removes a pod's network. forgiveDEL is set when CNI ADD never
// succeeded: a CNI DEL failure is then logged, not kept (a config that ADD
// refused is refused by DEL too, and nothing was allocated), as containerd
// does. Otherwise a DEL failure is returned and the record stays, not
// ready, so that StopPodSandbox (or the plugin's next start) retries it.
func (n *Network) teardown(ctx context.Context, r *record, forgiveDEL bool) error {
	if r.Ready {
		// From here on the pod is no longer set up, whatever happens.
		r.Ready = false
		if err := n.save(r); err != nil {
			return fmt.Errorf("record pod network: %w", err)
		}
	}
	n.mu.Lock()
	for _, srv := range n.servers[r.SandboxID] {
		srv.Close()
	}
	delete(n.servers, r.SandboxID)
	n.mu.Unlock()
	var errs []error
	links := r.Links
	if len(links) == 0 {
		// Not recorded (an interrupted setup, or no record at all): every
		// name this pod's links could have.
		for i := 0; i < maxInterfaces; i++ {
			links = append(links, plumbingFor(r.SandboxID, i, ""))
		}
	}
	for _, p := range links {
		if err := unwireHost(p); err != nil {
			errs = append(errs, err)
		}
	}
	if len(r.ConfList) > 0 {
		list, err := libcni.ConfListFromBytes(r.ConfList)
		if err != nil {
			errs = append(errs, fmt.Errorf("recorded CNI config: %w", err))
		} else {
			rt := runtimeConf(r)
			if _, err := os.Stat(r.NetNS); err != nil {
				rt.NetNS = "" // CNI DEL without a namespace still releases IPs
			}
			err := n.cni.DelNetworkList(ctx, list, rt)
			if err != nil && strings.Contains(err.Error(), "failed to find plugin") {
				// A plugin that is not installed allocated nothing; retrying
				// would keep the pod forever.
				n.Log.WithError(err).WithField("sandbox", r.SandboxID).Warn("CNI DEL skipped: plugin not installed")
				err = nil
			}
			if err != nil && forgiveDEL {
				n.Log.WithError(err).WithField("sandbox", r.SandboxID).Warn("CNI DEL after a failed CNI ADD")
				err = nil
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("CNI DEL: %w", err))
			}
		}
	}
	// The recorded name: a record made under another NetNSPrefix names
	// its own.
	if err := deleteNetNS(n.nsOf(r)); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		if !r.TeardownFailed {
			r.TeardownFailed = true
			if serr := n.save(r); serr != nil {
				err = errors.Join(err, fmt.Errorf("record the failed teardown: %w", serr))
			}
		}
		return fmt.Errorf("tear down network of pod %s/%s: %w", r.Namespace, r.PodName, err)
	}
	if err := os.Remove(n.recordPath(r.SandboxID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// restore restarts the DHCP servers of ready pods and undoes interrupted
// setups.
func (n *Network) restore(ctx context.Context) error {
	entries, err := os.ReadDir(n.records)
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		r, err := n.load(id)
		if err != nil {
			n.quarantine(n.recordPath(id), err)
			continue
		}
		log := n.Log.WithFields(logrus.Fields{"sandbox": id, "pod": r.Namespace + "/" + r.PodName})
		if !r.Ready {
			log.Warn("tearing down a network setup that was interrupted")
			if err := n.teardown(ctx, r, !r.Added); err != nil {
				log.WithError(err).Warn("tear down interrupted network setup")
			}
			continue
		}
		if len(r.Leases) > 0 {
			if err := n.serve(r); err != nil {
				log.WithError(err).Warn("restart DHCP server")
				continue
			}
			log.Info("DHCP server back for lease renewals")
		}
	}
	return nil
}

// quarantine sets aside a record that cannot be read back, so that it is
// not read again at every start and a new setup of the pod starts afresh.
// The log names the file and the error, never the content.
func (n *Network) quarantine(p string, why error) {
	log := n.Log.WithError(why).WithField("path", p)
	aside, err := atomicfile.Quarantine(p, time.Now())
	if err != nil {
		log.WithField("quarantineError", err.Error()).Error("unreadable pod network record; could not set it aside, ignoring it")
		return
	}
	log.WithField("quarantinedAs", aside).Error("unreadable pod network record set aside; what it described is not torn down")
}

var (
	_ ports.Network    = (*Network)(nil)
	_ ports.Configurer = (*Network)(nil)
)

// Close stops the DHCP servers (the pods' networks stay).
func (n *Network) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stop != nil {
		close(n.stop)
		n.stop = nil
	}
	for id, srvs := range n.servers {
		for _, srv := range srvs {
			srv.Close()
		}
		delete(n.servers, id)
	}
}
