package nodeinspect

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/virtlet/virtlet/ports"
)

// report collects a NodeReport's files within its bounds.
type report struct {
	files           []ports.NodeFile
	problems        []string
	maxFile, maxAll int
	total           int
}

func (r *report) problem(err error) {
	r.problems = append(r.problems, err.Error())
}

// add keeps f unless the report would pass its bound.
func (r *report) add(f ports.NodeFile) {
	if r.maxAll > 0 && r.total+len(f.Data) > r.maxAll {
		r.problem(fmt.Errorf("%s (%d bytes) left out: the report reached its bound of %d bytes", f.Name, len(f.Data), r.maxAll))
		return
	}
	r.total += len(f.Data)
	r.files = append(r.files, f)
}

// addText adds a listing; a longer one than the bound keeps its start.
func (r *report) addText(name, text string) {
	f := ports.NodeFile{Name: name, Data: []byte(text)}
	if r.maxFile > 0 && len(f.Data) > r.maxFile {
		f.Size, f.Truncated = int64(len(f.Data)), true
		head := f.Data[:r.maxFile]
		if i := bytes.LastIndexByte(head, '\n'); i >= 0 {
			head = head[:i+1]
		}
		f.Data = append(head, fmt.Sprintf("[cut by virtlet: the last %d of %d bytes are left out]\n", int(f.Size)-len(head), f.Size)...)
	}
	r.add(f)
}

// addLog adds the end of a log file, its secrets redacted. A missing
// optional file (libvirtd may log to the journal) is no problem.
func (r *report) addLog(name, path string, optional bool) {
	data, size, err := readTail(path, r.maxFile)
	switch {
	case optional && errors.Is(err, fs.ErrNotExist):
		return
	case err != nil:
		r.problem(fmt.Errorf("%s: %w", name, err))
		return
	}
	f := ports.NodeFile{Name: name, Size: size}
	if int64(len(data)) < size {
		f.Truncated = true
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:] // a partial first line would confuse the reader and the redaction
		}
		data = append([]byte(fmt.Sprintf("[cut by virtlet: the first %d of %d bytes are left out]\n", size-int64(len(data)), size)), data...)
	}
	f.Data = []byte(redact(string(data)))
	r.add(f)
}

// readTail reads at most max bytes from the end of a regular file, never
// following a symbolic link. It returns them and the file's size.
func readTail(path string, max int) ([]byte, int64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("%s is not a regular file (%s)", path, st.Mode().Type())
	}
	size, off := st.Size(), int64(0)
	if max > 0 && size > int64(max) {
		off = size - int64(max)
	}
	buf := make([]byte, size-off)
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) { // EOF: the file shrank meanwhile (rotated)
		return nil, 0, fmt.Errorf("read %s: %w", path, err)
	}
	return buf[:n], size, nil
}
