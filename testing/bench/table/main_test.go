package main

import (
	"strings"
	"testing"

	"github.com/virtlet/virtlet/testing/bench"
)

// bench-check passes only when every row with a target met it, names each
// miss, and fails a table with no target at all.
func TestTargetsMet(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rows  []bench.Row
		ok    bool
		names string
	}{
		{"all met", []bench.Row{{Figure: "a", Target: "≤ 1", Met: "met"}, {Figure: "b", Target: "≤ 2", Met: "met (6.0 %)"}, {Figure: "c"}}, true, "all 2 targets met"},
		{"one missed", []bench.Row{{Figure: "a", Target: "≤ 1", Met: "met"}, {Figure: "slow", Ours: "9 ms", Target: "≤ 5 ms", Met: "NOT met"}}, false, "target missed: slow: 9 ms, target ≤ 5 ms"},
		{"no target", []bench.Row{{Figure: "a", Ours: "1"}}, false, "no row has a target"},
	} {
		var b strings.Builder
		if ok := targetsMet(&b, tc.rows); ok != tc.ok || !strings.Contains(b.String(), tc.names) {
			t.Errorf("%s: %v, %q; want %v and %q", tc.name, ok, b.String(), tc.ok, tc.names)
		}
	}
}
