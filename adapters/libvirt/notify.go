package libvirt

import (
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// consoleNotifier wakes a VM's console tailer when virtlogd writes, creates
// or rotates its raw log: one inotify watch on the VM directory for every
// VM of the plugin, instead of each tailer polling its file (which cost a
// wakeup, a read and a stat per VM every 25 ms however idle the VM was).
type consoleNotifier struct {
	fd int

	mu      sync.Mutex
	dirs    map[int32]string                  // watch descriptor → directory
	waiters map[string]map[chan struct{}]bool // raw log path → tailers' wake channels
}

var (
	notifierOnce sync.Once
	notifier     *consoleNotifier // nil: inotify is unavailable; tailers poll
)

// sharedNotifier returns the process's notifier, or nil when there is no
// inotify.
func sharedNotifier() *consoleNotifier {
	notifierOnce.Do(func() {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			return
		}
		notifier = &consoleNotifier{fd: fd, dirs: map[int32]string{}, waiters: map[string]map[chan struct{}]bool{}}
		go notifier.run()
	})
	return notifier
}

// subscribe wakes wake (without blocking) whenever raw, or a rotated file
// of it, changes; cancel stops that.
func (n *consoleNotifier) subscribe(raw string, wake chan struct{}) (cancel func(), err error) {
	dir := filepath.Dir(raw)
	wd, err := unix.InotifyAddWatch(n.fd, dir, unix.IN_MODIFY|unix.IN_CREATE|unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO|unix.IN_MOVED_FROM|unix.IN_DELETE|unix.IN_ATTRIB)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.dirs[int32(wd)] = dir
	if n.waiters[raw] == nil {
		n.waiters[raw] = map[chan struct{}]bool{}
	}
	n.waiters[raw][wake] = true
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.waiters[raw], wake)
		if len(n.waiters[raw]) == 0 {
			delete(n.waiters, raw)
		}
	}, nil
}

func (n *consoleNotifier) run() {
	buf := make([]byte, 64*1024)
	for {
		k, err := unix.Read(n.fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil || k <= 0 {
			n.wakeAll() // tailers fall back to their slow timer
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= k; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				name = strings.TrimRight(string(raw), "\x00")
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				n.wakeAll()
				continue
			}
			n.mu.Lock()
			dir := n.dirs[ev.Wd]
			// virtlogd rotates <id>.console to <id>.console.N; the
			// tailer's own position file changes nothing to follow.
			path := filepath.Join(dir, name)
			if strings.HasSuffix(name, ".console.pos") {
				n.mu.Unlock()
				continue
			}
			if i := strings.LastIndex(name, ".console."); i >= 0 {
				path = filepath.Join(dir, name[:i+len(".console")])
			}
			for wake := range n.waiters[path] {
				select {
				case wake <- struct{}{}:
				default:
				}
			}
			n.mu.Unlock()
		}
	}
}

func (n *consoleNotifier) wakeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ws := range n.waiters {
		for wake := range ws {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}
}
