// Package keyedmutex serialises work per key (a file, a pod) for the
// adapters: one mutex per key in use, gone once nobody holds or waits for
// it. (The core has its own, which also gives up with a context: the core
// imports no adapter.)
package keyedmutex

import "sync"

// Map holds the keys' mutexes; its zero value is ready.
type Map struct {
	mu    sync.Mutex
	locks map[string]*entry
}

type entry struct {
	sync.Mutex
	refs int
}

// Lock locks key's mutex and returns what unlocks it.
func (k *Map) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*entry{}
	}
	e := k.locks[key]
	if e == nil {
		e = &entry{}
		k.locks[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// Len is the number of keys held or waited for.
func (k *Map) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.locks)
}
