// Package storetest is the contract every ports.StateStore must meet.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/virtlet/virtlet/ports"
)

// Open returns a store at a location; opening the same location again must
// see what was written (durability across a daemon restart).
type Open func(t *testing.T, location string) ports.StateStore

// Run runs the contract. location is a fresh place for the store.
func Run(t *testing.T, location string, open Open) {
	ctx := context.Background()
	t.Run("get of an absent key is ErrNotFound", func(t *testing.T) {
		s := open(t, location+"-absent")
		defer s.Close()
		if _, err := s.Get(ctx, ports.BucketSandboxes, "nope"); !errors.Is(err, ports.ErrNotFound) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("put get list delete", func(t *testing.T) {
		s := open(t, location+"-crud")
		defer s.Close()
		err := s.Apply(ctx, ports.Put(ports.BucketSandboxes, "a", []byte("1")), ports.Put(ports.BucketSandboxes, "b", []byte("2")),
			ports.Put(ports.BucketContainers, "a", []byte("other bucket")))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := s.Get(ctx, ports.BucketSandboxes, "a"); err != nil || string(v) != "1" {
			t.Fatalf("get %q %v", v, err)
		}
		all, err := s.List(ctx, ports.BucketSandboxes)
		if err != nil || !reflect.DeepEqual(all, map[string][]byte{"a": []byte("1"), "b": []byte("2")}) {
			t.Fatalf("list %q %v", all, err)
		}
		if err := s.Apply(ctx, ports.Delete(ports.BucketSandboxes, "a"), ports.Delete(ports.BucketSandboxes, "never-there")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, ports.BucketSandboxes, "a"); !errors.Is(err, ports.ErrNotFound) {
			t.Fatalf("deleted key: %v", err)
		}
		if v, _ := s.Get(ctx, ports.BucketContainers, "a"); string(v) != "other bucket" {
			t.Fatalf("buckets are not separate: %q", v)
		}
	})
	t.Run("values are copies", func(t *testing.T) {
		s := open(t, location+"-copies")
		defer s.Close()
		val := []byte("xyz")
		s.Apply(ctx, ports.Put(ports.BucketImages, "k", val))
		val[0] = 'X'
		got, _ := s.Get(ctx, ports.BucketImages, "k")
		got[1] = 'Y'
		again, _ := s.Get(ctx, ports.BucketImages, "k")
		if string(again) != "xyz" {
			t.Fatalf("store shares memory with callers: %q", again)
		}
	})
	t.Run("apply is atomic", func(t *testing.T) {
		s := open(t, location+"-atomic")
		defer s.Close()
		err := s.Apply(ctx, ports.Put(ports.BucketImages, "ok", []byte("1")), ports.Put("no-such-bucket", "k", []byte("v")))
		if err == nil {
			t.Fatal("write to an unknown bucket succeeded")
		}
		if _, err := s.Get(ctx, ports.BucketImages, "ok"); !errors.Is(err, ports.ErrNotFound) {
			t.Fatalf("half of a failed Apply persisted: %v", err)
		}
	})
	t.Run("concurrent writers", func(t *testing.T) {
		s := open(t, location+"-concurrent")
		defer s.Close()
		var wg sync.WaitGroup
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				if err := s.Apply(ctx, ports.Put(ports.BucketContainers, fmt.Sprint(i), []byte{byte(i)})); err != nil {
					t.Error(err)
				}
			}(i)
		}
		wg.Wait()
		if all, _ := s.List(ctx, ports.BucketContainers); len(all) != 20 {
			t.Fatalf("%d records", len(all))
		}
	})
	t.Run("durable across reopen", func(t *testing.T) {
		s := open(t, location+"-durable")
		if err := s.Apply(ctx, ports.Put(ports.BucketSandboxes, "pod", []byte("state"))); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = open(t, location+"-durable")
		defer s.Close()
		if v, err := s.Get(ctx, ports.BucketSandboxes, "pod"); err != nil || string(v) != "state" {
			t.Fatalf("after reopen: %q %v", v, err)
		}
	})
}
