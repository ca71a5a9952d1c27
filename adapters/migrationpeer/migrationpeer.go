// Package migrationpeer carries live migrations between the daemons of
// two nodes (ports.MigrationPeers, and the server that answers it for
// ports.MigrationReceiver). The daemons authenticate each other with
// mutual TLS: node certificates of the cluster's CA, whose subject is
// system:node:<name> (kubelet's client certificates are such). Every
// stream of a migration is one TLS connection: the offer (which stays
// open until the sender reports the outcome), libvirtd's control
// connection, QEMU's memory stream and its disk (NBD) stream. On the
// sending node they start at unix sockets this package serves; on the
// receiving node they end at libvirtd's socket and at the sockets the
// incoming QEMU listens on. No hypervisor listens on the network.
package migrationpeer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/ports"
)

// nodePrefix begins the subject of a node's certificate.
const nodePrefix = "system:node:"

// Config is a daemon's migration endpoint.
type Config struct {
	Address  string // host:port to listen on (":10262": every address)
	CertFile string // the node's certificate (subject system:node:<node>), read at each handshake (it may rotate)
	KeyFile  string
	CAFile   string // the cluster's CA, which signed every node's
	// RunDir is where migrations' sockets are (default
	// ports.MigrationRunDir); what a crashed daemon left there goes.
	RunDir string
}

// Peers is both ends: it serves the receiving side and dials the sending
// side's offers.
type Peers struct {
	log      logrus.FieldLogger
	port     string
	cert     func() (*tls.Certificate, error)
	roots    *x509.CertPool
	receiver ports.MigrationReceiver
	ln       net.Listener

	mu       sync.Mutex
	sessions map[string]*session // the receiving side's, by ID

	// runDir is where the sending side makes a migration's sockets
	// (ports.MigrationRunDir), and socketPath what it accepts there;
	// localPath maps an endpoint's path to the receiving side's own (the
	// same: each node has its own run directory). Tests change them, both
	// ends being on one file system.
	runDir     string
	socketPath *regexp.Regexp
	localPath  func(string) string
}

// session is an accepted offer, on the receiving side.
type session struct {
	node    string
	in      ports.IncomingMigration
	expires time.Time
	streams map[string]int // opened, by kind
}

// maxStreams is how many streams of each kind a migration opens: one
// libvirtd connection, one memory stream, an NBD connection per disk.
var maxStreams = map[string]int{"control": 1, "memory": 1, "disks": 4}

// header opens every connection.
type header struct {
	Offer   *ports.MigrationOffer `json:"offer,omitempty"`
	Session string                `json:"session,omitempty"`
	Stream  string                `json:"stream,omitempty"` // control, memory or disks
}

// reply answers an offer, and result ends it.
type reply struct {
	Session  string                   `json:"session,omitempty"`
	Endpoint *ports.MigrationEndpoint `json:"endpoint,omitempty"`
	Error    string                   `json:"error,omitempty"`
	NotFound bool                     `json:"notFound,omitempty"`
}

type result struct {
	Error string `json:"error,omitempty"`
}

// Listen loads the node's credentials and serves migrations to receiver.
func Listen(cfg Config, receiver ports.MigrationReceiver, log logrus.FieldLogger) (*Peers, error) {
	// Read at each handshake: kubelet's client certificate rotates.
	cert := func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("migration endpoint: the node's certificate: %w", err)
		}
		return &c, nil
	}
	if _, err := cert(); err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("migration endpoint: the cluster CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("migration endpoint: %s holds no PEM certificate", cfg.CAFile)
	}
	_, port, err := net.SplitHostPort(cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("migration endpoint address %q: %w", cfg.Address, err)
	}
	p := &Peers{log: log, port: port, cert: cert, roots: roots, receiver: receiver, sessions: map[string]*session{}}
	if cfg.RunDir == "" {
		cfg.RunDir = ports.MigrationRunDir
	}
	p.setRunDir(cfg.RunDir)
	// No migration outlives its daemon: a crashed one's sockets go.
	if err := os.RemoveAll(cfg.RunDir); err != nil {
		return nil, fmt.Errorf("migration endpoint: %w", err)
	}
	p.localPath = func(path string) string { return path }
	ln, err := tls.Listen("tcp", cfg.Address, &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert() },
		ClientAuth:     tls.RequireAnyClientCert, VerifyConnection: p.verify(""),
	})
	if err != nil {
		return nil, fmt.Errorf("migration endpoint: %w", err)
	}
	p.ln = ln
	go p.serve()
	log.WithField("address", ln.Addr().String()).Info("migration endpoint listening (mutual TLS, node certificates)")
	return p, nil
}

// Close stops serving.
func (p *Peers) Close() error { return p.ln.Close() }

// verify checks the peer's certificate against the cluster CA and, when
// node is set, that it is that node's.
func (p *Peers) verify(node string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer sent no certificate")
		}
		leaf := cs.PeerCertificates[0]
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		// Node certificates are client certificates: any key usage.
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: p.roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return fmt.Errorf("the peer's certificate: %w", err)
		}
		cn := leaf.Subject.CommonName
		switch {
		case !strings.HasPrefix(cn, nodePrefix) || len(cn) == len(nodePrefix) || !slices.Contains(leaf.Subject.Organization, "system:nodes"):
			return fmt.Errorf("the peer's certificate is %q's (organisations %v), not a node's (%s<node> of system:nodes)", cn, leaf.Subject.Organization, nodePrefix)
		case node != "" && cn != nodePrefix+node:
			return fmt.Errorf("the peer's certificate is %q's, not node %s's", cn, node)
		}
		return nil
	}
}

func peerNode(c *tls.Conn) string {
	return strings.TrimPrefix(c.ConnectionState().PeerCertificates[0].Subject.CommonName, nodePrefix)
}

func (p *Peers) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.log.WithError(err).Warn("migration endpoint: accept")
			}
			return
		}
		go p.handle(c.(*tls.Conn))
	}
}

// handle serves one connection: an offer, or a stream of an accepted one.
func (p *Peers) handle(c *tls.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := c.Handshake(); err != nil {
		p.log.WithError(err).WithField("peer", c.RemoteAddr().String()).Warn("migration endpoint: refused a connection")
		return
	}
	node := peerNode(c)
	r := bufio.NewReader(io.LimitReader(c, 64<<10))
	line, err := r.ReadBytes('\n')
	if err != nil {
		return
	}
	var h header
	if err := json.Unmarshal(line, &h); err != nil {
		return
	}
	switch {
	case h.Offer != nil:
		p.offered(c, r, node, *h.Offer)
	case h.Session != "":
		// The header's reader may have read past the header: those bytes
		// are the stream's first.
		ahead, _ := r.Peek(r.Buffered())
		p.stream(readAhead{c, io.MultiReader(bytes.NewReader(bytes.Clone(ahead)), c)}, node, h)
	}
}

// readAhead is a connection whose first bytes were read from it already.
type readAhead struct {
	*tls.Conn
	r io.Reader
}

func (c readAhead) Read(b []byte) (int, error) { return c.r.Read(b) }

// offered answers an offer and, once accepted, waits on the same
// connection for the outcome: its loss is a failure.
func (p *Peers) offered(c *tls.Conn, r *bufio.Reader, node string, offer ports.MigrationOffer) {
	log := p.log.WithFields(logrus.Fields{"from": node, "pod": offer.SourcePod})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	in, err := p.receiver.ReceiveMigration(ctx, node, offer)
	cancel()
	enc := json.NewEncoder(c)
	if err != nil {
		enc.Encode(reply{Error: err.Error(), NotFound: errors.Is(err, ports.ErrNotFound)})
		return
	}
	ep, done := in.Endpoint, in.Done
	id := randomID()
	p.mu.Lock()
	p.sessions[id] = &session{node: node, in: in, expires: time.Now().Add(sessionLife), streams: map[string]int{}}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.sessions, id)
		p.mu.Unlock()
	}()
	// The sender needs the definition, not the local libvirtd socket.
	theirs := ep
	theirs.ControlSocket = ""
	if err := enc.Encode(reply{Session: id, Endpoint: &theirs}); err != nil {
		done(fmt.Errorf("answer node %s's offer: %w", node, err))
		return
	}
	c.SetDeadline(time.Now().Add(sessionLife))
	line, err := r.ReadBytes('\n')
	var res result
	switch {
	case err != nil:
		done(fmt.Errorf("node %s's daemon went away during the migration: %v", node, err))
	case json.Unmarshal(line, &res) != nil:
		done(fmt.Errorf("node %s's daemon sent a malformed outcome", node))
	case res.Error != "":
		done(fmt.Errorf("node %s: %s", node, res.Error))
	default:
		done(nil)
	}
	log.Info("live migration's offer ended")
}

// stream joins one of an accepted migration's streams to its socket here.
func (p *Peers) stream(c net.Conn, node string, h header) {
	log := p.log.WithFields(logrus.Fields{"from": node, "stream": h.Stream})
	p.mu.Lock()
	s := p.sessions[h.Session]
	ok := s != nil && s.node == node && s.streams[h.Stream] < maxStreams[h.Stream] && time.Now().Before(s.expires)
	if ok {
		s.streams[h.Stream]++
	}
	p.mu.Unlock()
	if !ok {
		log.Warn("migration endpoint: refused a stream (no migration of that node's, or more streams than a migration opens)")
		return
	}
	var path string
	switch h.Stream {
	case "control":
		path = s.in.Endpoint.ControlSocket
	case "memory":
		path = s.in.Endpoint.MemorySocket
	case "disks":
		path = s.in.Endpoint.DisksSocket
	}
	local, err := net.DialTimeout("unix", p.localPath(path), 10*time.Second)
	if err != nil {
		log.WithError(err).Warn("migration endpoint: reach the local end")
		return
	}
	// No stream outlives its migration's session.
	c.SetDeadline(s.expires)
	local.SetDeadline(s.expires)
	if h.Stream != "control" {
		pipe(c, local)
		return
	}
	if err := p.filterControl(c, local, s); err != nil {
		log.WithError(err).Warn("migration endpoint: the sending node's libvirtd asked for more than a migration: cut off")
	}
}

// pipe copies both ways until either side ends, then closes both.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

func randomID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// dial opens a TLS connection to to's daemon.
func (p *Peers) dial(ctx context.Context, to ports.MigrationPeer) (*tls.Conn, error) {
	addr := to.Address
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(addr, p.port) // every node's daemon listens on the same port
	}
	d := tls.Dialer{Config: &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return p.cert() },
		InsecureSkipVerify:   true, // verified below: node certificates name no address
		VerifyConnection:     p.verify(to.Node),
	}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("reach node %s's daemon at %s: %w: %w", to.Node, addr, err, ports.ErrUnavailable)
	}
	return c.(*tls.Conn), nil
}

// setRunDir sets where the sending side's sockets go: the receiving
// daemon names them, and only a migration's sockets there (one directory
// named by 32 hex digits) are accepted, which are made here under the
// same names.
func (p *Peers) setRunDir(dir string) {
	p.runDir = dir
	p.socketPath = regexp.MustCompile(`^` + regexp.QuoteMeta(dir) + `/[0-9a-f]{32}/(memory|disks)\.sock$`)
}

// Offer offers the VM to to's daemon and, once accepted, serves the
// migration's local sockets, each connection to which becomes a stream to
// the receiving node.
func (p *Peers) Offer(ctx context.Context, to ports.MigrationPeer, offer ports.MigrationOffer, vmUser *ports.ProcessIdentity) (ports.MigrationSession, error) {
	c, err := p.dial(ctx, to)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	if d, has := ctx.Deadline(); has {
		c.SetDeadline(d)
	}
	if err := json.NewEncoder(c).Encode(header{Offer: &offer}); err != nil {
		return nil, fmt.Errorf("offer the VM to node %s: %w", to.Node, err)
	}
	r := bufio.NewReader(io.LimitReader(c, 1<<20))
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("node %s's answer: %w", to.Node, err)
	}
	var rep reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, fmt.Errorf("node %s's answer: %w", to.Node, err)
	}
	switch {
	case rep.NotFound:
		return nil, fmt.Errorf("node %s: %s: %w", to.Node, rep.Error, ports.ErrNotFound)
	case rep.Error != "":
		return nil, fmt.Errorf("node %s refused the VM: %s: %w", to.Node, rep.Error, ports.ErrFailedPrecondition)
	case rep.Endpoint == nil || rep.Session == "":
		return nil, fmt.Errorf("node %s's answer holds no endpoint: %w", to.Node, ports.ErrFailedPrecondition)
	}
	theirs := *rep.Endpoint
	if !p.socketPath.MatchString(theirs.MemorySocket) || !p.socketPath.MatchString(theirs.DisksSocket) ||
		filepath.Dir(theirs.MemorySocket) != filepath.Dir(theirs.DisksSocket) {
		return nil, fmt.Errorf("node %s names the migration sockets %s and %s: %w", to.Node, theirs.MemorySocket, theirs.DisksSocket, ports.ErrFailedPrecondition)
	}
	c.SetDeadline(time.Time{})
	s := &outgoing{p: p, to: to, id: rep.Session, offer: c, dir: filepath.Dir(theirs.MemorySocket), vmUser: vmUser}
	if err := s.listen(theirs); err != nil {
		s.close()
		return nil, err
	}
	ok = true
	return s, nil
}

// outgoing is an accepted offer on the sending side.
type outgoing struct {
	p      *Peers
	to     ports.MigrationPeer
	id     string
	offer  *tls.Conn
	dir    string
	made   bool // dir is this session's
	vmUser *ports.ProcessIdentity
	ep     ports.MigrationEndpoint
	lns    []net.Listener
	once   sync.Once
}

// listen serves this node's ends of the streams: the memory and disk
// sockets under the receiving node's names, which this node's QEMU
// connects to as the VM's user (theirs alone; without VM users, anyone's
// who can name the unlisted directory), and a control socket for libvirtd
// (root's alone).
func (s *outgoing) listen(theirs ports.MigrationEndpoint) error {
	if err := os.MkdirAll(s.p.runDir, 0o711); err != nil {
		return err
	}
	if err := os.Mkdir(s.dir, 0o711); err != nil {
		return fmt.Errorf("the migration's sockets: %w", err)
	}
	s.made = true
	s.ep = ports.MigrationEndpoint{DomainXML: theirs.DomainXML, ControlSocket: filepath.Join(s.dir, "control.sock"),
		MemorySocket: theirs.MemorySocket, DisksSocket: theirs.DisksSocket}
	for _, l := range []struct {
		path, stream string
		mode         os.FileMode
	}{{s.ep.ControlSocket, "control", 0o600}, {s.ep.MemorySocket, "memory", 0o666}, {s.ep.DisksSocket, "disks", 0o666}} {
		ln, err := net.Listen("unix", l.path)
		if err != nil {
			return err
		}
		s.lns = append(s.lns, ln)
		mode := l.mode
		if u := s.vmUser; u != nil && l.stream != "control" {
			if err := os.Chown(l.path, u.UID, u.GID); err != nil {
				return err
			}
			mode = 0o600
		}
		if err := os.Chmod(l.path, mode); err != nil {
			return err
		}
		go s.accept(ln, l.stream)
	}
	return nil
}

func (s *outgoing) accept(ln net.Listener, stream string) {
	for {
		local, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			remote, err := s.p.dial(ctx, s.to)
			cancel()
			if err != nil {
				s.p.log.WithError(err).WithField("stream", stream).Warn("live migration: open a stream")
				local.Close()
				return
			}
			if err := json.NewEncoder(remote).Encode(header{Session: s.id, Stream: stream}); err != nil {
				local.Close()
				remote.Close()
				return
			}
			pipe(remote, local)
		}()
	}
}

func (s *outgoing) Endpoint() ports.MigrationEndpoint { return s.ep }

// Finish reports the outcome to the receiving daemon and ends the
// session's sockets.
func (s *outgoing) Finish(err error) {
	s.once.Do(func() {
		res := result{}
		if err != nil {
			res.Error = err.Error()
		}
		s.offer.SetWriteDeadline(time.Now().Add(10 * time.Second))
		json.NewEncoder(s.offer).Encode(res)
		s.close()
	})
}

func (s *outgoing) close() {
	s.offer.Close()
	for _, ln := range s.lns {
		ln.Close()
	}
	if s.made {
		os.RemoveAll(s.dir)
	}
}

var _ ports.MigrationPeers = (*Peers)(nil)
