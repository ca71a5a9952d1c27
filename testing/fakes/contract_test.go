package fakes_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/plugins/image"
	"github.com/virtlet/virtlet/plugins/network"
	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/plugins/volume"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/imagesourcetest"
	"github.com/virtlet/virtlet/testing/contract/networktest"
	"github.com/virtlet/virtlet/testing/contract/volumetest"
	"github.com/virtlet/virtlet/testing/fakes"
)

func imageSource() *fakes.ImageSource {
	s := fakes.NewImageSource()
	s.Fail["https://example.com/missing"] = fmt.Errorf("404: %w", ports.ErrNotFound)
	return s
}

func TestImageSourceContract(t *testing.T) {
	e := imagesourcetest.Env{Location: "https://example.com/x.img", Missing: "https://example.com/missing"}
	t.Run("in process", func(t *testing.T) {
		e.Source = imageSource()
		imagesourcetest.Run(t, e)
	})
	t.Run("over gRPC", func(t *testing.T) {
		e.Source = image.NewClient(sdktest.Conn(t, imageSource()))
		imagesourcetest.Run(t, e)
	})
}

// fakeNetwork makes fakes.Network servable as a plugin for the contract.
type fakeNetwork struct{ *fakes.Network }

func (fakeNetwork) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "fake-network", Kind: ports.KindNetwork, Handles: []string{"fake"}}
}

func TestNetworkContract(t *testing.T) {
	t.Run("in process", func(t *testing.T) { networktest.Run(t, fakes.NewNetwork()) })
	t.Run("over gRPC", func(t *testing.T) {
		networktest.Run(t, network.NewClient(sdktest.Conn(t, fakeNetwork{fakes.NewNetwork()})))
	})
}

// fakeVolumes makes fakes.Volumes servable as a plugin for the contract.
type fakeVolumes struct{ *fakes.Volumes }

func (fakeVolumes) PluginInfo() ports.PluginInfo {
	return ports.PluginInfo{Name: "fake-volumes", Kind: ports.KindVolume, Handles: []string{"sized"}}
}

func volumesEnv(v ports.Volumes, fake *fakes.Volumes) volumetest.Env {
	return volumetest.Env{
		Volumes: v,
		Request: func(t *testing.T, vmID, name string) ports.VolumeRequest {
			return ports.VolumeRequest{VMID: vmID, PodUID: "uid", Name: name, Type: "sized", Options: map[string]string{"size": "1"}}
		},
		Exists: func(t *testing.T, att ports.VolumeAttachment) bool {
			for _, p := range fake.Prepared() {
				if "/fake/volumes/"+strings.ReplaceAll(strings.Fields(p)[0], "/", "-")+".qcow2" == att.Disks[0].Source.Path {
					return true
				}
			}
			return false
		},
		Invalid: ports.VolumeRequest{VMID: "vm", Name: "data", Type: "sized"},
	}
}

func TestVolumesContract(t *testing.T) {
	t.Run("in process", func(t *testing.T) {
		f := fakes.NewVolumes()
		volumetest.Run(t, volumesEnv(f, f))
	})
	t.Run("over gRPC", func(t *testing.T) {
		f := fakes.NewVolumes()
		volumetest.Run(t, volumesEnv(volume.NewClient(sdktest.Conn(t, fakeVolumes{f})), f))
	})
}
