package harness

import (
	"slices"
	"sync"
	"time"
)

// Slots hands out a fixed number of slots to tests, to the waiting test
// that ranks first in longestFirst (then in order of asking). A slot that is
// free when a test asks goes out settle later, once the tests resumed
// together have all asked; a slot given back goes out at once.
type Slots struct {
	mu      sync.Mutex
	free    int
	settle  time.Duration
	asks    int
	waiting []*slotWait
	// longestFirst names the longest tests, slowest first.
	longestFirst []string
}

type slotWait struct {
	rank, seq int
	granted   chan struct{}
}

// NewSlots makes n slots; longestFirst names the tests to run first.
func NewSlots(n int, settle time.Duration, longestFirst []string) *Slots {
	return &Slots{free: n, settle: settle, longestFirst: longestFirst}
}

// Acquire blocks until the test named name has a slot; Release gives it
// back.
func (s *Slots) Acquire(name string) {
	w := &slotWait{rank: s.rank(name), granted: make(chan struct{})}
	s.mu.Lock()
	w.seq = s.asks
	s.asks++
	s.waiting = append(s.waiting, w)
	if s.free > 0 {
		time.AfterFunc(s.settle, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.grantLocked()
		})
	}
	s.mu.Unlock()
	<-w.granted
}

func (s *Slots) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free++
	s.grantLocked()
}

func (s *Slots) grantLocked() {
	for s.free > 0 && len(s.waiting) > 0 {
		best := 0
		for i, w := range s.waiting {
			if b := s.waiting[best]; w.rank < b.rank || (w.rank == b.rank && w.seq < b.seq) {
				best = i
			}
		}
		close(s.waiting[best].granted)
		s.waiting = slices.Delete(s.waiting, best, best+1)
		s.free--
	}
}

// rank is a test's place in longestFirst, after all of them when it is
// not there.
func (s *Slots) rank(name string) int {
	if i := slices.Index(s.longestFirst, name); i >= 0 {
		return i
	}
	return len(s.longestFirst)
}
