package qcow2

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/plugins/volume"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/volumetest"
)

func configured(t *testing.T) *Volumes {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img is not installed (make deps)")
	}
	l := logrus.New()
	l.SetOutput(io.Discard)
	v := New(l)
	if err := v.Configure(context.Background(), ports.PluginConfig{StateDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	return v
}

func env(v ports.Volumes) volumetest.Env {
	return volumetest.Env{
		Volumes: v, NamesFiles: true,
		Request: func(t *testing.T, vmID, name string) ports.VolumeRequest {
			return ports.VolumeRequest{VMID: vmID, Name: name, Type: "qcow2", Options: map[string]string{"capacity": "64MiB"}}
		},
		Exists: func(t *testing.T, att ports.VolumeAttachment) bool {
			_, err := os.Stat(att.Disks[0].Source.Path)
			return !errors.Is(err, os.ErrNotExist)
		},
		Invalid: ports.VolumeRequest{VMID: "vm", Name: "data", Type: "qcow2", Options: map[string]string{"capacity": "lots"}},
	}
}

func TestContractInProcess(t *testing.T) { volumetest.Run(t, env(configured(t))) }

func TestContractOverGRPC(t *testing.T) {
	volumetest.Run(t, env(volume.NewClient(sdktest.Conn(t, configured(t)))))
}

// A disk has the capacity asked for (Virtlet's 1024MB by default), and the
// guest is asked to make the file system kubelet's fsType names, with the
// uuid option as its UUID.
func TestDiskSizeAndFormat(t *testing.T) {
	v := configured(t)
	ctx := context.Background()
	for _, tc := range []struct {
		opts     map[string]string
		size     int64
		fs, uuid string
	}{
		{map[string]string{}, 1024e6, "ext4", ""},
		{map[string]string{"capacity": "2048MiB", "uuid": "7A4D2C1E-9C2B-4E54-9A57-33C1A8B2D0F1", "kubernetes.io/fsType": "xfs"},
			2048 << 20, "xfs", "7a4d2c1e-9c2b-4e54-9a57-33c1a8b2d0f1"},
	} {
		req := ports.VolumeRequest{VMID: "0123456789abcdef", Name: "extra", Type: "qcow2", Options: tc.opts}
		att, err := v.Prepare(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("qemu-img", "info", "--output=json", att.Disks[0].Source.Path).Output()
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			VirtualSize int64  `json:"virtual-size"`
			Format      string `json:"format"`
		}
		json.Unmarshal(out, &info)
		if st, err := os.Stat(att.Disks[0].Source.Path); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("the disk's mode: %v %v, want 0600 (it holds the guest's data)", st.Mode(), err)
		}
		if info.VirtualSize != tc.size || info.Format != "qcow2" || att.Format != tc.fs || att.FormatUUID != tc.uuid {
			t.Errorf("options %v: %+v, format %q uuid %q", tc.opts, info, att.Format, att.FormatUUID)
		}
		if err := v.Release(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadOptionsNameTheOption(t *testing.T) {
	v := configured(t)
	for opt, opts := range map[string]map[string]string{
		"capacity": {"capacity": "-5GB"},
		"uuid":     {"uuid": "not-a-uuid"},
		"size":     {"size": "1G"},
		"fsType":   {"kubernetes.io/fsType": "ntfs"},
	} {
		_, err := v.Validate(context.Background(), ports.VolumeRequest{Name: "extra", Type: "qcow2", Options: opts})
		if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), opt) {
			t.Errorf("%v: %v", opts, err)
		}
	}
}
