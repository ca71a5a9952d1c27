// Package configdrive is cloud-init's ConfigDrive (OpenStack) datasource:
// an ISO labelled config-2 holding openstack/latest/meta_data.json,
// user_data and network_data.json (seed 004).
package configdrive

import (
	"github.com/virtlet/virtlet/adapters/cloudinit/iso"
	"github.com/virtlet/virtlet/ports"
)

// New returns the ConfigDrive datasource adapter.
func New() *iso.Media {
	return &iso.Media{Name: "configdrive", Label: "config-2", Layout: func(req ports.MediaRequest) map[string][]byte {
		files := map[string][]byte{"openstack/latest/meta_data.json": req.MetaData}
		if len(req.UserData) > 0 {
			files["openstack/latest/user_data"] = req.UserData
		}
		if len(req.NetworkConfig) > 0 {
			files["openstack/latest/network_data.json"] = req.NetworkConfig
		}
		return files
	}}
}
