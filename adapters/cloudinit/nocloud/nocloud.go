// Package nocloud is cloud-init's NoCloud datasource: an ISO labelled
// cidata holding meta-data, user-data and network-config (seed 004).
package nocloud

import (
	"github.com/virtlet/virtlet/adapters/cloudinit/iso"
	"github.com/virtlet/virtlet/ports"
)

// New returns the NoCloud datasource adapter.
func New() *iso.Media {
	return &iso.Media{Name: "nocloud", Label: "cidata", Layout: func(req ports.MediaRequest) map[string][]byte {
		files := map[string][]byte{"meta-data": req.MetaData}
		if len(req.UserData) > 0 {
			files["user-data"] = req.UserData
		}
		if len(req.NetworkConfig) > 0 {
			files["network-config"] = req.NetworkConfig
		}
		return files
	}}
}
