// Package testca makes a throwaway CA and a server certificate for
// 127.0.0.1/localhost, for test servers whose TLS is really verified.
package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are PEM files written by Write.
type Files struct {
	CA, Cert, Key string
	Pair          tls.Certificate
}

// Write creates a CA and a server certificate signed by it in dir, for
// 127.0.0.1, localhost and the extra addresses.
func Write(dir string, extra ...net.IP) (Files, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "virtlet test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Files{}, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		IPAddresses: append([]net.IP{net.ParseIP("127.0.0.1")}, extra...), DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return Files{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: filepath.Join(dir, "test-ca.pem"), Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem"),
		Pair: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
	for path, block := range map[string]*pem.Block{
		f.CA: {Type: "CERTIFICATE", Bytes: caDER}, f.Cert: {Type: "CERTIFICATE", Bytes: der}, f.Key: {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return Files{}, err
		}
	}
	os.Chmod(f.CA, 0o644)
	return f, nil
}
