// Package base is what every plugin kind shares: the go-plugin handshake and
// protocol versions, the GRPCPlugin that carries a kind's gRPC service, the
// base PluginInfo/Configure service, and the mapping of errors across the
// process boundary.
package base

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/virtlet/virtlet/ports"
)

// Handshake is shared by the daemon and every plugin. A binary that is not
// a Virtlet plugin, run by mistake, exits with go-plugin's message.
var Handshake = plugin.HandshakeConfig{
	MagicCookieKey:   "VIRTLET_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "c1a3e6a2-9b57-4f55-bf0a-1d0a8c6f7e21",
}

// APIVersions is the protocol version of each kind. A kind's version
// changes when its service changes incompatibly; go-plugin then refuses to
// pair a daemon and a plugin that speak different versions.
var APIVersions = map[ports.PluginKind]int{
	ports.KindHypervisor: 1,
	ports.KindImage:      1,
	ports.KindVolume:     1,
	ports.KindDatasource: 1,
	ports.KindNetwork:    1,
}

// GRPCPlugin carries one kind's service. On the plugin side Register adds
// the base and kind services to the server; on the daemon side the
// dispensed value is the *grpc.ClientConn, wrapped by the kind's client.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Kind     ports.PluginKind
	Register func(*grpc.Server)
}

func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Register == nil {
		return fmt.Errorf("plugin of kind %s serves nothing", p.Kind)
	}
	p.Register(s)
	return nil
}

func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return c, nil
}

// PluginSet returns the versioned plugin set of one kind.
func PluginSet(kind ports.PluginKind, register func(*grpc.Server)) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		APIVersions[kind]: {string(kind): &GRPCPlugin{Kind: kind, Register: register}},
	}
}

// Conn is a client's view of a plugin: the live connection, or an error
// naming the plugin when it cannot serve.
type Conn interface {
	// GRPC returns the live connection, or a *ports.UnavailableError at
	// once (without waiting) while the plugin is down.
	GRPC() (*grpc.ClientConn, error)
	// Error turns an RPC error into a port error that names the plugin.
	Error(err error) error
}

// StaticConn is a Conn over a fixed connection (tests, in-process use).
type StaticConn struct {
	Conn   *grpc.ClientConn
	Plugin string
	Kind   ports.PluginKind
}

func (c StaticConn) GRPC() (*grpc.ClientConn, error) { return c.Conn, nil }
func (c StaticConn) Error(err error) error           { return FromRPC(err, c.Plugin, c.Kind) }

// Default timeouts of plugin calls whose context has no deadline. Every
// call has a deadline.
const (
	QuickCallTimeout = 30 * time.Second // status, lists, info
	SlowCallTimeout  = 10 * time.Minute // define, stop, volume preparation
	FetchTimeout     = 2 * time.Hour    // image downloads
)

// WithTimeout gives ctx a deadline if it has none.
func WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
