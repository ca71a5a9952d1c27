// Package sdktest helps test plugins: it serves an adapter in-process over
// real gRPC, so a contract suite exercises the same shims a plugin process
// uses.
package sdktest

import (
	"testing"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/plugins/sdk"
	"github.com/virtlet/virtlet/ports"
)

// Conn serves adapter through go-plugin's in-process gRPC transport and
// returns the daemon-side connection.
func Conn(t testing.TB, adapter ports.Describer) base.Conn {
	t.Helper()
	kind, register, err := sdk.Registration(adapter)
	if err != nil {
		t.Fatal(err)
	}
	set := base.PluginSet(kind, register)[base.APIVersions[kind]]
	client, _ := plugin.TestPluginGRPCConn(t, false, set)
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(string(kind))
	if err != nil {
		t.Fatal(err)
	}
	return base.StaticConn{Conn: raw.(*grpc.ClientConn), Plugin: adapter.PluginInfo().Name, Kind: kind}
}
