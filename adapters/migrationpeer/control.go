package migrationpeer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The sending node's libvirtd drives a peer-to-peer migration over a
// connection to this node's libvirtd. That connection is libvirt's RPC
// protocol, which could ask this node's libvirtd (root) for anything: the
// receiving daemon passes on only the calls of a migration's receiving
// side, one message at a time, and vets the two that carry the domain to
// run (its definition goes through the receiving VM's check, and what is
// passed on is the checked one). Anything else ends the connection, and
// with it the migration.
//
// libvirt's RPC framing (src/rpc/virnetprotocol.x): a message is its
// length (uint32, itself included) and a header of six XDR words:
// program, version, procedure, type, serial, status.

const (
	remoteProgram    = 0x20008086
	keepaliveProgram = 0x6b656570
	messageCall      = 0
	headerLen        = 4 + 6*4
	maxMessage       = 32 << 20 // libvirt's own limit
)

// The remote program's procedures a migration's receiving side serves
// (src/remote/remote_protocol.x).
const (
	procConnectOpen             = 1
	procConnectClose            = 2
	procConnectSupportsFeature  = 60
	procAuthList                = 66
	procMigratePrepare3Params   = 303
	procMigrateFinish3Params    = 306
	procRegisterCloseCallback   = 360
	procUnregisterCloseCallback = 361
)

// Migration flags (virDomainMigrateFlags) a receiving side accepts: a
// live, peer-to-peer migration that may copy disks. PERSIST_DEST (the
// sender would define the domain here), OFFLINE, TUNNELLED and the rest
// are refused.
const allowedFlags = 1 | 2 | 128 | 256 | 4096 // LIVE, PEER2PEER, NON_SHARED_INC, CHANGE_PROTECTION, ABORT_ON_ERROR

// paramString is a typed parameter's type string (virTypedParameterType):
// a migration here takes only those.
const paramString = 7

// filterControl copies the sending libvirtd's messages from peer to this
// node's libvirtd (local), vetted; the replies go back as they are.
func (p *Peers) filterControl(peer, local net.Conn, s *session) error {
	replies := make(chan struct{})
	go func() {
		io.Copy(peer, local)
		if cw, ok := peer.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		close(replies)
	}()
	err := s.copyCalls(peer, local)
	if cw, ok := local.(interface{ CloseWrite() error }); ok && err == nil {
		cw.CloseWrite() // the sender is done: libvirtd's last replies still go back
	} else {
		local.Close()
	}
	<-replies
	local.Close()
	peer.Close()
	return err
}

// copyCalls passes the sender's messages on, vetted, until it ends.
func (s *session) copyCalls(peer, local net.Conn) error {
	head := make([]byte, 4)
	for {
		if _, err := io.ReadFull(peer, head); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n := binary.BigEndian.Uint32(head)
		if n < headerLen || n > maxMessage {
			return fmt.Errorf("a libvirt message of %d bytes", n)
		}
		msg := make([]byte, n)
		copy(msg, head)
		if _, err := io.ReadFull(peer, msg[4:]); err != nil {
			return err
		}
		out, err := s.vet(msg)
		if err != nil {
			return err
		}
		if _, err := local.Write(out); err != nil {
			return err
		}
	}
}

// vet passes a message on, rewritten where it carries a domain.
func (s *session) vet(msg []byte) ([]byte, error) {
	be := binary.BigEndian
	prog, proc, typ := be.Uint32(msg[4:]), int32(be.Uint32(msg[12:])), int32(be.Uint32(msg[16:]))
	switch {
	case prog == keepaliveProgram:
		return msg, nil
	case prog != remoteProgram || typ != messageCall:
		return nil, fmt.Errorf("a libvirt message of program %#x, type %d: not a call of a migration", prog, typ)
	}
	switch proc {
	case procConnectOpen:
		return msg, s.checkOpen(msg[headerLen:])
	case procConnectClose, procConnectSupportsFeature, procAuthList, procRegisterCloseCallback, procUnregisterCloseCallback:
		return msg, nil
	case procMigratePrepare3Params, procMigrateFinish3Params:
		args, err := s.vetMigrationCall(msg[headerLen:], proc == procMigrateFinish3Params)
		if err != nil {
			return nil, err
		}
		out := make([]byte, headerLen, headerLen+len(args))
		copy(out, msg[:headerLen])
		out = append(out, args...)
		be.PutUint32(out, uint32(len(out)))
		return out, nil
	default:
		return nil, fmt.Errorf("libvirt procedure %d is not one of a migration's receiving side", proc)
	}
}

// checkOpen lets the sender open the QEMU driver only.
func (s *session) checkOpen(args []byte) error {
	d := xdr{b: args}
	present := d.uint32()
	name := ""
	if present != 0 {
		name = d.string()
	}
	if d.err != nil || (name != "qemu:///system" && name != "") {
		return fmt.Errorf("a connection to %q: only qemu:///system serves a migration (%v)", name, d.err)
	}
	return nil
}

// vetMigrationCall checks a Prepare3Params or Finish3Params call's
// arguments and returns them with the checked domain definition: its
// parameters (only a migration's, each as this session wants it), the
// cookie as it came, the flags (none that would define anything here).
func (s *session) vetMigrationCall(args []byte, finish bool) ([]byte, error) {
	d := xdr{b: args}
	count := d.uint32()
	if count > 64 {
		return nil, fmt.Errorf("%d migration parameters", count)
	}
	var out xdrWriter
	out.uint32(count)
	for i := uint32(0); i < count && d.err == nil; i++ {
		field := d.string()
		typ := d.uint32()
		out.string(field)
		out.uint32(typ)
		if typ != paramString {
			return nil, fmt.Errorf("migration parameter %q of type %d: not one a migration here takes", field, typ)
		}
		v := d.string()
		switch field {
		case "destination_xml":
			checked, err := s.in.Check(context.Background(), v)
			if err != nil {
				return nil, err
			}
			v = checked
		case "destination_name":
			if v != s.in.Domain {
				return nil, fmt.Errorf("the migration names its domain %q here, not %q", v, s.in.Domain)
			}
		case "migrate_uri":
			if v != "unix://"+s.in.Endpoint.MemorySocket {
				return nil, fmt.Errorf("the migration's memory would arrive at %q", v)
			}
		case "disks_uri":
			if v != "unix://"+s.in.Endpoint.DisksSocket {
				return nil, fmt.Errorf("the migration's disks would arrive at %q", v)
			}
		case "migrate_disks":
		default:
			return nil, fmt.Errorf("migration parameter %q: not one a migration here takes", field)
		}
		out.string(v)
	}
	cookie := d.opaque()
	flags := d.uint32()
	var cancelled uint32
	if finish {
		cancelled = d.uint32()
	}
	if d.err != nil {
		return nil, fmt.Errorf("a malformed migration call: %w", d.err)
	}
	if flags&^allowedFlags != 0 {
		return nil, fmt.Errorf("migration flags %#x: only a live peer-to-peer migration (flags %#x) is received here", flags, allowedFlags)
	}
	out.opaque(cookie)
	out.uint32(flags)
	if finish {
		out.uint32(cancelled)
	}
	return out.Bytes(), nil
}

// xdr reads XDR items, remembering the first error.
type xdr struct {
	b   []byte
	err error
}

func (d *xdr) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = io.ErrUnexpectedEOF
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *xdr) uint32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *xdr) opaque() []byte {
	n := int(d.uint32())
	v := d.take(n)
	d.take((4 - n%4) % 4)
	return v
}

func (d *xdr) string() string { return string(d.opaque()) }

// xdrWriter writes XDR items.
type xdrWriter struct{ bytes.Buffer }

func (w *xdrWriter) uint32(v uint32) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	w.Write(b[:])
}

func (w *xdrWriter) opaque(v []byte) {
	w.uint32(uint32(len(v)))
	w.Write(v)
	w.Write(make([]byte, (4-len(v)%4)%4))
}

func (w *xdrWriter) string(v string) { w.opaque([]byte(v)) }

// sessionLife bounds how long an accepted offer's streams may run.
const sessionLife = 15 * time.Minute
