package keyedmutex

import (
	"sync"
	"testing"
)

// One holder per key at a time, keys independent, and no key kept once
// its last holder is done.
func TestMap(t *testing.T) {
	var k Map
	var wg sync.WaitGroup
	var counts [2]int // each key's, guarded by its lock
	var inside sync.Map
	for i := 0; i < 200; i++ {
		key, slot := []string{"a", "b"}[i%2], i%2
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock := k.Lock(key)
			defer unlock()
			if _, busy := inside.LoadOrStore(key, true); busy {
				t.Errorf("two holders of %s at once", key)
			}
			counts[slot]++
			inside.Delete(key)
		}()
	}
	wg.Wait()
	if counts != [2]int{100, 100} {
		t.Errorf("counts %v", counts)
	}
	if n := k.Len(); n != 0 {
		t.Errorf("%d keys kept after their holders left", n)
	}
}
