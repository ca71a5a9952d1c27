package fakes_test

import (
	"sync"
	"testing"

	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/contract/storetest"
	"github.com/virtlet/virtlet/testing/fakes"
)

// The fake the core's unit tests use must behave like the real store.
func TestStoreContract(t *testing.T) {
	var mu sync.Mutex
	stores := map[string]*fakes.Store{}
	storetest.Run(t, "mem", func(t *testing.T, loc string) ports.StateStore {
		mu.Lock()
		defer mu.Unlock()
		if stores[loc] == nil {
			stores[loc] = fakes.NewStore()
		}
		return stores[loc]
	})
}
