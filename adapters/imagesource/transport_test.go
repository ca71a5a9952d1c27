package imagesource_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtlet/virtlet/adapters/imagesource"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/harness"
)

func qcow2(t *testing.T) (string, []byte) {
	p := filepath.Join(t.TempDir(), "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", p, "16M").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	data, _ := os.ReadFile(p)
	return p, data
}

func transport(t *testing.T, tc ports.TransportConfig) []byte {
	b, err := json.Marshal(tc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTransports(t *testing.T) {
	path, data := qcow2(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/disk.qcow2", func(w http.ResponseWriter, r *http.Request) { w.Write(data) })
	mux.HandleFunc("/hop1", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/hop2", http.StatusFound) })
	mux.HandleFunc("/hop2", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/disk.qcow2", http.StatusFound) })
	plain := httptest.NewServer(mux)
	defer plain.Close()
	mux.HandleFunc("/downgrade", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/disk.qcow2", http.StatusFound)
	})
	secure := httptest.NewTLSServer(mux)
	defer secure.Close()
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: secure.Certificate().Raw}))
	trust := ports.TransportConfig{TLS: &ports.TransportTLS{Certificates: []ports.TLSCertificate{{Cert: caPEM}}}}
	zero := 0
	s := imagesource.New(quiet())
	ctx := context.Background()
	for _, tc := range []struct {
		name, location string
		transport      []byte
		want           string // "" = success
	}{
		{"https trusted through the translation's transport", secure.URL + "/disk.qcow2", transport(t, trust), ""},
		{"https without that trust", secure.URL + "/disk.qcow2", nil, "certificate signed by unknown authority"},
		{"insecure transport", secure.URL + "/disk.qcow2", transport(t, ports.TransportConfig{TLS: &ports.TransportTLS{Insecure: true}}), ""},
		{"plain http (named by a translation)", plain.URL + "/disk.qcow2", nil, ""},
		{"redirects followed", plain.URL + "/hop1", nil, ""},
		{"maxRedirects 0", plain.URL + "/hop1", transport(t, ports.TransportConfig{MaxRedirects: &zero}), "more than 0 redirects"},
		{"https to http downgrade refused", secure.URL + "/downgrade", transport(t, trust), "redirect from https to http"},
		{"file on the node", "file://" + path, nil, ""},
		{"missing file", "file://" + path + ".absent", nil, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := s.Fetch(ctx, ports.FetchRequest{Name: "x", Location: tc.location, TransportConfig: tc.transport, Dest: filepath.Join(harness.SearchableTempDir(t), "d")})
			if tc.want == "" {
				if err != nil || res.Format != "qcow2" || res.Size != int64(len(data)) {
					t.Fatalf("%+v %v", res, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	_, err := s.Fetch(ctx, ports.FetchRequest{Name: "x", Location: secure.URL + "/disk.qcow2",
		TransportConfig: transport(t, ports.TransportConfig{TLS: &ports.TransportTLS{Certificates: []ports.TLSCertificate{{Cert: "junk"}}}}), Dest: filepath.Join(harness.SearchableTempDir(t), "d")})
	if !errors.Is(err, ports.ErrInvalidArgument) {
		t.Fatalf("bad transport certificate: %v", err)
	}
}
