package e2e

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/virtlet/virtlet/testing/harness"
)

const (
	annotationKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAnnotationKeyForTheE2eTest0000000000000 annotation@e2e"
	secretKey     = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAISecretSourceKeyForTheE2eTest000000000000 secret@e2e"
	secretValue   = "e2e-S3CRET-value-9d1c"
)

// The objects of Virtlet's ubuntu-vm example: a Secret with SSH keys, a ConfigMap of user-data
// parts.
const cloudObjects = `apiVersion: v1
kind: Secret
metadata: {name: mysecret, namespace: default}
stringData:
  authorized_keys: "` + secretKey + `\n"
---
apiVersion: v1
kind: ConfigMap
metadata: {name: vm-user-data, namespace: default}
data:
  users: |
    - name: cloudy
      gecos: Magic Cloud App Daemon User
      system: true
  write_files: |
    - path: /foobar.txt
      content: this part is from a configmap specified using VirtletCloudInitUserDataSource
`

// report prints what the test checks to the serial console, between
// markers, after cloud-init wrote files and users.
const report = `exec >/dev/ttyS0 2>&1
echo "@@HOSTNAME=$(hostname)"
echo "@@AUTHKEYS-BEGIN"; cat /home/debian/.ssh/authorized_keys; echo "@@AUTHKEYS-END"
echo "@@USER-CLOUDY=$(getent passwd cloudy | cut -d: -f5 | tr ' ' _)"
echo "@@USER-EXTRA=$(getent passwd extra | cut -d: -f1)"
echo "@@APP-INI-MODE=$(stat -c %a /etc/app/app.ini)"
echo "@@APP-INI-BEGIN"; cat /etc/app/app.ini; echo "@@APP-INI-END"
echo "@@SECRET-MODE=$(stat -c %a /etc/app-secret/password)"
echo "@@SECRET-SUM=$(md5sum < /etc/app-secret/password | cut -c1-32)"
echo "@@ENV-BEGIN"; cat /etc/cloud/environment; echo "@@ENV-END"
echo "@@FOOBAR=$(tr ' ' _ < /foobar.txt)"
echo "@@CI-REPORT-DONE"
`

// A VM pod annotated as Virtlet's ubuntu-vm example boots the cloud image (real
// cloud-init), which acts on everything Virtlet generated: hostname, SSH
// keys for the default user, merged users, ConfigMap and Secret files with
// their modes, the environment file and runcmd; with NoCloud and with
// ConfigDrive.
func TestCloudInitInRealGuest(t *testing.T) {
	parallel(t)
	tr := cloudTranslation(t)
	d, c := startDaemon(t)
	d.Translate("cloud.yaml", tr)
	d.KubeObjects("objects.yaml", cloudObjects)
	appDir := d.ProjectedVolume("configmap", "app-config", map[string]string{"app.ini": "[app]\nname=demo\n"}, 0o644)
	secretDir := d.ProjectedVolume("secret", "app-secret", map[string]string{"password": secretValue}, 0o400)
	c.Must(t, "pull", "virtlet.cloud/debian-cloud")

	for _, ds := range []string{"nocloud", "configdrive"} {
		t.Run(ds, func(t *testing.T) {
			name := "cloud-" + ds
			podJSON, _ := vmPod(t, d, name, map[string]string{
				"VirtletCloudInitImageType":      ds,
				"VirtletVCPUCount":               "1",
				"VirtletSSHKeys":                 annotationKey + "\n",
				"VirtletSSHKeySource":            "secret/mysecret",
				"VirtletCloudInitUserDataSource": "configmap/vm-user-data",
				// JSON is YAML; it quotes the script safely.
				"VirtletCloudInitUserData": mustJSON(t, map[string]interface{}{
					"users":  []interface{}{"default", map[string]string{"name": "extra"}},
					"runcmd": [][]string{{"sh", "-c", report}},
				}),
			}, 512<<20)
			ctrJSON := harness.WriteJSON(t, d.Dir, name+"-ctr.json", map[string]interface{}{
				"metadata": map[string]string{"name": name}, "image": map[string]string{"image": "virtlet.cloud/debian-cloud"},
				"log_path": name + "/0.log", "linux": map[string]interface{}{"resources": map[string]interface{}{"memory_limit_in_bytes": 512 << 20}},
				"envs": []map[string]string{{"key": "MY_FOO_VAR", "value": "foo"}, {"key": "GREETING", "value": "hello world"}},
				"mounts": []map[string]interface{}{
					{"container_path": "/etc/app", "host_path": appDir, "readonly": true},
					{"container_path": "/etc/app-secret", "host_path": secretDir, "readonly": true},
				},
			})
			sb := c.Must(t, "runp", podJSON)
			ctr := c.Must(t, "create", sb, ctrJSON, podJSON)
			start := time.Now()
			c.Must(t, "start", ctr)
			logs := waitLog(t, c, ctr, "@@CI-REPORT-DONE", 8*time.Minute)
			t.Logf("cloud-init report after %s", time.Since(start).Round(time.Second))
			if !strings.Contains(logs, "Debian GNU/Linux 12") {
				t.Errorf("console lacks the Debian banner")
			}
			if got := marker(t, logs, "HOSTNAME"); got != name {
				t.Errorf("hostname %q, want the pod name %q", got, name)
			}
			keys := between(t, logs, "AUTHKEYS")
			for _, k := range []string{annotationKey, secretKey} {
				if !strings.Contains(keys, k) {
					t.Errorf("the default user's authorized_keys lacks %q:\n%s", k, keys)
				}
			}
			if got := marker(t, logs, "USER-CLOUDY"); got != "Magic_Cloud_App_Daemon_User" {
				t.Errorf("user cloudy from the ConfigMap: gecos %q", got)
			}
			if got := marker(t, logs, "USER-EXTRA"); got != "extra" {
				t.Errorf("user extra from the annotation: %q", got)
			}
			if got := marker(t, logs, "APP-INI-MODE"); got != "644" {
				t.Errorf("ConfigMap file mode %s", got)
			}
			if got := between(t, logs, "APP-INI"); got != "[app]\nname=demo" {
				t.Errorf("ConfigMap file content %q", got)
			}
			if got := marker(t, logs, "SECRET-MODE"); got != "400" {
				t.Errorf("Secret file mode %s", got)
			}
			if got := marker(t, logs, "SECRET-SUM"); got != md5hex(secretValue) {
				t.Errorf("Secret file checksum %s, want %s", got, md5hex(secretValue))
			}
			env := between(t, logs, "ENV")
			for _, w := range []string{"MY_FOO_VAR=foo", "GREETING=hello world"} {
				if !strings.Contains(env, w) {
					t.Errorf("/etc/cloud/environment lacks %q:\n%s", w, env)
				}
			}
			if got := marker(t, logs, "FOOBAR"); !strings.HasPrefix(got, "this_part_is_from_a_configmap") {
				t.Errorf("/foobar.txt from the user-data source: %q", got)
			}
			if strings.Contains(logs, secretValue) {
				t.Error("the secret's value reached the console")
			}
			c.Must(t, "rmp", "-f", sb)
		})
	}
	raw, _ := os.ReadFile(d.LogFile)
	if strings.Contains(string(raw), secretValue) || strings.Contains(string(raw), "SecretSourceKey") {
		t.Error("a secret value is in the daemon's log")
	}
	assertNothingLeft(t, d, c)
}

// between returns the console lines between @@NAME-BEGIN and @@NAME-END.
func between(t *testing.T, logs, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)@@` + name + `-BEGIN\r?\n(.*?)\r?\n?@@` + name + `-END`).FindStringSubmatch(logs)
	if m == nil {
		t.Fatalf("no @@%s-BEGIN…END in the console:\n%s", name, logs)
	}
	return strings.TrimSpace(strings.ReplaceAll(m[1], "\r", ""))
}

func mustJSON(t *testing.T, v interface{}) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}
