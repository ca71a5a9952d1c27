// Package crilog writes kubelet's CRI container log format:
//
//	<RFC3339Nano timestamp> <stream> <tag> <content>\n
//
// where tag is F for a full line and P for part of a longer line. kubelet
// reads these files for `kubectl logs` (and follows them for `logs -f`).
package crilog

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// MaxLine is the longest line written as one record; longer lines are split
// into partial (P) records, as container runtimes do.
const MaxLine = 16 * 1024

// Writer appends console output to a CRI log file. It is safe for
// concurrent use.
type Writer struct {
	mu     sync.Mutex
	path   string
	stream string
	f      *os.File
	buf    []byte // an unfinished line
	now    func() time.Time
}

// Open opens (creating if needed) the log file at path for appending.
func Open(path, stream string) (*Writer, error) {
	w := &Writer{path: path, stream: stream, now: time.Now}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Writer) open() error {
	if err := os.MkdirAll(filepath.Dir(w.path), 0o755); err != nil {
		return fmt.Errorf("create log directory: %w", err)
	}
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("open log %s: %w", w.path, err)
	}
	w.f = f
	return nil
}

// Write records every complete line of p; a trailing incomplete line waits
// for more data (or Flush).
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := bytes.TrimSuffix(w.buf[:i], []byte("\r"))
		if err := w.record(line, true); err != nil {
			return 0, err
		}
		w.buf = w.buf[i+1:]
	}
	for len(w.buf) >= MaxLine {
		if err := w.record(w.buf[:MaxLine], false); err != nil {
			return 0, err
		}
		w.buf = w.buf[MaxLine:]
	}
	return len(p), nil
}

// Pending is how many bytes of an incomplete line wait for more data:
// written to the Writer, not yet to the file.
func (w *Writer) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.buf)
}

// Flush writes a pending incomplete line as a partial record, so that a
// prompt without a newline (a login prompt) shows up in the log.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) == 0 {
		return nil
	}
	err := w.record(w.buf, false)
	w.buf = w.buf[:0]
	return err
}

func (w *Writer) record(line []byte, full bool) error {
	for len(line) > MaxLine {
		if err := w.emit(line[:MaxLine], false); err != nil {
			return err
		}
		line = line[MaxLine:]
	}
	return w.emit(line, full)
}

func (w *Writer) emit(content []byte, full bool) error {
	tag := "P"
	if full {
		tag = "F"
	}
	rec := make([]byte, 0, len(content)+64)
	rec = w.now().UTC().AppendFormat(rec, time.RFC3339Nano)
	rec = append(rec, ' ')
	rec = append(rec, w.stream...)
	rec = append(rec, ' ')
	rec = append(rec, tag...)
	rec = append(rec, ' ')
	rec = append(rec, content...)
	rec = append(rec, '\n')
	if _, err := w.f.Write(rec); err != nil {
		return fmt.Errorf("write log %s: %w", w.path, err)
	}
	return nil
}

// Reopen closes and reopens the file, after kubelet rotated it.
func (w *Writer) Reopen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f != nil {
		w.f.Close()
	}
	return w.open()
}

// Close flushes and closes the file.
func (w *Writer) Close() error {
	if err := w.Flush(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}
