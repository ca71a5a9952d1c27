package admin_test

import (
	"context"
	"io"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/admin"
	"github.com/virtlet/virtlet/ports"
)

type noRuntime struct{}

func (noRuntime) ValidateVolume(context.Context, ports.FlexvolumeOptions) (map[string]string, error) {
	return nil, nil
}
func (noRuntime) ForgetVolume(context.Context, ports.FlexvolumeOptions) error { return nil }

// Status reports the plugins as the supervisors see them, and the
// daemon's goroutines, on the root-only socket.
func TestStatusReportsPluginsAndGoroutines(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	socket := filepath.Join(t.TempDir(), "admin.sock")
	l, err := admin.Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	plugins := []admin.PluginState{{Name: "libvirt", Kind: "hypervisor", State: "running", PID: 42, Restarts: 1},
		{Name: "cni", Kind: "network", State: "restarting", Restarts: 2, LastError: "the plugin process exited"}}
	g := admin.NewServer(noRuntime{}, "v1", log).WithPlugins(func() []admin.PluginState { return plugins }).GRPCServer()
	go g.Serve(l)
	defer g.Stop()
	c, err := admin.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Goroutines < 2 || len(st.Plugins) != 2 || st.Plugins[0] != plugins[0] || st.Plugins[1] != plugins[1] {
		t.Fatalf("status %+v", st)
	}
}
