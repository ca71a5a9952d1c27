package libvirt

import (
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/virtlet/virtlet/adapters/crilog"
)

// tailer streams a VM's serial console, which virtlogd writes raw to a file
// (so no output is lost while the plugin or the daemon restarts), into the
// container's CRI log for kubectl logs. It resumes at a saved offset, and
// follows virtlogd's rotation of the raw file.
//
// What reached the CRI log is noted in a position file beside the raw
// log after every write (positionFile: not synced, so that it costs a
// write of 16 bytes; a killed plugin's writes stay in the page cache): a
// restarted plugin resumes exactly there, writing no line twice and
// losing none. The record's position, saved once a second and synced, is
// the fallback after a power loss.
type tailer struct {
	raw    string
	out    *crilog.Writer // nil when the pod has no log path
	pos    *os.File       // the position file; nil without out
	log    logrus.FieldLogger
	save   func(offset int64, inode uint64) // persists the position
	stop   chan struct{}
	done   chan struct{}
	offset int64
	inode  uint64
	// wake is signalled by the shared inotify notifier when the raw log
	// changes; nil when there is none and the tailer polls.
	wake   chan struct{}
	cancel func()
	// The position last saved: an idle VM writes nothing.
	savedOffset int64
	savedInode  uint64
}

const (
	tailPoll      = 25 * time.Millisecond  // without inotify
	tailSafety    = 2 * time.Second        // with inotify: a missed event costs at most this
	partialAfter  = 300 * time.Millisecond // a prompt without newline shows up after this
	saveEvery     = time.Second
	readChunkSize = 64 * 1024
)

func startTailer(raw, criPath string, offset int64, inode uint64, save func(int64, uint64), log logrus.FieldLogger) (*tailer, error) {
	t := &tailer{raw: raw, log: log, save: save, stop: make(chan struct{}), done: make(chan struct{}), offset: offset, inode: inode,
		savedOffset: offset, savedInode: inode}
	if criPath != "" {
		w, err := crilog.Open(criPath, "stdout")
		if err != nil {
			return nil, err
		}
		t.out = w
		pos, err := os.OpenFile(positionFile(raw), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			w.Close()
			return nil, err
		}
		t.pos = pos
		var b [16]byte
		if n, _ := pos.ReadAt(b[:], 0); n == len(b) {
			t.offset, t.inode = int64(binary.LittleEndian.Uint64(b[:8])), binary.LittleEndian.Uint64(b[8:])
		}
	}
	if n := sharedNotifier(); n != nil {
		wake := make(chan struct{}, 1)
		if cancel, err := n.subscribe(raw, wake); err == nil {
			t.wake, t.cancel = wake, cancel
		} else {
			log.WithError(err).Warn("watch the console log; polling it instead")
		}
	}
	go t.run()
	return t, nil
}

func inodeOf(info os.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

func (t *tailer) run() {
	defer close(t.done)
	var f *os.File
	defer func() {
		if t.cancel != nil {
			t.cancel()
		}
		if f != nil {
			f.Close()
		}
		if t.out != nil {
			t.out.Close() // flushes a pending partial line
			t.mark()
			t.pos.Close()
		}
		t.saveIfMoved()
	}()
	buf := make([]byte, readChunkSize)
	lastData, lastSave := time.Now(), time.Now()
	pending := false // output without a trailing newline not yet flushed
	stopping := false
	for {
		if f == nil {
			var err error
			if f, err = t.open(); err != nil {
				if stopping {
					return
				}
				if !errors.Is(err, fs.ErrNotExist) {
					t.log.WithError(err).Warn("open console log")
				}
				if t.wait(0) {
					stopping = true
				}
				continue
			}
		}
		n, err := f.Read(buf)
		if n > 0 {
			t.offset += int64(n)
			if t.out != nil {
				if _, werr := t.out.Write(buf[:n]); werr != nil {
					t.log.WithError(werr).Warn("write CRI log")
				}
				t.mark()
			}
			lastData, pending = time.Now(), buf[n-1] != '\n'
			continue
		}
		if err != nil && err != io.EOF {
			t.log.WithError(err).Warn("read console log")
		}
		// At the end of the file: a rotated file is finished, switch over.
		if info, err := os.Stat(t.raw); err == nil && inodeOf(info) != t.inode {
			f.Close()
			f, t.offset, t.inode = nil, 0, 0
			continue
		}
		if pending && time.Since(lastData) >= partialAfter && t.out != nil {
			t.out.Flush()
			t.mark()
			pending = false
		}
		if time.Since(lastSave) >= saveEvery {
			t.saveIfMoved()
			lastSave = time.Now()
		}
		if stopping {
			return // drained
		}
		// A partial line is flushed partialAfter after its last byte; a
		// new position is saved saveEvery after the last save.
		var within time.Duration
		if pending {
			within = max(partialAfter-time.Since(lastData), time.Millisecond)
		}
		if t.offset != t.savedOffset || t.inode != t.savedInode {
			saveIn := max(saveEvery-time.Since(lastSave), time.Millisecond)
			if within == 0 || saveIn < within {
				within = saveIn
			}
		}
		if t.wait(within) {
			stopping = true // one more pass to drain what is left
		}
	}
}

// positionFile is where a console's tailer notes what reached the CRI
// log; it goes with the console log (consoleSideFiles).
func positionFile(raw string) string { return raw + ".pos" }

// mark notes in the position file the raw log's offset up to which the
// CRI log holds the console's output (not the incomplete line the writer
// still holds).
func (t *tailer) mark() {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(t.offset-int64(t.out.Pending())))
	binary.LittleEndian.PutUint64(b[8:], t.inode)
	if _, err := t.pos.WriteAt(b[:], 0); err != nil {
		t.log.WithError(err).Warn("note the console's position")
	}
}

// saveIfMoved persists the position when it changed since the last save.
func (t *tailer) saveIfMoved() {
	if t.offset == t.savedOffset && t.inode == t.savedInode {
		return
	}
	t.save(t.offset, t.inode)
	t.savedOffset, t.savedInode = t.offset, t.inode
}

// open opens the raw log at the saved position (from the start if the file
// is a different one than the saved inode).
func (t *tailer) open() (*os.File, error) {
	f, err := os.Open(t.raw)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	ino := inodeOf(info)
	if ino != t.inode || t.offset > info.Size() {
		t.offset = 0
	}
	t.inode = ino
	if _, err := f.Seek(t.offset, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// wait sleeps until the raw log changes (or a poll interval without
// inotify), at most within when that is set; it reports whether the
// tailer was stopped.
func (t *tailer) wait(within time.Duration) bool {
	d := tailPoll
	if t.wake != nil {
		d = tailSafety
	}
	if within > 0 {
		d = min(d, within)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-t.stop:
		return true
	case <-t.wake:
		return false
	case <-timer.C:
		return false
	}
}

// reopen reopens the CRI log after kubelet rotated it.
func (t *tailer) reopen() error {
	if t.out == nil {
		return nil
	}
	return t.out.Reopen()
}

// close drains what the console wrote and stops.
func (t *tailer) close() {
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	<-t.done
}
