package migrationpeer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// ca issues node certificates as a cluster's CA does kubelet's: client
// certificates, no address.
type ca struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newCA(t *testing.T, dir, name string) *ca {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	c := &ca{dir: dir, cert: cert, key: key, file: filepath.Join(dir, name+"-ca.crt")}
	writePEM(t, c.file, "CERTIFICATE", der)
	return c
}

// issue writes a client certificate for cn and its key.
func (c *ca) issue(t *testing.T, cn string) Config {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(c.dir, strings.ReplaceAll(cn, ":", "_")+"-"+serial.String())
	writePEM(t, base+".crt", "CERTIFICATE", der)
	kder, _ := x509.MarshalECPrivateKey(key)
	writePEM(t, base+".key", "EC PRIVATE KEY", kder)
	return Config{Address: "127.0.0.1:0", CertFile: base + ".crt", KeyFile: base + ".key", CAFile: c.file}
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// receiver is the receiving side's core: it accepts the offers it is
// told to, with an endpoint whose sockets echo what they are sent,
// prefixed by their name.
type receiver struct {
	t       *testing.T
	dir     string
	refuse  error
	mu      sync.Mutex
	from    []string
	outcome chan error
}

func (r *receiver) ReceiveMigration(ctx context.Context, fromNode string, offer ports.MigrationOffer) (ports.IncomingMigration, error) {
	r.mu.Lock()
	r.from = append(r.from, fromNode)
	r.mu.Unlock()
	if r.refuse != nil {
		return ports.IncomingMigration{}, r.refuse
	}
	sub := filepath.Join(r.dir, "0123456789abcdef0123456789abcdef")
	os.MkdirAll(real(sub), 0o700)
	ep := ports.MigrationEndpoint{DomainXML: "<domain/>", ControlSocket: filepath.Join(r.dir, "libvirt-sock"),
		MemorySocket: filepath.Join(sub, "memory.sock"), DisksSocket: filepath.Join(sub, "disks.sock")}
	for name, path := range map[string]string{"control": ep.ControlSocket, "memory": ep.MemorySocket, "disks": ep.DisksSocket} {
		if err := echo(r.t, real(path), name); err != nil {
			return ports.IncomingMigration{}, err
		}
	}
	check := func(ctx context.Context, x string) (string, error) {
		if strings.Contains(x, "/etc/shadow") {
			return "", errors.New("its disk is not this node's")
		}
		return "<checked>" + x + "</checked>", nil
	}
	return ports.IncomingMigration{Endpoint: ep, Domain: offer.VM.Name, Check: check, Done: func(err error) { r.outcome <- err }}, nil
}

// real is where a socket the receiving side names is (the sending side
// makes its own under the same name, on the same file system here).
func real(path string) string { return strings.Replace(path, "/target/", "/real/", 1) }

// echo serves path: each connection gets name and what it sent back.
func echo(t *testing.T, path, name string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.WriteString(c, name+":")
				io.Copy(c, c)
			}()
		}
	}()
	return nil
}

// pair starts a receiving peer (node-2) and a sending one (node-1),
// their certificates issued by ca unless certs say otherwise.
func pair(t *testing.T, cluster *ca, sender, receiverCfg Config) (*Peers, *Peers, *receiver) {
	t.Helper()
	// Unix socket paths are short: not below the test's temporary directory.
	dir, derr := os.MkdirTemp("", "mp")
	if derr != nil {
		t.Fatal(derr)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	recv := &receiver{t: t, dir: filepath.Join(dir, "target"), outcome: make(chan error, 1)}
	log := logrus.New()
	log.SetOutput(newTestWriter(t))
	// Never the node's own run directory, which Listen clears.
	receiverCfg.RunDir = filepath.Join(dir, "unused")
	target, err := Listen(receiverCfg, recv, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	target.localPath = real
	sender.RunDir = recv.dir // the same names on the sending side
	source, err := Listen(sender, &receiver{t: t, refuse: errors.New("not a receiver")}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { source.Close() })
	return source, target, recv
}

func roundTrip(t *testing.T, path, say string) string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, say)
	c.(*net.UnixConn).CloseWrite()
	got, _ := io.ReadAll(c)
	return string(got)
}

var offer = ports.MigrationOffer{ReceivingPodUID: "recv-uid", SourcePod: "ns/vm", SourcePodUID: "src-uid",
	VM: ports.VMIncoming{Name: "virtlet-0123456789ab-vm", UUID: "9b1f4a52-5a6e-4c3e-9d55-3a4f0c2b1e7d"}}

func TestAnAcceptedOfferCarriesEveryStreamAndTheOutcome(t *testing.T) {
	cluster := newCA(t, t.TempDir(), "cluster")
	source, target, recv := pair(t, cluster, cluster.issue(t, "system:node:node-1"), cluster.issue(t, "system:node:node-2"))
	to := ports.MigrationPeer{Node: "node-2", Address: target.ln.Addr().String()}
	s, err := source.Offer(context.Background(), to, offer, &ports.ProcessIdentity{UID: 4242, GID: 4343})
	if err != nil {
		t.Fatal(err)
	}
	if recv.from[0] != "node-1" {
		t.Errorf("the receiver was told the offer came from %q, want node-1 (its certificate's)", recv.from[0])
	}
	ep := s.Endpoint()
	if ep.DomainXML != "<domain/>" || filepath.Dir(ep.ControlSocket) != filepath.Dir(ep.MemorySocket) {
		t.Errorf("the sending side's endpoint %+v", ep)
	}
	for _, c := range []struct{ path, name string }{{ep.MemorySocket, "memory"}, {ep.DisksSocket, "disks"}} {
		if got := roundTrip(t, c.path, "hello "+c.name); got != c.name+":hello "+c.name {
			t.Errorf("stream %s: got %q", c.name, got)
		}
	}
	// A migration has one memory stream: a second is refused.
	if got := roundTrip(t, ep.MemorySocket, "again"); got != "" {
		t.Errorf("a second memory stream got %q", got)
	}
	// The VM's QEMU, and no one else, reaches the memory and disk
	// sockets; libvirtd (root) the control socket.
	for path, want := range map[string][3]uint32{ep.ControlSocket: {0o600, 0, 0}, ep.MemorySocket: {0o600, 4242, 4343}, ep.DisksSocket: {0o600, 4242, 4343}} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if uint32(st.Mode().Perm()) != want[0] || sys.Uid != want[1] || sys.Gid != want[2] {
			t.Errorf("%s: mode %v, owner %d:%d; want %o, %d:%d", path, st.Mode().Perm(), sys.Uid, sys.Gid, want[0], want[1], want[2])
		}
	}
	s.Finish(errors.New("the copy failed"))
	select {
	case err := <-recv.outcome:
		if err == nil || !strings.Contains(err.Error(), "node-1: the copy failed") {
			t.Errorf("the receiver learnt %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the receiver never learnt the outcome")
	}
	if _, err := os.Stat(filepath.Dir(ep.MemorySocket)); !os.IsNotExist(err) {
		t.Errorf("the sending side's sockets stay after Finish: %v", err)
	}
}

func TestASenderThatGoesAwayFailsTheMigration(t *testing.T) {
	cluster := newCA(t, t.TempDir(), "cluster")
	source, target, recv := pair(t, cluster, cluster.issue(t, "system:node:node-1"), cluster.issue(t, "system:node:node-2"))
	s, err := source.Offer(context.Background(), ports.MigrationPeer{Node: "node-2", Address: target.ln.Addr().String()}, offer, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.(*outgoing).close() // as a daemon killed mid-migration
	select {
	case err := <-recv.outcome:
		if err == nil || !strings.Contains(err.Error(), "went away") {
			t.Errorf("the receiver learnt %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the receiver never learnt the sender went away")
	}
}

func TestOnlyTheNamedNodeOfTheClusterIsHeard(t *testing.T) {
	dir := t.TempDir()
	cluster, other := newCA(t, dir, "cluster"), newCA(t, dir, "other")
	tests := []struct {
		name             string
		sender, receiver Config
		to               string
		want             string
	}{
		{"a sender that is no node", cluster.issue(t, "alice"), cluster.issue(t, "system:node:node-2"), "node-2", "bad certificate"},
		{"a sender of another CA", other.issue(t, "system:node:node-1"), cluster.issue(t, "system:node:node-2"), "node-2", "bad certificate"},
		{"a receiver that is another node", cluster.issue(t, "system:node:node-1"), cluster.issue(t, "system:node:node-3"), "node-2", "not node node-2's"},
		{"a receiver of another CA", cluster.issue(t, "system:node:node-1"), other.issue(t, "system:node:node-2"), "node-2", "certificate signed by unknown authority"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The sending side trusts its own config's CA: the cluster's.
			sender := tc.sender
			sender.CAFile = cluster.file
			source, target, recv := pair(t, cluster, sender, tc.receiver)
			_, err := source.Offer(context.Background(), ports.MigrationPeer{Node: tc.to, Address: target.ln.Addr().String()}, offer, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Offer: %v, want an error saying %q", err, tc.want)
			}
			if len(recv.from) != 0 {
				t.Errorf("the receiver heard an offer from %v", recv.from)
			}
		})
	}
}

func TestARefusedOfferSaysWhy(t *testing.T) {
	cluster := newCA(t, t.TempDir(), "cluster")
	source, target, recv := pair(t, cluster, cluster.issue(t, "system:node:node-1"), cluster.issue(t, "system:node:node-2"))
	to := ports.MigrationPeer{Node: "node-2", Address: target.ln.Addr().String()}
	recv.refuse = errors.New("no VM of pod UID recv-uid waits: not found")
	recv.refuse = errors.Join(recv.refuse, ports.ErrNotFound)
	if _, err := source.Offer(context.Background(), to, offer, nil); !errors.Is(err, ports.ErrNotFound) || !strings.Contains(err.Error(), "no VM of pod UID recv-uid waits") {
		t.Errorf("an offer not yet awaited: %v, want ErrNotFound with the reason", err)
	}
	recv.refuse = errors.New("pod ns/recv receives another VM")
	if _, err := source.Offer(context.Background(), to, offer, nil); errors.Is(err, ports.ErrNotFound) || !strings.Contains(err.Error(), "node-2 refused the VM: pod ns/recv receives another VM") {
		t.Errorf("a refused offer: %v", err)
	}
}

func TestSocketsOutsideTheRunDirectoryAreRefused(t *testing.T) {
	cluster := newCA(t, t.TempDir(), "cluster")
	source, target, _ := pair(t, cluster, cluster.issue(t, "system:node:node-1"), cluster.issue(t, "system:node:node-2"))
	// The receiving side names sockets the sending side would make: only
	// a migration's, in its run directory.
	source.setRunDir(t.TempDir())
	_, err := source.Offer(context.Background(), ports.MigrationPeer{Node: "node-2", Address: target.ln.Addr().String()}, offer, nil)
	if err == nil || !strings.Contains(err.Error(), "names the migration sockets") {
		t.Errorf("Offer with sockets elsewhere: %v", err)
	}
}

// call is a libvirt RPC call of the remote program.
func call(proc int32, args []byte) []byte {
	var w xdrWriter
	for _, v := range []uint32{0, remoteProgram, 1, uint32(proc), messageCall, 7, 0} {
		w.uint32(v)
	}
	b := append(w.Bytes(), args...)
	binary.BigEndian.PutUint32(b, uint32(len(b)))
	return b
}

// migrationArgs are a Prepare3Params call's arguments.
func migrationArgs(params [][2]string, flags uint32) []byte {
	var w xdrWriter
	w.uint32(uint32(len(params)))
	for _, p := range params {
		w.string(p[0])
		w.uint32(paramString)
		w.string(p[1])
	}
	w.opaque([]byte("<qemu-migration/>"))
	w.uint32(flags)
	return w.Bytes()
}

// controlStream opens the sending side's control socket, sends msgs, and
// returns what reached this node's "libvirtd" (the echo, after its
// "control:" prefix) once the stream ends.
func controlStream(t *testing.T, path string, msgs ...[]byte) []byte {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for _, m := range msgs {
		c.Write(m)
	}
	c.(*net.UnixConn).CloseWrite()
	got, _ := io.ReadAll(c)
	return bytes.TrimPrefix(got, []byte("control:"))
}

func TestTheSendingLibvirtdIsHeardOnlyForAMigration(t *testing.T) {
	var open xdrWriter
	open.uint32(1)
	open.string("qemu:///system")
	open.uint32(0)
	fixed := func(m []byte) func(ports.MigrationEndpoint) []byte {
		return func(ports.MigrationEndpoint) []byte { return m }
	}
	prepare := func(flags uint32, params ...[2]string) func(ports.MigrationEndpoint) []byte {
		return func(ep ports.MigrationEndpoint) []byte {
			var ps [][2]string
			for _, p := range params {
				p[1] = strings.NewReplacer("MEM", ep.MemorySocket, "DISKS", ep.DisksSocket).Replace(p[1])
				ps = append(ps, p)
			}
			return call(procMigratePrepare3Params, migrationArgs(ps, flags))
		}
	}
	for name, tc := range map[string]struct {
		msg    func(ports.MigrationEndpoint) []byte
		passed string // what reaches libvirtd; "" for nothing
	}{
		"connect open":     {fixed(call(procConnectOpen, open.Bytes())), "qemu:///system"},
		"supports feature": {fixed(call(procConnectSupportsFeature, []byte{0, 0, 0, 4, 0, 0, 0, 0})), "\x00\x00\x00\x04"},
		"another driver": {fixed(func() []byte {
			var w xdrWriter
			w.uint32(1)
			w.string("lxc:///system")
			w.uint32(0)
			return call(procConnectOpen, w.Bytes())
		}()), ""},
		"define a domain": {fixed(call(10, []byte("<domain/>"))), ""}, // no migration's
		"a reply from the sender": {fixed(func() []byte {
			m := call(procConnectOpen, open.Bytes())
			binary.BigEndian.PutUint32(m[16:], 1)
			return m
		}()), ""},
		"prepare, checked": {prepare(1|2|128, [2]string{"destination_xml", "<domain/>"},
			[2]string{"migrate_uri", "unix://MEM"}, [2]string{"disks_uri", "unix://DISKS"}, [2]string{"migrate_disks", "vda"}), "<checked><domain/></checked>"},
		"prepare, another disk":   {prepare(1|2, [2]string{"destination_xml", "<domain><disk>/etc/shadow</disk></domain>"}), ""},
		"prepare, elsewhere":      {prepare(1|2, [2]string{"migrate_uri", "unix:///etc/x.sock"}), ""},
		"prepare, persisted":      {prepare(1|2|8, [2]string{"migrate_disks", "vda"}), ""},
		"prepare, another name":   {prepare(1|2, [2]string{"destination_name", "virtlet-ffffffffffff-other"}), ""},
		"prepare, persistent XML": {prepare(1|2, [2]string{"persistent_xml", "<domain/>"}), ""},
	} {
		t.Run(name, func(t *testing.T) {
			cluster := newCA(t, t.TempDir(), "cluster")
			source, target, _ := pair(t, cluster, cluster.issue(t, "system:node:node-1"), cluster.issue(t, "system:node:node-2"))
			s, err := source.Offer(context.Background(), ports.MigrationPeer{Node: "node-2", Address: target.ln.Addr().String()}, offer, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Finish(nil)
			got := controlStream(t, s.Endpoint().ControlSocket, tc.msg(s.Endpoint()))
			switch {
			case tc.passed == "" && len(got) != 0:
				t.Errorf("passed on to libvirtd: %q", got)
			case tc.passed != "" && !bytes.Contains(got, []byte(tc.passed)):
				t.Errorf("libvirtd got %q, want it to hold %q", got, tc.passed)
			}
		})
	}
}

// testWriter logs the peers' lines in the test's output until the test
// ends: a connection's handler may log after it (a refused handshake).
type testWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func newTestWriter(t *testing.T) *testWriter {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
	})
	return w
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(b)))
	}
	return len(b), nil
}

// A stream's header and its first bytes may come in one read (one TLS
// record here): the bytes the header's reader took beyond it still reach
// QEMU's socket, first.
func TestAStreamsFirstBytesBesideItsHeaderArrive(t *testing.T) {
	cluster := newCA(t, t.TempDir(), "cluster")
	source, target, _ := pair(t, cluster, cluster.issue(t, "system:node:node-1"), cluster.issue(t, "system:node:node-2"))
	to := ports.MigrationPeer{Node: "node-2", Address: target.ln.Addr().String()}
	s, err := source.Offer(context.Background(), to, offer, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Finish(nil)
	c, err := source.dial(context.Background(), to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	hdr, _ := json.Marshal(header{Session: s.(*outgoing).id, Stream: "memory"})
	if _, err := c.Write(append(append(hdr, '\n'), "QEVM first page"...)); err != nil {
		t.Fatal(err)
	}
	c.CloseWrite()
	got, _ := io.ReadAll(c)
	if string(got) != "memory:QEVM first page" {
		t.Errorf("QEMU's memory socket got %q, want %q", got, "memory:QEVM first page")
	}
}
