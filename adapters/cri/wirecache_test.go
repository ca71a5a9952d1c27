package cri

import (
	"fmt"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Lists encoded and trimmed from many goroutines at once (kubelet's
// relists, crictl, the stats poller) each get exactly their items, and
// the race detector finds nothing.
func TestWireCacheUnderConcurrentLists(t *testing.T) {
	var c wireCache
	build := func(r any) proto.Message {
		id := r.(string)
		return &runtimeapi.Container{Id: id, Labels: map[string]string{"app": id}}
	}
	entriesOf := func(n, revision int) []entry {
		var es []entry
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("c%03d", i)
			es = append(es, entry{id: id, revision: uint64(revision), record: id})
		}
		return es
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				es := entriesOf(1+(g*7+i)%40, i%3)
				resp := &runtimeapi.ListContainersResponse{}
				setEncoded(resp, c.encode(listContainersItems, es, build))
				if i%5 == 0 {
					c.retain(es)
				}
				b, err := proto.Marshal(resp)
				if err != nil {
					errs <- err
					return
				}
				var got runtimeapi.ListContainersResponse
				if err := proto.Unmarshal(b, &got); err != nil {
					errs <- err
					return
				}
				if len(got.Containers) != len(es) {
					errs <- fmt.Errorf("goroutine %d list %d: %d items, want %d", g, i, len(got.Containers), len(es))
					return
				}
				for j, ctr := range got.Containers {
					if ctr.Id != es[j].id || ctr.Labels["app"] != es[j].id {
						errs <- fmt.Errorf("goroutine %d list %d item %d: %s, want %s", g, i, j, ctr.Id, es[j].id)
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
