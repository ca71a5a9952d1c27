package base

import (
	"context"
	"fmt"

	"github.com/virtlet/virtlet/plugins/buildinfo"
	"github.com/virtlet/virtlet/ports"
	basev1 "github.com/virtlet/virtlet/proto/base/v1"
)

// Server serves the base service for an adapter.
type Server struct {
	basev1.UnimplementedPluginServer
	Adapter ports.Describer
	Kind    ports.PluginKind
}

func (s *Server) PluginInfo(ctx context.Context, _ *basev1.PluginInfoRequest) (*basev1.PluginInfoResponse, error) {
	info := Describe(s.Adapter)
	schema, err := ConfigSchema(s.Adapter)
	if err != nil {
		return nil, ToRPC(fmt.Errorf("config schema of plugin %s: %w", info.Name, err))
	}
	return &basev1.PluginInfoResponse{
		Name: info.Name, Kind: string(s.Kind), Version: info.Version,
		ApiVersion: int32(APIVersions[s.Kind]), Handles: info.Handles, ConfigSchemaJson: schema,
		RootfsTypes: info.RootfsTypes,
	}, nil
}

func (s *Server) Configure(ctx context.Context, req *basev1.ConfigureRequest) (*basev1.ConfigureResponse, error) {
	cfg := ports.PluginConfig{Config: req.ConfigJson, StateDir: req.StateDir}
	if c, ok := s.Adapter.(ports.Configurer); ok {
		return &basev1.ConfigureResponse{}, ToRPC(c.Configure(ctx, cfg))
	}
	if len(req.ConfigJson) > 0 && string(req.ConfigJson) != "null" && string(req.ConfigJson) != "{}" {
		return nil, ToRPC(fmt.Errorf("this plugin takes no config: %w", ports.ErrInvalidArgument))
	}
	return &basev1.ConfigureResponse{}, nil
}

// Describe is what a plugin reports of itself: its adapter's PluginInfo,
// with the plugin binary's build as its version unless the adapter names
// one.
func Describe(a ports.Describer) ports.PluginInfo {
	info := a.PluginInfo()
	if info.Version == "" {
		info.Version = buildinfo.Version()
	}
	return info
}

// Info asks a plugin for its PluginInfo.
func Info(ctx context.Context, c Conn) (ports.PluginInfo, error) {
	conn, err := c.GRPC()
	if err != nil {
		return ports.PluginInfo{}, err
	}
	ctx, cancel := WithTimeout(ctx, QuickCallTimeout)
	defer cancel()
	resp, err := basev1.NewPluginClient(conn).PluginInfo(ctx, &basev1.PluginInfoRequest{})
	if err != nil {
		return ports.PluginInfo{}, c.Error(err)
	}
	return ports.PluginInfo{
		Name: resp.Name, Kind: ports.PluginKind(resp.Kind), Version: resp.Version,
		APIVersion: int(resp.ApiVersion), Handles: resp.Handles, ConfigSchema: resp.ConfigSchemaJson,
		RootfsTypes: resp.RootfsTypes,
	}, nil
}

// Configure hands a plugin its configuration.
func Configure(ctx context.Context, c Conn, cfg ports.PluginConfig) error {
	conn, err := c.GRPC()
	if err != nil {
		return err
	}
	ctx, cancel := WithTimeout(ctx, QuickCallTimeout)
	defer cancel()
	_, err = basev1.NewPluginClient(conn).Configure(ctx, &basev1.ConfigureRequest{ConfigJson: cfg.Config, StateDir: cfg.StateDir})
	return c.Error(err)
}
