package core

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/virtlet/virtlet/ports"
)

// table holds one kind of record (sandboxes, containers, images) in
// memory, behind a lock of its own, and writes every change through to
// the state store before the memory sees it. Records are immutable
// snapshots: a change puts a new record.
type table[T any] struct {
	bucket ports.Bucket
	db     ports.StateStore
	id     func(*T) string
	// stamp gives a put record the next revision (nil: the kind has none).
	stamp    func(*T, uint64)
	revision *atomic.Uint64

	mu      sync.RWMutex
	records map[string]*T
}

func newTable[T any](db ports.StateStore, bucket ports.Bucket, id func(*T) string) *table[T] {
	return &table[T]{bucket: bucket, db: db, id: id, records: map[string]*T{}}
}

// revisioned makes the table stamp each record it puts with the next
// value of the counter its caller shares between tables.
func (t *table[T]) revisioned(counter *atomic.Uint64, stamp func(*T, uint64)) *table[T] {
	t.revision, t.stamp = counter, stamp
	return t
}

// load replaces the table's records with the state store's.
func (t *table[T]) load(ctx context.Context) (int, error) {
	stored, err := t.db.List(ctx, t.bucket)
	if err != nil {
		return 0, fmt.Errorf("load %s: %w", t.bucket, err)
	}
	records := make(map[string]*T, len(stored))
	for key, raw := range stored {
		v := new(T)
		if err := json.Unmarshal(raw, v); err != nil {
			return 0, fmt.Errorf("load %s/%s: decode record: %w", t.bucket, key, err)
		}
		if t.stamp != nil {
			t.stamp(v, t.revision.Add(1))
		}
		records[key] = v
	}
	t.mu.Lock()
	t.records = records
	t.mu.Unlock()
	return len(records), nil
}

// apply writes puts and deletes in one state store transaction, then
// shows them in memory.
func (t *table[T]) apply(ctx context.Context, puts []*T, deletes []string) error {
	ops := make([]ports.StoreOp, 0, len(puts)+len(deletes))
	for _, v := range puts {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("write state: encode the record of %s: %w", t.id(v), err)
		}
		ops = append(ops, ports.Put(t.bucket, t.id(v), b))
	}
	for _, id := range deletes {
		ops = append(ops, ports.Delete(t.bucket, id))
	}
	if err := t.db.Apply(ctx, ops...); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, v := range puts {
		if t.stamp != nil {
			t.stamp(v, t.revision.Add(1))
		}
		t.records[t.id(v)] = v
	}
	for _, id := range deletes {
		delete(t.records, id)
	}
	return nil
}

// put writes a record.
func (t *table[T]) put(ctx context.Context, v *T) error { return t.apply(ctx, []*T{v}, nil) }

// delete forgets a record.
func (t *table[T]) delete(ctx context.Context, id string) error {
	return t.apply(ctx, nil, []string{id})
}

func (t *table[T]) get(id string) (*T, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	v, ok := t.records[id]
	return v, ok
}

// resolve maps an ID or a unique prefix of one to the full ID.
func (t *table[T]) resolve(id string) (string, bool, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return lookupPrefix(t.records, id)
}

// find returns the first record keep accepts (nil: none).
func (t *table[T]) find(keep func(*T) bool) *T {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, v := range t.records {
		if keep(v) {
			return v
		}
	}
	return nil
}

// list returns the records keep accepts (nil keep: all), in no order.
func (t *table[T]) list(keep func(*T) bool) []*T {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]*T, 0, len(t.records))
	for _, v := range t.records {
		if keep == nil || keep(v) {
			out = append(out, v)
		}
	}
	return out
}
