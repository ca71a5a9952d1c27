// Package sdk is how a plugin is written. A plugin's main is one call:
//
//	func main() { sdk.Serve(myadapter.New()) }
//
// where the adapter implements one port (ports.Volumes, ports.Datasource,
// ports.ImageSource, ports.Hypervisor or ports.Network) and
// ports.Describer, and optionally ports.Configurer to receive its manifest
// config. Log with sdk.Log: its lines reach the daemon's log with the
// plugin's name. Never write to stdout: go-plugin owns it.
package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"

	"github.com/virtlet/virtlet/plugins/base"
	"github.com/virtlet/virtlet/plugins/datasource"
	"github.com/virtlet/virtlet/plugins/hypervisor"
	"github.com/virtlet/virtlet/plugins/image"
	"github.com/virtlet/virtlet/plugins/network"
	"github.com/virtlet/virtlet/plugins/volume"
	"github.com/virtlet/virtlet/ports"
)

// Log is the plugin's logger; its output goes to the daemon's log.
var Log = newLogger()

func newLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(os.Stderr)
	l.SetFormatter(hclogFormatter{})
	l.SetLevel(logrus.DebugLevel)
	return l
}

// Shutdowner is an adapter with something to undo when its plugin stops
// (the daemon stops it, or the plugin gets SIGTERM): Shutdown is called
// then, with shutdownGrace to do it (the daemon kills a plugin that
// takes longer). A plugin killed outright must recover at its next start.
type Shutdowner interface {
	Shutdown(ctx context.Context)
}

// shutdownGrace is what a Shutdowner gets: within the 2 s go-plugin's
// client waits for a plugin to exit before killing it.
const shutdownGrace = 1500 * time.Millisecond

// Serve serves adapter as a plugin of the kind its PluginInfo names, and
// returns when the daemon stops it. It exits with a message on stderr if
// the adapter does not implement that kind's port.
//
// Run by hand with --version, it prints its name and version and exits.
func Serve(adapter ports.Describer) {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		info := base.Describe(adapter)
		fmt.Printf("%s %s\n", info.Name, info.Version)
		return
	}
	kind, register, err := Registration(adapter)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if s, ok := adapter.(Shutdowner); ok {
		var once sync.Once
		shutdown := func() {
			once.Do(func() {
				ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
				defer cancel()
				s.Shutdown(ctx)
			})
		}
		defer shutdown()
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		go func() {
			<-term
			shutdown()
			os.Exit(0)
		}()
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  base.Handshake,
		VersionedPlugins: base.PluginSet(kind, register),
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger: hclog.New(&hclog.LoggerOptions{
			Name: adapter.PluginInfo().Name, Output: os.Stderr, JSONFormat: true, Level: hclog.Info,
		}),
	})
}

// Registration finds the kind of adapter and the function registering its
// services on a gRPC server.
func Registration(adapter ports.Describer) (ports.PluginKind, func(*grpc.Server), error) {
	info := adapter.PluginInfo()
	var register func(*grpc.Server)
	switch info.Kind {
	case ports.KindHypervisor:
		if a, ok := adapter.(hypervisor.Adapter); ok {
			register = hypervisor.Register(a)
		}
	case ports.KindImage:
		if a, ok := adapter.(image.Adapter); ok {
			register = image.Register(a)
		}
	case ports.KindVolume:
		if a, ok := adapter.(volume.Adapter); ok {
			register = volume.Register(a)
		}
	case ports.KindDatasource:
		if a, ok := adapter.(datasource.Adapter); ok {
			register = datasource.Register(a)
		}
	case ports.KindNetwork:
		if a, ok := adapter.(network.Adapter); ok {
			register = network.Register(a)
		}
	default:
		return "", nil, fmt.Errorf("plugin %q: unknown kind %q (want one of %s)", info.Name, info.Kind, kindList())
	}
	if register == nil {
		return "", nil, fmt.Errorf("plugin %q says it is a %s plugin but %T does not implement the %s port", info.Name, info.Kind, adapter, info.Kind)
	}
	if info.Name == "" {
		return "", nil, fmt.Errorf("plugin of kind %s has no name", info.Kind)
	}
	return info.Kind, register, nil
}

func kindList() string {
	var ks []string
	for _, k := range ports.PluginKinds {
		ks = append(ks, string(k))
	}
	return strings.Join(ks, ", ")
}

// hclogFormatter writes logrus entries as the JSON lines go-plugin parses
// from a plugin's stderr (hclog's format), so that levels, messages and
// fields arrive intact in the daemon's log.
type hclogFormatter struct{}

func (hclogFormatter) Format(e *logrus.Entry) ([]byte, error) {
	m := make(map[string]interface{}, len(e.Data)+3)
	for k, v := range e.Data {
		if err, ok := v.(error); ok {
			v = err.Error()
		}
		m[k] = v
	}
	m["@message"] = e.Message
	m["@timestamp"] = e.Time.Format("2006-01-02T15:04:05.000000Z07:00")
	level := e.Level.String()
	switch e.Level {
	case logrus.WarnLevel:
		level = "warn"
	case logrus.FatalLevel, logrus.PanicLevel:
		level = "error"
	}
	m["@level"] = level
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(m); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
