package imagesource

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"testing"
)

type failingWriter struct{ after int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.after -= len(p); w.after < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

type failingReader struct {
	r    io.Reader
	left int
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.left <= 0 {
		return 0, errors.New("connection reset")
	}
	if len(p) > f.left {
		p = p[:f.left]
	}
	n, err := f.r.Read(p)
	f.left -= n
	return n, err
}

func TestHashingCopy(t *testing.T) {
	for _, size := range []int{0, 1, 256 << 10, 256<<10 + 1, 5<<20 + 123} {
		data := make([]byte, size)
		rand.Read(data)
		var out bytes.Buffer
		h := sha256.New()
		n, err := hashingCopy(&out, h, bytes.NewReader(data))
		want := sha256.Sum256(data)
		if err != nil || n != int64(size) || !bytes.Equal(out.Bytes(), data) || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("size %d: n %d err %v, copy equal %v", size, n, err, bytes.Equal(out.Bytes(), data))
		}
	}
	data := make([]byte, 3<<20)
	if _, err := hashingCopy(&failingWriter{after: 1 << 20}, sha256.New(), bytes.NewReader(data)); err == nil || err.Error() != "disk full" {
		t.Fatalf("write error: %v", err)
	}
	if n, err := hashingCopy(io.Discard, sha256.New(), &failingReader{r: bytes.NewReader(data), left: 1 << 20}); err == nil || n != 1<<20 {
		t.Fatalf("read error: %d %v", n, err)
	}
}
