// Command virtlet-plugin-libvirt is the hypervisor plugin shipped with
// Virtlet: it runs VM pods as libvirt/QEMU domains.
package main

import (
	"github.com/virtlet/virtlet/adapters/libvirt"
	"github.com/virtlet/virtlet/plugins/sdk"
)

func main() { sdk.Serve(libvirt.New(sdk.Log)) }
