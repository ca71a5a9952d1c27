package nocloud_test

import (
	"context"
	"os"
	"testing"

	"github.com/virtlet/virtlet/adapters/cloudinit/nocloud"
	"github.com/virtlet/virtlet/plugins/datasource"
	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/datasourcetest"
)

var files = map[string]string{"meta-data": "meta", "user-data": "user", "network-config": "network"}

func configured(t *testing.T) datasource.Adapter {
	t.Setenv("TMPDIR", os.TempDir()) // Configure moves it into the state directory
	m := nocloud.New()
	if err := m.Configure(context.Background(), ports.PluginConfig{StateDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestContract(t *testing.T) {
	datasourcetest.Run(t, datasourcetest.Env{Datasource: configured(t), Name: "nocloud", Label: "cidata", Files: files})
}

func TestContractOverPlugin(t *testing.T) {
	c := datasource.NewClient(sdktest.Conn(t, configured(t)))
	datasourcetest.Run(t, datasourcetest.Env{Datasource: c, Name: "nocloud", Label: "cidata", Files: files})
}
