package imagesource_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/virtlet/virtlet/adapters/imagesource"
	"github.com/virtlet/virtlet/ports"
)

// trusting returns a source that trusts an httptest server's certificate.
func trusting(t *testing.T, s *httptest.Server) *imagesource.Source {
	t.Helper()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	src := imagesource.New(quiet())
	cfg, _ := json.Marshal(imagesource.Config{CAFiles: []string{ca}})
	if err := src.Configure(context.Background(), ports.PluginConfig{Config: cfg}); err != nil {
		t.Fatal(err)
	}
	return src
}
