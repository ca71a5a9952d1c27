// Command virtlet-fake-plugin serves a test double as a real plugin
// process: `virtlet-fake-plugin hypervisor` the in-memory hypervisor (its
// VMs persisted in the plugin's state directory), `virtlet-fake-plugin
// image` an image source that serves deterministic bytes for https URLs.
//
// It exists to drive the daemon end to end in tests; it runs no VM and is
// never shipped.
package main

import (
	"fmt"
	"os"

	"github.com/virtlet/virtlet/plugins/sdk"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
	"github.com/virtlet/virtlet/testing/fakes"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: virtlet-fake-plugin hypervisor|image")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "hypervisor":
		h := fakehypervisor.New()
		h.Log = sdk.Log
		sdk.Serve(h)
	case "image":
		sdk.Serve(fakes.NewImageSource())
	default:
		fmt.Fprintf(os.Stderr, "virtlet-fake-plugin: unknown kind %q\n", os.Args[1])
		os.Exit(2)
	}
}
