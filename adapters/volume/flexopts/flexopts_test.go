package flexopts

import (
	"errors"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

func TestCapacity(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"1024MB", 1024e6}, {"2048MiB", 2048 << 20}, {"1Gi", 1 << 30}, {"512", 512}, {" 3 G ", 3 << 30},
		{"10KB", 10000}, {"10K", 10240}, {"1bytes", 1},
	} {
		got, err := Capacity(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Capacity(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "0", "-1MB", "1.5G", "1Gb", "MB", "9999999999999999999", "10000000000EiB"} {
		if _, err := Capacity(bad); err == nil {
			t.Errorf("Capacity(%q) accepted", bad)
		}
	}
}

func TestSchemaNamesTheOption(t *testing.T) {
	s := Schema{Type: "ceph", Required: []string{"monitor", "pool"}, Optional: []string{"user"}}
	for _, tc := range []struct {
		opts map[string]string
		want string
	}{
		{map[string]string{"pool": "p"}, "ceph volume data option monitor: missing"},
		{map[string]string{"monitor": "m", "pool": "p", "colour": "red"}, "ceph volume data option colour: unknown option"},
	} {
		err := s.Check("data", tc.opts)
		if !errors.Is(err, ports.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "monitor (required)") {
			t.Errorf("Check(%v) = %v, want %q", tc.opts, err, tc.want)
		}
	}
	ok := map[string]string{"type": "ceph", "monitor": "m", "pool": "p", "kubernetes.io/pod.name": "x"}
	if err := s.Check("data", ok); err != nil {
		t.Errorf("Check(%v) = %v", ok, err)
	}
	ok[FSTypeKey] = "xfs"
	if own := s.Own(ok); len(own) != 3 || own["monitor"] != "m" || own[FSTypeKey] != "xfs" {
		t.Errorf("Own = %v", own)
	}
	if _, err := s.FSType("data", map[string]string{FSTypeKey: "ntfs"}, "ext4"); err == nil {
		t.Error("fsType ntfs accepted")
	}
}
