package cloudinit

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/core/annotations"
	"github.com/virtlet/virtlet/ports"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func opts(t *testing.T, kv ...string) annotations.VMOptions {
	t.Helper()
	ann := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		ann[kv[i]] = kv[i+1]
	}
	o, err := annotations.Parse(ann)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// seed004 is the pod of Virtlet's cloud-init example (ubuntu-vm): every
// source of data at once.
func seed004(t *testing.T) Input {
	return Input{
		PodName: "ubuntu-vm", Namespace: "default",
		Options: opts(t,
			annotations.CloudInitMetaData, "instance-id: foobar\n",
			annotations.CloudInitUserData, "users:\n- name: cloudy\n  gecos: Magic Cloud App Daemon User\n  inactive: true\n  system: true\n",
			annotations.CloudInitUserDataSource, "configmap/vm-user-data",
			annotations.SSHKeys, "ssh-rsa AAAA... me@localhost\nssh-rsa AAAA... you@localhost\n",
			annotations.SSHKeySource, "secret/mysecret",
		),
		UserDataSource: map[string][]byte{
			"write_files": []byte("- path: /foobar.txt\n  content: this part is from a configmap specified using VirtletCloudInitUserDataSource\n"),
		},
		SSHKeySource: map[string][]byte{"authorized_keys": []byte("ssh-rsa AAAA... source@localhost\n")},
		Files: []File{
			{Path: "/etc/foobar/some-file-from-configmap.conf", Data: []byte("# this is a sample config file\n# taken from a configmap\n"), Mode: 0o644},
			{Path: "/etc/baz/a-file-taken-from-secrets.conf", Data: []byte("# some secret content\n"), Mode: 0o600},
		},
		Volumes: []Volume{
			{Name: "extra", Serial: "vol-extra", GuestPath: "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_vol-extra", MountPath: "/var/lib/docker", Format: "ext4"},
			{Name: "raw", Serial: "vol-raw", GuestPath: "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_vol-raw", MountPath: "/var/lib/postgresql"},
			{Name: "ceph", Serial: "vol-ceph", GuestPath: "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_vol-ceph", MountPath: "/cephdata"},
		},
	}
}

var network = &ports.NetworkAttachment{
	Interfaces: []ports.NetworkInterface{{Name: "eth0", MAC: "52:54:00:a1:b2:c3", MTU: 1450,
		IPs: []ports.IPConfig{{Address: "198.18.0.5/24", Gateway: "198.18.0.1"}, {Address: "fd00:198:18::5/64", Gateway: "fd00:198:18::1"}}}},
	Routes: []ports.Route{{Destination: "0.0.0.0/0", Gateway: "198.18.0.1"}, {Destination: "198.19.0.0/16", Gateway: "198.18.0.254"}},
	DNS:    &ports.DNSConfig{Servers: []string{"198.18.0.10"}, Searches: []string{"default.svc.cluster.local", "svc.cluster.local"}},
}

// withDNSOptions is att with its DNS config given resolver options.
func withDNSOptions(att *ports.NetworkAttachment, options ...string) *ports.NetworkAttachment {
	out := *att
	dns := *att.DNS
	dns.Options = options
	out.DNS = &dns
	return &out
}

func TestGolden(t *testing.T) {
	cases := map[string]func(t *testing.T) Input{
		"seed-004-example": seed004,
		// The example's user has inactive: true, which cloud-init 22.4's schema
		// wants as a string of days; this variant must validate cleanly.
		"seed-004-schema-valid": func(t *testing.T) Input {
			in := seed004(t)
			in.Options.UserData["users"].([]interface{})[0].(map[string]interface{})["inactive"] = "5"
			return in
		},
		"defaults": func(t *testing.T) Input {
			return Input{PodName: "cirros-vm", Namespace: "default", Options: annotations.Defaults()}
		},
		"overwrite": func(t *testing.T) Input {
			in := seed004(t)
			in.Options.UserDataOverwrite = true
			in.Options.UserData["write_files"] = []interface{}{map[string]interface{}{"path": "/only.txt", "content": "annotation wins"}}
			return in
		},
		"script-with-placeholder": func(t *testing.T) Input {
			in := seed004(t)
			in.Options.UserDataScript = "#!/bin/sh\n" + MountScriptPlaceholder + "\necho hello world\n"
			in.Volumes = append(in.Volumes, Volume{Name: "block", Serial: "vol-block", GuestPath: "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_vol-block", DevicePath: "/dev/database"})
			return in
		},
		"source-key-plain": func(t *testing.T) Input {
			return Input{PodName: "p", Namespace: "ns",
				Options: opts(t, annotations.CloudInitUserDataSource, "configmap/ud", annotations.CloudInitUserDataSourceKey, "user-data",
					annotations.CloudInitUserData, "runcmd:\n- [echo, from-annotation]\n"),
				UserDataSource: map[string][]byte{"user-data": []byte("#cloud-config\nruncmd:\n- [echo, from-source]\npackages: [htop]\n"), "other": []byte("ignored: true")}}
		},
		"source-key-base64": func(t *testing.T) Input {
			doc := base64.StdEncoding.EncodeToString([]byte("#cloud-config\nbootcmd:\n- [echo, from-base64]\n"))
			return Input{PodName: "p", Namespace: "ns",
				Options: opts(t, annotations.CloudInitUserDataSource, "secret/ud", annotations.CloudInitUserDataSourceKey, "ud",
					annotations.CloudInitUserDataSourceEncoding, "base64"),
				UserDataSource: map[string][]byte{"ud": []byte(doc)}}
		},
		"ssh-key-source-with-key": func(t *testing.T) Input {
			return Input{PodName: "p", Namespace: "ns", Options: opts(t, annotations.SSHKeySource, "configmap/keys/admins",
				annotations.SSHKeys, "ssh-ed25519 BBBB annotation@host"),
				SSHKeySource: map[string][]byte{"admins": []byte("# admins\nssh-ed25519 AAAA admin@host\n\n"), "other": []byte("ssh-rsa BBBB ignored@host")}}
		},
		"ssh-keys-overwrite": func(t *testing.T) Input {
			return Input{PodName: "p", Namespace: "ns", Options: opts(t, annotations.SSHKeySource, "secret/keys",
				annotations.SSHKeys, "ssh-ed25519 BBBB annotation@host", annotations.CloudInitUserDataOverwrite, "true"),
				SSHKeySource: map[string][]byte{"authorized_keys": []byte("ssh-ed25519 AAAA source@host\n")}}
		},
		// A pod whose spec names its host name (kubelet's Hostname): the
		// guest's local-hostname is that name, not the pod's.
		"hostname-from-pod-spec": func(t *testing.T) Input {
			return Input{PodName: "web-0", Namespace: "ns", Hostname: "db-primary", Options: annotations.Defaults()}
		},
		"env": func(t *testing.T) Input {
			return Input{PodName: "p", Namespace: "ns", Options: annotations.Defaults(),
				Env: []EnvVar{{"MY_FOO_VAR", "foo"}, {"MY_FOOBAR_VAR", "foobar"}}}
		},
		// virtio disks: a blank ephemeral disk (formatted with its UUID), a
		// read-only disk, shares read-write and read-only, a block device
		// linked to a path and mounted by the user's own mounts entry.
		"block-and-9p-volumes": func(t *testing.T) Input {
			return Input{PodName: "p", Namespace: "ns",
				Options: opts(t, annotations.DiskDriver, "virtio", annotations.CloudInitUserData, "mounts:\n- [/dev/database, /var/lib/db]\n"),
				Volumes: []Volume{
					{Name: "data", Serial: "vol-data", GuestPath: "/dev/disk/by-id/virtio-vol-data", MountPath: "/data", Format: "ext4",
						FormatUUID: "7a4d2c1e-9c2b-4e54-9a57-33c1a8b2d0f1"},
					{Name: "ro", Serial: "vol-ro", GuestPath: "/dev/disk/by-id/virtio-vol-ro", MountPath: "/ro", ReadOnly: true},
					{Name: "logs", Serial: "vol-logs", GuestPath: "/dev/disk/by-id/virtio-vol-logs", MountPath: "/var/log/app", Format: "xfs",
						FormatUUID: "0f4d2c1e-9c2b-4e54-9a57-33c1a8b2d0f2"},
					{Name: "share", Tag: "share", MountPath: "/srv/share"},
					{Name: "config", Tag: "config", MountPath: "/etc/app", ReadOnly: true},
					{Name: "db", Serial: "vol-db", GuestPath: "/dev/disk/by-id/virtio-vol-db", DevicePath: "/dev/database"},
				}}
		},
		// A persistent root keeps its first pod's network configuration:
		// no network-config, the VM asks DHCP.
		"persistent-root": func(t *testing.T) Input {
			return Input{PodName: "p", Namespace: "ns", Options: annotations.Defaults(), Network: network, PersistentRoot: true}
		},
		"network-nocloud": func(t *testing.T) Input {
			return Input{PodName: "p", Namespace: "ns", Options: annotations.Defaults(), Network: network}
		},
		// A meta plugin's result: two interfaces, each with a gateway; only
		// the first gives the default routes, and the second interface's
		// route goes where its gateway is reachable.
		"network-two-interfaces": func(t *testing.T) Input {
			two := &ports.NetworkAttachment{
				Interfaces: []ports.NetworkInterface{
					{Name: "eth0", MAC: "0a:58:c6:12:10:05", MTU: 1500, IPs: []ports.IPConfig{
						{Address: "198.18.16.5/24", Gateway: "198.18.16.1"}, {Address: "fd00:198:18:10::5/64", Gateway: "fd00:198:18:10::1"}}},
					{Name: "net1", MAC: "0a:58:c6:12:11:07", IPs: []ports.IPConfig{{Address: "198.18.17.7/24", Gateway: "198.18.17.1"}}},
				},
				Routes: []ports.Route{{Destination: "0.0.0.0/0", Gateway: "198.18.16.1"}, {Destination: "::/0", Gateway: "fd00:198:18:10::1"},
					{Destination: "198.19.128.0/17", Gateway: "198.18.17.1"}},
			}
			return Input{PodName: "p", Namespace: "ns", Options: annotations.Defaults(), Network: two}
		},
		// Calico's addressing: a /32 whose gateway, 169.254.1.1, is on the
		// link outside it; network-config leaves the address to DHCP.
		"network-calico": func(t *testing.T) Input {
			calico := &ports.NetworkAttachment{
				Interfaces: []ports.NetworkInterface{{Name: "eth0", MAC: "0a:58:c6:12:07:09",
					IPs: []ports.IPConfig{{Address: "198.18.7.9/32", Gateway: "169.254.1.1"}}}},
				Routes: []ports.Route{{Destination: "0.0.0.0/0", Gateway: "169.254.1.1"}},
			}
			return Input{PodName: "p", Namespace: "ns", Options: annotations.Defaults(), Network: calico}
		},
		"network-force-dhcp": func(t *testing.T) Input {
			return Input{PodName: "p", Namespace: "ns", Options: opts(t, annotations.ForceDHCPNetworkConfig, "true"), Network: network}
		},
		// kubelet's ClusterFirst resolver options: a resolv_conf in the
		// user-data (DHCP and network-config cannot carry them), merged with
		// the user's by the merge rules of docs/cloud-init.md: the user's ndots replaces the
		// pod's, its attempts is added, its name server follows the pod's.
		"dns-options": func(t *testing.T) Input {
			return Input{PodName: "p", Namespace: "ns", Network: withDNSOptions(network, "ndots:5", "rotate", "timeout:2"),
				Options: opts(t, annotations.CloudInitUserData, "resolv_conf:\n  nameservers: [198.18.0.11]\n  options:\n    attempts: 3\n    ndots: 2\n")}
		},
	}
	schema, _ := exec.LookPath("cloud-init")
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := Build(mk(t))
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join("testdata", name)
			for file, got := range map[string][]byte{"meta-data": d.MetaData, "user-data": d.UserData, "network-config": d.NetworkConfig} {
				golden := filepath.Join(dir, file)
				if *update {
					os.MkdirAll(dir, 0o755)
					if len(got) == 0 {
						os.Remove(golden)
					} else {
						os.WriteFile(golden, got, 0o644)
					}
				}
				want, err := os.ReadFile(golden)
				if os.IsNotExist(err) {
					want = nil
				} else if err != nil {
					t.Fatal(err)
				}
				if string(want) != string(got) {
					t.Errorf("%s differs from %s (run with -update and review the diff):\n%s", file, golden, got)
				}
			}
			if len(d.UserData) > 0 && strings.HasPrefix(string(d.UserData), "#cloud-config") {
				if schema == "" {
					t.Fatal("cloud-init is not installed: testing/setup.sh installs it to validate user-data")
				}
				f := filepath.Join(t.TempDir(), "user-data")
				os.WriteFile(f, d.UserData, 0o644)
				out, err := exec.Command(schema, "schema", "-c", f).CombinedOutput()
				seedUser := "users.0: {'gecos': 'Magic Cloud App Daemon User', 'inactive': True, 'name': 'cloudy', 'system': True} is not valid"
				switch {
				case strings.HasPrefix(name, "seed-004-ex") || name == "overwrite":
					// The example's own user entry is the only problem.
					if err == nil || strings.Count(string(out), "is not") != 1 || !strings.Contains(string(out), seedUser) {
						t.Errorf("want exactly the seed's user refused by cloud-init schema, got %v:\n%s", err, out)
					}
				case err != nil:
					t.Errorf("cloud-init schema refuses the user-data: %v\n%s\n%s", err, out, d.UserData)
				}
			}
		})
	}
}

func TestSourceErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    Input
		field string
		want  string
	}{
		{"key that does not exist", Input{Options: opts(t, annotations.CloudInitUserDataSource, "configmap/ud", annotations.CloudInitUserDataSourceKey, "user-data"),
			UserDataSource: map[string][]byte{"userdata": []byte("x: 1")}},
			"annotation VirtletCloudInitUserDataSourceKey", "configmap ud has no such key (allowed: one of its keys: userdata)"},
		{"invalid base64", Input{Options: opts(t, annotations.CloudInitUserDataSource, "secret/ud", annotations.CloudInitUserDataSourceKey, "k",
			annotations.CloudInitUserDataSourceEncoding, "base64"), UserDataSource: map[string][]byte{"k": []byte("!!not base64!!")}},
			"annotation VirtletCloudInitUserDataSourceEncoding", "not valid base64"},
		{"key holding a #cloud-config list", Input{Options: opts(t, annotations.CloudInitUserDataSource, "configmap/ud", annotations.CloudInitUserDataSourceKey, "k"),
			UserDataSource: map[string][]byte{"k": []byte("#cloud-config\n- a\n- b\n")}},
			"annotation VirtletCloudInitUserDataSourceKey", "not a YAML mapping"},
		{"value that is not YAML", Input{Options: opts(t, annotations.CloudInitUserDataSource, "configmap/ud"),
			UserDataSource: map[string][]byte{"runcmd": []byte("[unclosed")}},
			"annotation VirtletCloudInitUserDataSource", "key runcmd is not YAML"},
		{"SSH key source without authorized_keys", Input{Options: opts(t, annotations.SSHKeySource, "secret/keys"),
			SSHKeySource: map[string][]byte{"id_rsa.pub": []byte("ssh-rsa AAAA")}},
			"annotation VirtletSSHKeySource", `secret keys has no key "authorized_keys" (allowed: one of its keys: id_rsa.pub)`},
		{"SSH key source without the named key", Input{Options: opts(t, annotations.SSHKeySource, "configmap/keys/admins"),
			SSHKeySource: map[string][]byte{}},
			"annotation VirtletSSHKeySource", `configmap keys has no key "admins" (allowed: one of its keys: (none))`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.PodName, tc.in.Namespace = "p", "ns"
			_, err := Build(tc.in)
			var ie *ports.InvalidError
			if !errors.As(err, &ie) || ie.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %s: %q", err, tc.field, tc.want)
			}
		})
	}
}

func TestMergeRules(t *testing.T) {
	base := map[string]interface{}{"users": []interface{}{"a"}, "a": map[string]interface{}{"x": 1, "l": []interface{}{1}}, "s": "old"}
	over := map[string]interface{}{"users": []interface{}{"b"}, "a": map[string]interface{}{"y": 2, "l": []interface{}{2}}, "s": "new"}
	got := Merge(base, over)
	want := map[string]interface{}{"users": []interface{}{"a", "b"}, "a": map[string]interface{}{"x": 1, "y": 2, "l": []interface{}{1, 2}}, "s": "new"}
	if !equal(got, want) {
		t.Fatalf("merge %v", got)
	}
	if !equal(base["users"], []interface{}{"a"}) {
		t.Fatal("merge modified its input")
	}
}

// FuzzMerge: merging never panics, keeps every key, and appends lists.
func FuzzMerge(f *testing.F) {
	f.Add("users: [a]\nx: {y: 1}", "users: [b]\nx: {z: [1]}")
	f.Add("a: 1", "a: [1, 2]")
	f.Fuzz(func(t *testing.T, a, b string) {
		ma, errA := yamlMap([]byte(a))
		mb, errB := yamlMap([]byte(b))
		if errA != nil || errB != nil {
			return
		}
		m := Merge(ma, mb)
		for k := range ma {
			if _, ok := m[k]; !ok {
				t.Fatalf("lost key %s", k)
			}
		}
		for k, v := range mb {
			la, okA := ma[k].([]interface{})
			lb, okB := v.([]interface{})
			if okA && okB {
				if l, _ := m[k].([]interface{}); len(l) != len(la)+len(lb) {
					t.Fatalf("list %s not appended: %v", k, m[k])
				}
			}
		}
	})
}

// FuzzSources: any ConfigMap content either builds or fails as invalid
// input naming an annotation.
func FuzzSources(f *testing.F) {
	f.Add("user-data", "#cloud-config\nruncmd: [[ls]]\n", "plain")
	f.Add("k", "bm90IHlhbWw6IFsK", "base64")
	f.Add("", "users: [x]", "plain")
	f.Fuzz(func(t *testing.T, key, value, encoding string) {
		ann := []string{annotations.CloudInitUserDataSource, "configmap/src"}
		if key != "" {
			ann = append(ann, annotations.CloudInitUserDataSourceKey, key)
		}
		if encoding == "base64" {
			ann = append(ann, annotations.CloudInitUserDataSourceEncoding, "base64")
		}
		o, err := annotations.Parse(map[string]string{ann[0]: ann[1]})
		if err != nil {
			return
		}
		if len(ann) > 2 {
			extra := map[string]string{ann[0]: ann[1]}
			for i := 2; i+1 < len(ann); i += 2 {
				extra[ann[i]] = ann[i+1]
			}
			if o, err = annotations.Parse(extra); err != nil {
				return
			}
		}
		data := map[string][]byte{"runcmd": []byte(value)}
		if key != "" {
			data = map[string][]byte{key: []byte(value)}
		}
		_, err = Build(Input{PodName: "p", Namespace: "ns", Options: o, UserDataSource: data})
		if err != nil && !errors.Is(err, ports.ErrInvalidArgument) {
			t.Fatalf("error of the wrong kind: %v", err)
		}
	})
}

func equal(a, b interface{}) bool {
	ya, _ := yamlOf(a)
	yb, _ := yamlOf(b)
	return ya == yb
}

// TestResolvConfRenderedByCloudInit hands the generated resolv_conf to
// cloud-init's own cc_resolv_conf renderer: the guest's resolv.conf must
// carry the pod's name servers, search domains and every resolver option.
func TestResolvConfRenderedByCloudInit(t *testing.T) {
	const template = "/etc/cloud/templates/resolv.conf.tmpl"
	if _, err := os.Stat(template); err != nil {
		t.Fatalf("cloud-init is not installed (testing/setup.sh installs it): %v", err)
	}
	d, err := Build(Input{PodName: "p", Namespace: "ns", Options: annotations.Defaults(),
		Network: withDNSOptions(network, "ndots:5", "rotate", "edns0", "timeout:2")})
	if err != nil {
		t.Fatal(err)
	}
	var ud struct {
		Manage     bool                   `json:"manage_resolv_conf"`
		ResolvConf map[string]interface{} `json:"resolv_conf"`
	}
	if err := yaml.Unmarshal(d.UserData, &ud); err != nil {
		t.Fatal(err)
	}
	if !ud.Manage {
		t.Fatalf("manage_resolv_conf is not set:\n%s", d.UserData)
	}
	params, err := json.Marshal(ud.ResolvConf)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "resolv.conf")
	script := "import json, sys\nfrom cloudinit.config.cc_resolv_conf import generate_resolv_conf\n" +
		"generate_resolv_conf(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])\n"
	if b, err := exec.Command("/usr/bin/python3", "-c", script, template, string(params), out).CombinedOutput(); err != nil {
		t.Fatalf("cloud-init's renderer: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(got), "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	want := []string{"nameserver 198.18.0.10", "search default.svc.cluster.local svc.cluster.local", "options edns0 rotate ndots:5 timeout:2"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("cloud-init renders\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
