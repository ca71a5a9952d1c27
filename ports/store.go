package ports

import "context"

// Bucket groups records of one kind in the state store.
type Bucket string

const (
	BucketSandboxes  Bucket = "sandboxes"
	BucketContainers Bucket = "containers"
	BucketImages     Bucket = "images"
)

// Buckets lists every bucket the store must hold.
var Buckets = []Bucket{BucketSandboxes, BucketContainers, BucketImages}

// StateStore persists the daemon's records durably: a Put has reached the
// disk when it returns, so the core writes its intent before side effects
// and can reconcile after a crash.
type StateStore interface {
	// Get returns a record, ErrNotFound if absent.
	Get(ctx context.Context, bucket Bucket, key string) ([]byte, error)
	// List returns every record of a bucket, keyed by key.
	List(ctx context.Context, bucket Bucket) (map[string][]byte, error)
	// Apply performs puts and deletes atomically. Deleting an absent key
	// is not an error.
	Apply(ctx context.Context, ops ...StoreOp) error
	// Close releases the store.
	Close() error
}

// StoreOp is one write of an Apply: a put, or a delete when Value is nil.
type StoreOp struct {
	Bucket Bucket
	Key    string
	Value  []byte
}

// Put is a StoreOp that writes value.
func Put(bucket Bucket, key string, value []byte) StoreOp {
	return StoreOp{Bucket: bucket, Key: key, Value: value}
}

// Delete is a StoreOp that removes key.
func Delete(bucket Bucket, key string) StoreOp {
	return StoreOp{Bucket: bucket, Key: key}
}
