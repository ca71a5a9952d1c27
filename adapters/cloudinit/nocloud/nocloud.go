// Package nocloud is cloud-init's NoCloud datasource: an ISO labelled
// cidata holding meta-data, user-data and network-config (docs/cloud-init.md), in
// cloud-init's own forms, as the core makes them.
package nocloud

import (
	"github.com/virtlet/virtlet/adapters/cloudinit/iso"
	"github.com/virtlet/virtlet/ports"
)

// EmptyUserData is the user-data of a pod that has none.
const EmptyUserData = "#cloud-config\n"

// New returns the NoCloud datasource adapter.
func New() *iso.Media {
	return &iso.Media{Name: "nocloud", Label: "cidata", Layout: Layout}
}

// Layout lays a VM's cloud-init data out as NoCloud's seed files.
func Layout(req ports.MediaRequest) (map[string][]byte, error) {
	// cloud-init refuses a NoCloud seed without user-data ("not a
	// valid seed"): a pod with nothing to say gets an empty
	// #cloud-config.
	ud := req.UserData
	if len(ud) == 0 {
		ud = []byte(EmptyUserData)
	}
	files := map[string][]byte{"meta-data": req.MetaData, "user-data": ud}
	if len(req.NetworkConfig) > 0 {
		files["network-config"] = req.NetworkConfig
	}
	return files, nil
}
