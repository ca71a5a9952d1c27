// Package rootfsheader is the header that starts a persistent root file
// system's disk (a block device of the raw plugin, an RBD image of the ceph
// plugin): it names the image the disk holds, so that a later pod finds it
// written, and the VM boots the disk from DataOffset on.
//
// The header is readable text in the disk's first 4 KiB:
//
//	VIRTLET-PERSISTENT-ROOTFS v1
//	{"image":"sha256:…","name":"virtlet.cloud/…","virtualSize":…,"dataOffset":1048576,"written":"…"}
//
// A writer clears the header before it writes the image and writes the
// header last, so that an interrupted write is never taken for a finished
// one.
package rootfsheader

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

const (
	// Magic starts a header.
	Magic = "VIRTLET-PERSISTENT-ROOTFS v1\n"
	// Size is the header's length: what a writer clears first.
	Size = 4096
	// DataOffset is where the image starts: 1 MiB keeps the guest's disk
	// aligned for any block size.
	DataOffset = 1 << 20
	// ProbeSize is how much of a disk must be zero for it to count as
	// blank (never written).
	ProbeSize = 1 << 20
)

// Header is what a persistent root's disk holds.
type Header struct {
	Image       string    `json:"image"`
	Name        string    `json:"name,omitempty"`
	VirtualSize int64     `json:"virtualSize"`
	DataOffset  int64     `json:"dataOffset"`
	Written     time.Time `json:"written"`
}

// Read returns the header that first (the disk's first bytes) starts
// with, if it holds one.
func Read(first []byte) (*Header, bool) {
	if !bytes.HasPrefix(first, []byte(Magic)) {
		return nil, false
	}
	rest := first[len(Magic):min(len(first), Size)]
	if i := bytes.IndexByte(rest, '\n'); i >= 0 {
		rest = rest[:i]
	}
	var h Header
	if err := json.Unmarshal(rest, &h); err != nil || h.Image == "" || h.DataOffset <= 0 {
		return nil, false
	}
	return &h, true
}

// Bytes is the header as written: Size bytes.
func (h Header) Bytes() ([]byte, error) {
	j, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	b := make([]byte, Size)
	n := copy(b, Magic)
	if n+len(j)+1 > Size {
		return nil, fmt.Errorf("persistent root header too long")
	}
	copy(b[n:], j)
	b[n+len(j)] = '\n'
	return b, nil
}

// Zero says whether b holds zeros only (a blank disk's first bytes).
func Zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// NameOr is an image's name for messages, its digest when it has none.
func NameOr(name, digest string) string {
	if name != "" {
		return name
	}
	return digest
}
