// Command virtlet-test-cni-multi is a test-only CNI meta plugin in the
// manner of Multus: it delegates to several network configs, one pod
// interface each (eth0, net1, net2, ...), so tests can give a pod several
// interfaces with Debian's ordinary plugins.
//
// Its result is Multus's by default: the first (master) delegate's result
// alone, as multus-cni's CmdAdd (pkg/multus/multus.go) returns it; the
// other interfaces exist only in the pod's network namespace. With
// "mergeResults": true it returns one result listing every delegate's
// interfaces, addresses and routes instead, as CNI-Genie did.
//
//	{"cniVersion": "1.0.0", "name": "multi", "type": "virtlet-test-cni-multi",
//	 "delegates": [{"type": "bridge", ...}, {"type": "bridge", ...}]}
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

type netConf struct {
	types.NetConf
	Delegates []map[string]interface{} `json:"delegates"`
	// MergeResults returns every delegate's result merged into one, not
	// the master's alone.
	MergeResults bool `json:"mergeResults,omitempty"`
}

func parse(args *skel.CmdArgs) (*netConf, error) {
	var c netConf
	if err := json.Unmarshal(args.StdinData, &c); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	if len(c.Delegates) == 0 {
		return nil, fmt.Errorf("no delegates")
	}
	return &c, nil
}

// delegate returns the i-th delegate's config and interface name.
func delegate(c *netConf, i int) ([]byte, string, error) {
	d := map[string]interface{}{}
	for k, v := range c.Delegates[i] {
		d[k] = v
	}
	d["cniVersion"] = c.CNIVersion
	d["name"] = fmt.Sprintf("%s-%d", c.Name, i)
	b, err := json.Marshal(d)
	ifName := "eth0"
	if i > 0 {
		ifName = fmt.Sprintf("net%d", i)
	}
	return b, ifName, err
}

func cmdAdd(args *skel.CmdArgs) error {
	c, err := parse(args)
	if err != nil {
		return err
	}
	results := make([]*types100.Result, 0, len(c.Delegates))
	for i := range c.Delegates {
		res, err := add(c, i)
		if err != nil {
			return err
		}
		results = append(results, res)
	}
	if !c.MergeResults {
		return types.PrintResult(results[0], c.CNIVersion) // Multus: the master's result
	}
	return types.PrintResult(merge(c.CNIVersion, results), c.CNIVersion)
}

// add runs the i-th delegate's ADD.
func add(c *netConf, i int) (*types100.Result, error) {
	conf, ifName, err := delegate(c, i)
	if err != nil {
		return nil, err
	}
	os.Setenv("CNI_IFNAME", ifName)
	raw, err := invoke.DelegateAdd(context.Background(), c.Delegates[i]["type"].(string), conf, nil)
	if err != nil {
		return nil, fmt.Errorf("delegate %d (%s): %w", i, ifName, err)
	}
	res, err := types100.NewResultFromResult(raw)
	if err != nil {
		return nil, fmt.Errorf("delegate %d (%s) result: %w", i, ifName, err)
	}
	return res, nil
}

// merge lists every result's interfaces, addresses (their interface
// indexes shifted) and routes in one result, with the first's DNS.
func merge(cniVersion string, results []*types100.Result) *types100.Result {
	merged := &types100.Result{CNIVersion: cniVersion, DNS: results[0].DNS}
	for _, res := range results {
		offset := len(merged.Interfaces)
		merged.Interfaces = append(merged.Interfaces, res.Interfaces...)
		for _, ip := range res.IPs {
			if ip.Interface != nil {
				idx := *ip.Interface + offset
				ip.Interface = &idx
			}
			merged.IPs = append(merged.IPs, ip)
		}
		merged.Routes = append(merged.Routes, res.Routes...)
	}
	return merged
}

func cmdDel(args *skel.CmdArgs) error {
	c, err := parse(args)
	if err != nil {
		return err
	}
	var firstErr error
	for i := len(c.Delegates) - 1; i >= 0; i-- {
		conf, ifName, err := delegate(c, i)
		if err != nil {
			return err
		}
		os.Setenv("CNI_IFNAME", ifName)
		if err := invoke.DelegateDel(context.Background(), c.Delegates[i]["type"].(string), conf, nil); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("delegate %d (%s): %w", i, ifName, err)
		}
	}
	return firstErr
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: func(*skel.CmdArgs) error { return nil }},
		version.All, "virtlet-test-cni-multi: a test meta plugin giving a pod several interfaces")
}
