// Package imageserver serves a directory of VM images over HTTPS on
// loopback with a certificate from its own test CA, so that tests (and the
// demo) download images the way a node does, with TLS verified.
package imageserver

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/virtlet/virtlet/testing/testca"
)

// Server is a running image server.
type Server struct {
	// Host is host:port, to put after virtlet.cloud/ in image names.
	Host string
	// CAFile is the PEM of the CA that signed the server's certificate.
	CAFile string
	srv    *http.Server
}

// Start serves dir on addr ("127.0.0.1:0": loopback, any port; a test
// address for nodes in network namespaces) and writes the CA certificate
// into caDir.
func Start(dir, addr, caDir string) (*Server, error) {
	var extra []net.IP
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() {
			extra = append(extra, ip) // a test address (the nodes' network)
		}
	}
	ca, err := testca.Write(caDir, extra...)
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(caDir, "image-server-ca.pem")
	if err := os.Rename(ca.CA, caFile); err != nil {
		return nil, err
	}
	os.Remove(ca.Cert)
	os.Remove(ca.Key)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler:   http.FileServer(http.Dir(dir)),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Pair}},
	}
	go srv.ServeTLS(l, "", "")
	return &Server{Host: l.Addr().String(), CAFile: caFile, srv: srv}, nil
}

// URL returns the https URL of a file served from the directory.
func (s *Server) URL(file string) string { return fmt.Sprintf("https://%s/%s", s.Host, file) }

// Translation returns an image translation config (Virtlet's format) that
// names each file virtlet.cloud/<name> and trusts the server's CA.
func (s *Server) Translation(names map[string]string) (string, error) {
	ca, err := os.ReadFile(s.CAFile)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("translations:\n")
	for name, file := range names {
		fmt.Fprintf(&b, "- name: %s\n  url: %s\n  transport: test-images\n", name, s.URL(file))
	}
	b.WriteString("transports:\n  test-images:\n    tls:\n      certificates:\n      - cert: |\n")
	for _, line := range strings.Split(strings.TrimSpace(string(ca)), "\n") {
		b.WriteString("          " + line + "\n")
	}
	return b.String(), nil
}

// Close stops the server.
func (s *Server) Close() error { return s.srv.Close() }
