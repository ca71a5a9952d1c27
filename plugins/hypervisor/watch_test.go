package hypervisor_test

import (
	"context"
	"testing"
	"time"

	"github.com/virtlet/virtlet/plugins/hypervisor"
	"github.com/virtlet/virtlet/plugins/sdk/sdktest"
	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/fakehypervisor"
)

// slowSubscriber is a hypervisor that takes its time to subscribe a
// watcher (the plugin process is busy).
type slowSubscriber struct {
	*fakehypervisor.Hypervisor
	subscribed chan time.Time
}

func (s slowSubscriber) Watch(ctx context.Context) (<-chan ports.VMStatus, error) {
	time.Sleep(200 * time.Millisecond)
	ch, err := s.Hypervisor.Watch(ctx)
	s.subscribed <- time.Now()
	return ch, err
}

// Watch returns only once the plugin has subscribed: a VM started right
// after it is always seen (before, the start could come first and its
// event be lost, and a List after Watch did not cover it either).
func TestWatchReturnsOnceThePluginSubscribed(t *testing.T) {
	impl := slowSubscriber{Hypervisor: fakehypervisor.New(), subscribed: make(chan time.Time, 1)}
	hv := hypervisor.NewClient(sdktest.Conn(t, impl))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := hv.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	select {
	case at := <-impl.subscribed:
		if returned.Before(at) {
			t.Fatalf("Watch returned %s before the plugin subscribed", at.Sub(returned))
		}
	default:
		t.Fatal("Watch returned before the plugin subscribed")
	}
	id := "0123456789abcdef"
	if err := hv.Define(ctx, ports.VMSpec{ID: id, Name: "w", VCPUs: 1, MemoryBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := hv.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case st := <-events:
			if st.ID == "" {
				t.Fatalf("the subscription marker reached the watcher: %+v", st)
			}
			if st.ID == id && st.State == ports.VMRunning {
				return
			}
		case <-deadline:
			t.Fatal("no running event")
		}
	}
}
