// Command virtlet-plugin-configdrive is the ConfigDrive cloud-init
// datasource plugin shipped with Virtlet.
package main

import (
	"github.com/virtlet/virtlet/adapters/cloudinit/configdrive"
	"github.com/virtlet/virtlet/plugins/sdk"
)

func main() { sdk.Serve(configdrive.New()) }
