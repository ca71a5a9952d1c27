package host

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// LogEntry is one line a plugin logged (or go-plugin logged about it).
type LogEntry struct {
	Time    time.Time
	Plugin  string
	Level   string
	Message string
	Fields  map[string]string
}

// logRing keeps a plugin's recent log lines for diagnostics (`virtletctl
// diag`): the daemon's own log goes to its output, which it cannot read
// back.
type logRing struct {
	mu      sync.Mutex
	entries []LogEntry
	next    int
	full    bool
}

// logRingSize is how many lines are kept per plugin.
const logRingSize = 500

func (r *logRing) add(e LogEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entries == nil {
		r.entries = make([]LogEntry, logRingSize)
	}
	r.entries[r.next] = e
	r.next = (r.next + 1) % logRingSize
	if r.next == 0 {
		r.full = true
	}
}

func (r *logRing) snapshot() []LogEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]LogEntry(nil), r.entries[:r.next]...)
	}
	return append(append([]LogEntry(nil), r.entries[r.next:]...), r.entries[:r.next]...)
}

func stringFields(fields map[string]interface{}) map[string]string {
	out := make(map[string]string, len(fields))
	for k, v := range fields {
		out[k] = fmt.Sprint(v)
	}
	return out
}

// RecentLogs returns the plugins' recent log lines, oldest first.
func (h *Host) RecentLogs() []LogEntry {
	var out []LogEntry
	for _, s := range h.sups {
		out = append(out, s.logs.snapshot()...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}
