// Package imageserver serves a directory of VM images over HTTPS on
// loopback with a certificate from its own test CA, so that tests (and the
// demo) download images the way a node does, with TLS verified.
package imageserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Server is a running image server.
type Server struct {
	// Host is host:port, to put after virtlet.cloud/ in image names.
	Host string
	// CAFile is the PEM of the CA that signed the server's certificate.
	CAFile string
	srv    *http.Server
}

// Start serves dir on 127.0.0.1 (addr "127.0.0.1:0" for any port) and
// writes the CA certificate into caDir.
func Start(dir, addr, caDir string) (*Server, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "virtlet test image CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(caDir, "image-server-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler:   http.FileServer(http.Dir(dir)),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
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
