package iso_test

import (
	"context"
	"os"
	"testing"

	"github.com/virtlet/virtlet/adapters/cloudinit/configdrive"
	"github.com/virtlet/virtlet/adapters/cloudinit/iso"
	"github.com/virtlet/virtlet/adapters/cloudinit/nocloud"
	"github.com/virtlet/virtlet/plugins/datasource"
	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/datasourcetest"
)

// Both datasources meet the contract in process and through the plugin
// shims, with seed 004's file layout.
func TestDatasourceContract(t *testing.T) {
	for _, tc := range []struct {
		new   func() *iso.Media
		name  string
		label string
		files map[string]string
		empty []byte // user-data of a pod without any
	}{
		// cloud-init needs NoCloud's user-data file, even when empty.
		{nocloud.New, "nocloud", "cidata", map[string]string{"meta-data": "meta", "user-data": "user", "network-config": "network"},
			[]byte(nocloud.EmptyUserData)},
		{configdrive.New, "configdrive", "config-2", map[string]string{"openstack/latest/meta_data.json": "meta",
			"openstack/latest/user_data": "user", "openstack/latest/network_data.json": "network"}, nil},
	} {
		configured := func(t *testing.T) datasource.Adapter {
			t.Setenv("TMPDIR", os.TempDir()) // Configure moves it into the state directory
			m := tc.new()
			if err := m.Configure(context.Background(), ports.PluginConfig{StateDir: t.TempDir()}); err != nil {
				t.Fatal(err)
			}
			return m
		}
		t.Run(tc.name, func(t *testing.T) {
			datasourcetest.Run(t, datasourcetest.Env{Datasource: configured(t), Name: tc.name, Label: tc.label, Files: tc.files, EmptyUserData: tc.empty})
		})
		t.Run(tc.name+" over the plugin", func(t *testing.T) {
			c := datasource.NewClient(sdktest.Conn(t, configured(t)))
			datasourcetest.Run(t, datasourcetest.Env{Datasource: c, Name: tc.name, Label: tc.label, Files: tc.files, EmptyUserData: tc.empty})
		})
	}
}
