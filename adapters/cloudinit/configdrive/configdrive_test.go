package configdrive

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// The core hands cloud-init's neutral data; the config drive repeats the
// instance-id as uuid and the hostname as hostname, names the keys
// public_keys, and describes the network in OpenStack's format.
func TestLayoutGolden(t *testing.T) {
	network := &ports.NetworkAttachment{
		Interfaces: []ports.NetworkInterface{{Name: "eth0", MAC: "52:54:00:a1:b2:c3", MTU: 1450,
			IPs: []ports.IPConfig{{Address: "198.18.0.5/24", Gateway: "198.18.0.1"}, {Address: "fd00:198:18::5/64", Gateway: "fd00:198:18::1"}}}},
		Routes: []ports.Route{{Destination: "0.0.0.0/0", Gateway: "198.18.0.1"}, {Destination: "198.19.0.0/16", Gateway: "198.18.0.254"}},
		DNS:    &ports.DNSConfig{Servers: []string{"198.18.0.10"}, Searches: []string{"default.svc.cluster.local", "svc.cluster.local"}},
	}
	two := &ports.NetworkAttachment{
		Interfaces: []ports.NetworkInterface{
			{Name: "eth0", MAC: "0a:58:c6:12:10:05", IPs: []ports.IPConfig{{Address: "198.18.16.5/24", Gateway: "198.18.16.1"}}},
			{Name: "net1", MAC: "0a:58:c6:12:11:07", IPs: []ports.IPConfig{{Address: "198.18.17.7/24", Gateway: "198.18.17.1"}}},
		},
		Routes: []ports.Route{{Destination: "0.0.0.0/0", Gateway: "198.18.16.1"}, {Destination: "198.19.128.0/17", Gateway: "198.18.17.1"}},
	}
	for name, req := range map[string]ports.MediaRequest{
		"seed-004": {MetaData: []byte(`{"instance-id": "foobar", "local-hostname": "ubuntu-vm", "public-keys": [
			"ssh-rsa AAAA... source@localhost", "ssh-rsa AAAA... me@localhost", "ssh-rsa AAAA... you@localhost"]}`),
			UserData: []byte("#cloud-config\n")},
		"network":                {MetaData: []byte(`{"instance-id": "p.ns", "local-hostname": "p"}`), Network: network, NetworkConfig: []byte("version: 1\n")},
		"network-two-interfaces": {MetaData: []byte(`{"instance-id": "p.ns", "local-hostname": "p"}`), Network: two, NetworkConfig: []byte("version: 1\n")},
		"overrides": {MetaData: []byte(`{"instance-id": "p.ns", "local-hostname": "p", "uuid": "mine", "hostname": "h",
			"public-keys": ["k"], "public_keys": {"admin": "k"}}`)},
	} {
		t.Run(name, func(t *testing.T) {
			files, err := Layout(req)
			if err != nil {
				t.Fatal(err)
			}
			if ud := files["openstack/latest/user_data"]; string(ud) != string(req.UserData) {
				t.Errorf("user_data %q, want the request's", ud)
			}
			for _, f := range []string{"meta_data.json", "network_data.json"} {
				got := files["openstack/latest/"+f]
				golden := filepath.Join("testdata", name, f)
				if *update {
					os.MkdirAll(filepath.Dir(golden), 0o755)
					if got == nil {
						os.Remove(golden)
					} else {
						os.WriteFile(golden, got, 0o644)
					}
				}
				want, err := os.ReadFile(golden)
				if errors.Is(err, os.ErrNotExist) {
					want = nil
				}
				if string(got) != string(want) {
					t.Errorf("%s differs from %s (run with -update and review the diff):\n%s", f, golden, got)
				}
			}
		})
	}
	if _, err := Layout(ports.MediaRequest{MetaData: []byte("[1]")}); !errors.Is(err, ports.ErrInvalidArgument) {
		t.Errorf("meta-data that is not an object: %v", err)
	}
}
