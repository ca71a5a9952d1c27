package kubeapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtlet/virtlet/ports"
)

// apiServer answers the two GETs the adapter makes the way kube-apiserver
// does (JSON objects, Status errors), and checks the bearer token the
// kubeconfig carries.
func apiServer(t *testing.T) *httptest.Server {
	objects := map[string]interface{}{
		"/api/v1/namespaces/ns1/configmaps/cfg": &corev1.ConfigMap{
			TypeMeta:   metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "ns1"},
			Data:       map[string]string{"users": "- name: alice\n"},
			BinaryData: map[string][]byte{"blob": {0, 1, 2}},
		},
		"/api/v1/namespaces/ns1/secrets/keys": &corev1.Secret{
			TypeMeta:   metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "keys", Namespace: "ns1"},
			Data:       map[string][]byte{"authorized_keys": []byte("ssh-ed25519 AAAA test\n")},
		},
	}
	status := func(w http.ResponseWriter, code int, reason metav1.StatusReason) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Reason: reason, Code: int32(code), Message: fmt.Sprintf("%s %s", reason, "test")})
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer test-token" {
			status(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized)
			return
		}
		if r.Method == http.MethodPost && r.URL.Path == "/apis/authentication.k8s.io/v1/selfsubjectreviews" {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(&authnv1.SelfSubjectReview{
				TypeMeta: metav1.TypeMeta{Kind: "SelfSubjectReview", APIVersion: "authentication.k8s.io/v1"},
				Status: authnv1.SelfSubjectReviewStatus{UserInfo: authnv1.UserInfo{
					Username: "system:node:node-1", Groups: []string{"system:nodes", "system:authenticated"}}},
			})
			return
		}
		if r.Method != http.MethodGet {
			status(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed)
			return
		}
		if strings.HasSuffix(r.URL.Path, "/forbidden") {
			status(w, http.StatusForbidden, metav1.StatusReasonForbidden)
			return
		}
		obj, ok := objects[r.URL.Path]
		if !ok {
			status(w, http.StatusNotFound, metav1.StatusReasonNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(obj)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func kubeconfig(t *testing.T, srv *httptest.Server, server string) string {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	p := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority-data: %s}
users:
- name: node
  user: {token: test-token}
contexts:
- name: test
  context: {cluster: test, user: node}
current-context: test
`, server, base64.StdEncoding.EncodeToString(ca))
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestClient(t *testing.T) {
	srv := apiServer(t)
	c, err := New(kubeconfig(t, srv, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cm, err := c.ConfigMap(ctx, "ns1", "cfg")
	if err != nil {
		t.Fatal(err)
	}
	if string(cm["users"]) != "- name: alice\n" || string(cm["blob"]) != "\x00\x01\x02" || len(cm) != 2 {
		t.Errorf("configmap data %q", cm)
	}
	s, err := c.Secret(ctx, "ns1", "keys")
	if err != nil {
		t.Fatal(err)
	}
	if string(s["authorized_keys"]) != "ssh-ed25519 AAAA test\n" {
		t.Errorf("secret data %q", s)
	}
	for _, tc := range []struct {
		name string
		get  func() error
		want error
	}{
		{"missing configmap", func() error { _, err := c.ConfigMap(ctx, "ns1", "nope"); return err }, ports.ErrNotFound},
		{"secret in another namespace", func() error { _, err := c.Secret(ctx, "ns2", "keys"); return err }, ports.ErrNotFound},
		{"forbidden", func() error { _, err := c.Secret(ctx, "ns1", "forbidden"); return err }, ports.ErrFailedPrecondition},
	} {
		if err := tc.get(); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	// A refusal tells the pod's author the two ways to let the node read it.
	if _, err := c.Secret(ctx, "ns1", "forbidden"); err == nil || !strings.Contains(err.Error(), "reference it from the pod's volumes or env") ||
		!strings.Contains(err.Error(), "system:nodes get it with a Role in ns1") {
		t.Errorf("forbidden: %v", err)
	}
	user, groups, err := c.Identity(ctx)
	if err != nil || user != "system:node:node-1" || strings.Join(groups, ",") != "system:nodes,system:authenticated" {
		t.Errorf("Identity: %q %q %v", user, groups, err)
	}

	bad, err := New(kubeconfig(t, srv, "https://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.ConfigMap(ctx, "ns1", "cfg"); !errors.Is(err, ports.ErrUnavailable) {
		t.Errorf("unreachable API server: err %v, want unavailable", err)
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := New(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Errorf("missing kubeconfig: err %v", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := New(""); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("outside a cluster: err %v", err)
	}
}
