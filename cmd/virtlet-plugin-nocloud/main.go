// Command virtlet-plugin-nocloud is the NoCloud cloud-init datasource
// plugin shipped with Virtlet.
package main

import (
	"github.com/virtlet/virtlet/adapters/cloudinit/nocloud"
	"github.com/virtlet/virtlet/plugins/sdk"
)

func main() { sdk.Serve(nocloud.New()) }
