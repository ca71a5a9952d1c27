// Command virtlet-fake-plugin serves a test double as a real plugin
// process: `virtlet-fake-plugin hypervisor` the in-memory hypervisor (its
// VMs persisted in the plugin's state directory), `virtlet-fake-plugin
// image` an image source that serves deterministic bytes for https URLs.
//
// `virtlet-fake-plugin hypervisor-panicking` is the hypervisor with a bug:
// its Start panics. `virtlet-fake-plugin hypervisor-previous-api` speaks
// the version of the hypervisor plugin API before this one.
//
// It exists to drive the daemon end to end in tests; it runs no VM and is
// never shipped.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/hashicorp/go-plugin"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/plugins/sdk"
	"github.com/virtlet/virtlet/ports"
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
	case "hypervisor-panicking":
		// A plugin with a bug: Define prints on stderr, Start on the
		// descriptor (as C libraries do) and panics, killing the process.
		h := fakehypervisor.New()
		h.Log = sdk.Log
		sdk.Serve(panicking{h})
	case "hypervisor-previous-api":
		// A plugin built against the previous version of the hypervisor
		// plugin API.
		h := fakehypervisor.New()
		kind, register, err := sdk.Registration(h)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		plugin.Serve(&plugin.ServeConfig{
			HandshakeConfig: base.Handshake,
			VersionedPlugins: map[int]plugin.PluginSet{
				base.APIVersions[kind] - 1: {string(kind): &base.GRPCPlugin{Kind: kind, Register: register}},
			},
			GRPCServer: plugin.DefaultGRPCServer,
		})
	case "image":
		sdk.Serve(fakes.NewImageSource())
	default:
		fmt.Fprintf(os.Stderr, "virtlet-fake-plugin: unknown kind %q\n", os.Args[1])
		os.Exit(2)
	}
}

type panicking struct{ *fakehypervisor.Hypervisor }

// Define prints on os.Stderr (which go-plugin carries over gRPC) and
// defines the VM.
func (p panicking) Define(ctx context.Context, spec ports.VMSpec) error {
	fmt.Fprintln(os.Stderr, "fake: about to do something unwise")
	return p.Hypervisor.Define(ctx, spec)
}

// Start prints on descriptor 2, as C code does, and panics.
func (p panicking) Start(ctx context.Context, id string) error {
	// What a C library prints goes to the descriptor, not to os.Stderr.
	fmt.Fprintln(os.NewFile(2, "stderr"), "libfake: warning from C")
	panic("fake plugin bug in Start")
}
