package rootfsheader

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// A header reads back as written; what is not one (blank, foreign, cut
// short, without an image) is not taken for one.
func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Image: "sha256:ab", Name: "virtlet.cloud/x", VirtualSize: 3 << 30, DataOffset: DataOffset,
		Written: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	b, err := h.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != Size || !bytes.HasPrefix(b, []byte(Magic+`{"image":"sha256:ab","name":"virtlet.cloud/x"`)) {
		t.Fatalf("header %q", b[:128])
	}
	got, ok := Read(append(b, make([]byte, ProbeSize-Size)...))
	if !ok || *got != h {
		t.Fatalf("read back %+v %v", got, ok)
	}
	for name, first := range map[string][]byte{
		"blank":      make([]byte, ProbeSize),
		"foreign":    []byte("\x7fELF and more"),
		"cut short":  b[:len(Magic)+10],
		"no image":   []byte(Magic + `{"dataOffset":1048576}` + "\n"),
		"bad offset": []byte(Magic + `{"image":"sha256:ab","dataOffset":0}` + "\n"),
	} {
		if h, ok := Read(first); ok {
			t.Errorf("%s read as %+v", name, h)
		}
	}
	if _, err := (Header{Image: "sha256:" + strings.Repeat("a", Size)}).Bytes(); err == nil {
		t.Error("an oversized header was encoded")
	}
}
