package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/virtlet/virtlet/ports"
)

// lateReceiver answers migration offers once the runtime is loaded; until
// then it says to ask again.
type lateReceiver struct {
	mu sync.Mutex
	r  ports.MigrationReceiver
}

func (l *lateReceiver) set(r ports.MigrationReceiver) {
	l.mu.Lock()
	l.r = r
	l.mu.Unlock()
}

func (l *lateReceiver) ReceiveMigration(ctx context.Context, fromNode string, offer ports.MigrationOffer) (ports.IncomingMigration, error) {
	l.mu.Lock()
	r := l.r
	l.mu.Unlock()
	if r == nil {
		return ports.IncomingMigration{}, fmt.Errorf("the daemon is starting: %w", ports.ErrNotFound)
	}
	return r.ReceiveMigration(ctx, fromNode, offer)
}
