package harness

import (
	"slices"
	"testing"
	"time"
)

// Slots go to the longest tests of those that asked together, then, as
// slots come back, to the next longest waiting.
func TestSlotsGoToTheLongestFirst(t *testing.T) {
	s := NewSlots(2, 50*time.Millisecond, []string{"TestKubeNode", "TestCritest", "TestDemo"})
	done := make(chan string)
	names := []string{"TestZeta", "TestDemo", "TestKubeNode", "TestAlpha", "TestCritest"}
	for _, n := range names {
		go func() {
			s.Acquire(n)
			done <- n
		}()
	}
	// The first two go out together, settle after the first ask.
	got := []string{<-done, <-done}
	slices.Sort(got)
	if want := []string{"TestCritest", "TestKubeNode"}; !slices.Equal(got, want) {
		t.Fatalf("first slots to %v, want %v", got, want)
	}
	// Each slot given back goes to the longest still waiting: TestDemo
	// (ranked), then the others in the order they asked, which
	// the goroutines above do not fix, so only the set is checked.
	s.Release()
	if n := <-done; n != "TestDemo" {
		t.Fatalf("a slot given back went to %s, want TestDemo", n)
	}
	s.Release()
	s.Release()
	rest := []string{<-done, <-done}
	slices.Sort(rest)
	if want := []string{"TestAlpha", "TestZeta"}; !slices.Equal(rest, want) {
		t.Fatalf("then %v, want %v", rest, want)
	}
}
