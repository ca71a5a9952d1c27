// Package boltstore keeps the daemon's records in a bbolt database
// (/var/lib/virtlet/virtlet.db by default). Every Apply is one fsync'ed
// transaction, so a record written before a side effect is on disk when the
// side effect starts.
package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/virtlet/virtlet/ports"
)

// Store is a ports.StateStore on bbolt.
type Store struct {
	db *bolt.DB
}

// Open opens (creating if needed) the database at path with mode 0600. It
// fails after a second if another process holds the database.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("open state store %s: locked by another process (is another virtlet daemon running?)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open state store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range ports.Buckets {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return fmt.Errorf("create bucket %s: %w", b, err)
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("initialise state store %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

func bucket(tx *bolt.Tx, name ports.Bucket) (*bolt.Bucket, error) {
	b := tx.Bucket([]byte(name))
	if b == nil {
		return nil, fmt.Errorf("unknown bucket %q: %w", name, ports.ErrInvalidArgument)
	}
	return b, nil
}

func (s *Store) Get(ctx context.Context, name ports.Bucket, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, name)
		if err != nil {
			return err
		}
		v := b.Get([]byte(key))
		if v == nil {
			return fmt.Errorf("%s/%s: %w", name, key, ports.ErrNotFound)
		}
		out = append([]byte(nil), v...)
		return nil
	})
	return out, err
}

func (s *Store) List(ctx context.Context, name ports.Bucket) (map[string][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	err := s.db.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, name)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, v []byte) error {
			out[string(k)] = append([]byte(nil), v...)
			return nil
		})
	})
	return out, err
}

func (s *Store) Apply(ctx context.Context, ops ...ports.StoreOp) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, op := range ops {
			b, err := bucket(tx, op.Bucket)
			if err != nil {
				return err
			}
			if op.Key == "" {
				return fmt.Errorf("%s: empty key: %w", op.Bucket, ports.ErrInvalidArgument)
			}
			if op.Value == nil {
				err = b.Delete([]byte(op.Key))
			} else {
				err = b.Put([]byte(op.Key), op.Value)
			}
			if err != nil {
				return fmt.Errorf("%s/%s: %w", op.Bucket, op.Key, err)
			}
		}
		return nil
	})
}

func (s *Store) Close() error { return s.db.Close() }

var _ ports.StateStore = (*Store)(nil)
