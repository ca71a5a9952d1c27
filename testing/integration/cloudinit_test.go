package integration

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/virtlet/virtlet/testing/contract/datasourcetest"
	"github.com/virtlet/virtlet/testing/harness"
)

// A secret value that must never reach a log.
const secretValue = "hunter2-S3CRET-7f3a"

const objects = `apiVersion: v1
kind: Secret
metadata: {name: ssh-keys, namespace: default}
stringData:
  authorized_keys: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 from-secret\n"
---
apiVersion: v1
kind: ConfigMap
metadata: {name: user-data, namespace: default}
data:
  users: |
    - name: alice
      shell: /bin/sh
  runcmd: |
    - echo from-configmap
---
apiVersion: v1
kind: Secret
metadata: {name: whole-ud, namespace: default}
stringData:
  ud: "I2Nsb3VkLWNvbmZpZwpib290Y21kOgotIGVjaG8gZnJvbS1iYXNlNjQK"
  notb64: "%%%"
  list: "#cloud-config\n- a\n- b\n"
`

// withMounts adds mounts to a container config written by vmPod.
func withMounts(t *testing.T, path string, mounts ...map[string]interface{}) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]interface{}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["mounts"] = mounts
	out, _ := json.Marshal(cfg)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func cloudInitDisk(t *testing.T, c *harness.Crictl, ctr string) (path, bus, device string) {
	t.Helper()
	var ci struct {
		VM struct {
			Disks []struct{ Name, Path, Bus, Device string } `json:"disks"`
		} `json:"vm"`
	}
	c.JSON(t, &ci, "inspect", ctr)
	for _, disk := range ci.VM.Disks {
		if disk.Name == "cloud-init" {
			return disk.Path, disk.Bus, disk.Device
		}
	}
	t.Fatalf("no cloud-init disk in %+v", ci.VM.Disks)
	return "", "", ""
}

func TestCloudInitMediaThroughPlugins(t *testing.T) {
	d, c := startDaemon(t)
	d.KubeObjects("objects.yaml", objects)
	c.Must(t, "pull", image)
	cfgDir := d.ProjectedVolume("configmap", "app-config", map[string]string{"app.ini": "[app]\nname=demo\n"}, 0o644)
	secDir := d.ProjectedVolume("secret", "app-secret", map[string]string{"password": secretValue}, 0o400)

	for _, tc := range []struct {
		datasource, label, userData, metaData string
	}{
		{"nocloud", "cidata", "user-data", "meta-data"},
		{"configdrive", "config-2", "openstack/latest/user_data", "openstack/latest/meta_data.json"},
	} {
		t.Run(tc.datasource, func(t *testing.T) {
			name := "ci-" + tc.datasource
			pod, ctr := vmPod(t, d, name, map[string]string{
				"VirtletCloudInitImageType":      tc.datasource,
				"VirtletDiskDriver":              "",
				"VirtletSSHKeySource":            "secret/ssh-keys",
				"VirtletCloudInitUserDataSource": "configmap/user-data",
				"VirtletCloudInitUserData":       "users:\n- name: bob\n",
				"VirtletCloudInitMetaData":       `{"purpose": "test"}`,
			})
			withMounts(t, ctr,
				map[string]interface{}{"container_path": "/etc/app", "host_path": cfgDir, "readonly": true},
				map[string]interface{}{"container_path": "/etc/app-secret", "host_path": secDir, "readonly": true})
			sb := c.Must(t, "runp", pod)
			id := c.Must(t, "create", sb, ctr, pod)
			iso, bus, device := cloudInitDisk(t, c, id)
			if bus != "scsi" || device != "cdrom" {
				t.Errorf("cloud-init disk on %s as %s, want a scsi cdrom", bus, device)
			}
			label, files := datasourcetest.ReadISO(t, iso)
			if label != tc.label {
				t.Errorf("label %q", label)
			}
			var md map[string]interface{}
			if err := json.Unmarshal(files[tc.metaData], &md); err != nil {
				t.Fatalf("meta-data: %v\n%s", err, files[tc.metaData])
			}
			if md["instance-id"] != name+".default" || md["local-hostname"] != name || md["purpose"] != "test" {
				t.Errorf("meta-data %s", files[tc.metaData])
			}
			ud := files[tc.userData]
			if !strings.HasPrefix(string(ud), "#cloud-config\n") {
				t.Fatalf("user-data %q", ud)
			}
			var doc struct {
				Users      []map[string]interface{} `json:"users"`
				Runcmd     []interface{}            `json:"runcmd"`
				WriteFiles []struct {
					Path, Content, Encoding, Permissions string
				} `json:"write_files"`
				SSHKeys []string `json:"ssh_authorized_keys"`
			}
			if err := yaml.Unmarshal(ud, &doc); err != nil {
				t.Fatal(err)
			}
			if len(doc.Users) != 2 || doc.Users[0]["name"] != "alice" || doc.Users[1]["name"] != "bob" {
				t.Errorf("users %v (want alice from the ConfigMap, then bob from the annotation)", doc.Users)
			}
			files2 := map[string]string{}
			for _, f := range doc.WriteFiles {
				files2[f.Path] = f.Permissions
			}
			if files2["/etc/app/app.ini"] != "0644" || files2["/etc/app-secret/password"] != "0400" || files2["/etc/cloud/environment"] == "" {
				t.Errorf("write_files %v", files2)
			}
			if keys := md["public-keys"]; keys == nil {
				t.Errorf("no public-keys in meta-data %s", files[tc.metaData])
			}
			mode := func() os.FileMode { st, _ := os.Stat(iso); return st.Mode().Perm() }()
			if mode != 0o600 {
				t.Errorf("ISO mode %v", mode)
			}
			c.Must(t, "rm", id)
			if _, err := os.Stat(iso); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("ISO left after rm: %v", err)
			}
			c.Must(t, "stopp", sb)
			c.Must(t, "rmp", sb)
		})
	}
	// The secret travelled into the ISO, never into a log.
	for _, f := range []string{d.LogFile} {
		raw, _ := os.ReadFile(f)
		if strings.Contains(string(raw), secretValue) || strings.Contains(string(raw), "from-secret") {
			t.Errorf("a secret value is in %s", f)
		}
	}
}

func TestCloudInitBadInputs(t *testing.T) {
	d, c := startDaemon(t)
	d.KubeObjects("objects.yaml", objects)
	c.Must(t, "pull", image)
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want []string
	}{
		{"user-data not a map", map[string]string{"VirtletCloudInitUserData": "- just\n- a list\n"},
			[]string{"annotation VirtletCloudInitUserData", "mapping"}},
		{"missing source", map[string]string{"VirtletCloudInitUserDataSource": "configmap/nope"},
			[]string{"annotation VirtletCloudInitUserDataSource", "configmap default/nope does not exist"}},
		{"missing SSH key source", map[string]string{"VirtletSSHKeySource": "secret/nope"},
			[]string{"annotation VirtletSSHKeySource", "secret default/nope does not exist"}},
		{"missing key", map[string]string{"VirtletCloudInitUserDataSource": "secret/whole-ud", "VirtletCloudInitUserDataSourceKey": "nokey"},
			[]string{"annotation VirtletCloudInitUserDataSourceKey", "nokey", "list, notb64, ud"}},
		{"missing SSH key", map[string]string{"VirtletSSHKeySource": "secret/ssh-keys/id.pub"},
			[]string{"annotation VirtletSSHKeySource", `no key \"id.pub\"`}},
		{"invalid base64", map[string]string{"VirtletCloudInitUserDataSource": "secret/whole-ud",
			"VirtletCloudInitUserDataSourceKey": "notb64", "VirtletCloudInitUserDataSourceEncoding": "base64"},
			[]string{"annotation VirtletCloudInitUserDataSourceEncoding", "not valid base64"}},
		{"source key not a map", map[string]string{"VirtletCloudInitUserDataSource": "secret/whole-ud", "VirtletCloudInitUserDataSourceKey": "list"},
			[]string{"annotation VirtletCloudInitUserDataSourceKey", "not a YAML mapping"}},
		{"bad kind", map[string]string{"VirtletCloudInitUserDataSource": "pod/whatever"},
			[]string{"annotation VirtletCloudInitUserDataSource", "configmap", "secret"}},
		{"bad datasource", map[string]string{"VirtletCloudInitImageType": "floppy"},
			[]string{"annotation VirtletCloudInitImageType", "nocloud", "configdrive"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "bad-" + strings.ReplaceAll(tc.name, " ", "-")
			pod, ctr := vmPod(t, d, name, tc.ann)
			sb := c.Must(t, "runp", pod)
			_, errOut, err := c.Run("create", sb, ctr, pod)
			if err == nil {
				t.Fatal("create succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("error lacks %q:\n%s", w, errOut)
				}
			}
			if strings.Contains(errOut, "hunter2") {
				t.Errorf("error leaks a secret:\n%s", errOut)
			}
			if ctrs := c.Must(t, "ps", "-a", "-q", "-p", sb); ctrs != "" {
				t.Errorf("containers left: %q", ctrs)
			}
			c.Must(t, "rmp", "-f", sb)
		})
	}
	// Nothing half-made is left in the datasource plugins' directories.
	isos, _ := filepath.Glob(filepath.Join(d.StateDir, "plugins", "*", "media", "*"))
	if len(isos) != 0 {
		t.Errorf("media left: %v", isos)
	}
}
