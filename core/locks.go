package core

import (
	"context"
	"sync"
)

// keyedLock serialises operations per key (a sandbox ID) and lets waiters
// give up when their context ends.
type keyedLock struct {
	mu    sync.Mutex
	locks map[string]*lockEntry
}

type lockEntry struct {
	ch   chan struct{}
	refs int
}

func (k *keyedLock) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = make(map[string]*lockEntry)
	}
	e := k.locks[key]
	if e == nil {
		e = &lockEntry{ch: make(chan struct{}, 1)}
		k.locks[key] = e
	}
	e.refs++
	k.mu.Unlock()

	select {
	case e.ch <- struct{}{}:
		return func() {
			<-e.ch
			k.release(key, e)
		}, nil
	case <-ctx.Done():
		k.release(key, e)
		return nil, ctx.Err()
	}
}

func (k *keyedLock) release(key string, e *lockEntry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e.refs--
	if e.refs == 0 {
		delete(k.locks, key)
	}
}
