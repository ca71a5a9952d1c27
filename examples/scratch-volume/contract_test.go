package main

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/plugins/volume"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/volumetest"
)

func env(t *testing.T, v ports.Volumes) volumetest.Env {
	return volumetest.Env{
		Volumes: v, NamesFiles: true,
		Request: func(t *testing.T, vmID, name string) ports.VolumeRequest {
			return ports.VolumeRequest{VMID: vmID, Name: name, Type: "scratch", Options: map[string]string{"size": "4096"}}
		},
		Exists: func(t *testing.T, att ports.VolumeAttachment) bool {
			_, err := os.Stat(att.Disks[0].Source.Path)
			return !errors.Is(err, os.ErrNotExist)
		},
		Invalid: ports.VolumeRequest{VMID: "vm", Name: "../../etc", Type: "scratch"},
	}
}

func configured(t *testing.T) *scratch {
	s := &scratch{}
	if err := s.Configure(context.Background(), ports.PluginConfig{StateDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestContractInProcess(t *testing.T) { volumetest.Run(t, env(t, configured(t))) }

func TestContractOverGRPC(t *testing.T) {
	volumetest.Run(t, env(t, volume.NewClient(sdktest.Conn(t, configured(t)))))
}
