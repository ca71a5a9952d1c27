package base

import (
	"context"
	"testing"

	"github.com/virtlet/virtlet/plugins/buildinfo"
	"github.com/virtlet/virtlet/ports"
	basev1 "github.com/virtlet/virtlet/proto/base/v1"
)

type describer ports.PluginInfo

func (d describer) PluginInfo() ports.PluginInfo { return ports.PluginInfo(d) }

// A plugin reports its adapter's version, or else its binary's build.
func TestPluginInfoVersion(t *testing.T) {
	for _, tc := range []struct{ adapter, want string }{
		{"", buildinfo.Version()},
		{"1.0.0", "1.0.0"},
	} {
		s := &Server{Adapter: describer{Name: "x", Version: tc.adapter}, Kind: ports.KindVolume}
		resp, err := s.PluginInfo(context.Background(), &basev1.PluginInfoRequest{})
		if err != nil || resp.Version != tc.want || resp.Version == "" {
			t.Errorf("adapter version %q: reported %q (%v), want %q", tc.adapter, resp.GetVersion(), err, tc.want)
		}
	}
}
