package kubedir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

const manifests = `apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data:
  users: |
    - name: alice
binaryData:
  blob: AAEC
---
apiVersion: v1
kind: Secret
metadata: {name: keys, namespace: ns1}
data:
  authorized_keys: c3NoLWVkMjU1MTkgQUFBQSB0ZXN0Cg==
stringData:
  plain: hello
`

func TestDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "objects.yaml"), []byte(manifests), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "other.json"),
		[]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"j","namespace":"ns1"},"data":{"k":"v"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cm, err := d.ConfigMap(ctx, "default", "cfg")
	if err != nil {
		t.Fatal(err)
	}
	if string(cm["users"]) != "- name: alice\n" || string(cm["blob"]) != "\x00\x01\x02" {
		t.Errorf("configmap %q", cm)
	}
	s, err := d.Secret(ctx, "ns1", "keys")
	if err != nil {
		t.Fatal(err)
	}
	if string(s["authorized_keys"]) != "ssh-ed25519 AAAA test\n" || string(s["plain"]) != "hello" {
		t.Errorf("secret %q", s)
	}
	j, err := d.ConfigMap(ctx, "ns1", "j")
	if err != nil || string(j["k"]) != "v" {
		t.Errorf("json configmap %q, %v", j, err)
	}
	for name, get := range map[string]func() error{
		"wrong namespace": func() error { _, err := d.ConfigMap(ctx, "ns1", "cfg"); return err },
		"wrong kind":      func() error { _, err := d.Secret(ctx, "default", "cfg"); return err },
		"missing":         func() error { _, err := d.Secret(ctx, "ns1", "nope"); return err },
	} {
		if err := get(); !errors.Is(err, ports.ErrNotFound) {
			t.Errorf("%s: err %v, want not found", name, err)
		}
	}
}

func TestBadSecretKeepsValuesOutOfErrors(t *testing.T) {
	dir := t.TempDir()
	doc := "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata:\n  k: not-base64-SECRETVALUE\n"
	if err := os.WriteFile(filepath.Join(dir, "s.yaml"), []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Secret(context.Background(), "default", "s")
	if err == nil || strings.Contains(err.Error(), "SECRETVALUE") {
		t.Fatalf("err %v", err)
	}
}

func TestNewNeedsADirectory(t *testing.T) {
	if _, err := New(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("no error for a missing directory")
	}
}
