package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The table gives each phase's start and time, its wall total (phases
// side by side counted once), flags a failed one, ranks top-level tests
// across phases by time (subtests and non-test events left out, and an e2e
// test's wait for a slot), and ends with the tests' count.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// bench beside unit: the total runs from setup's start to e2e's end.
	write("phases.tsv", "setup\t1000\t100\t0\nunit\t1100\t50\t0\nbench\t1100\t60\t0\ne2e\t1160\t75\t1\n")
	write("unit.json", `{"Action":"run","Package":"p/core","Test":"TestA"}
{"Action":"output","Package":"p/core","Test":"TestA","Output":"ok\n"}
{"Action":"pass","Package":"p/core","Test":"TestA","Elapsed":2.5}
{"Action":"pass","Package":"p/core","Test":"TestA/sub","Elapsed":9}
{"Action":"skip","Package":"p/core","Test":"TestS","Elapsed":0}
{"Action":"pass","Package":"p/core","Elapsed":3}
`)
	write("e2e.json", `{"Action":"fail","Package":"p/e2e","Test":"TestSlow","Elapsed":70.25}
{"Action":"output","Package":"p/e2e","Test":"TestQuick","Output":"    schedule_test.go:60: waited 40.5s for a test slot\n"}
{"Action":"pass","Package":"p/e2e","Test":"TestQuick","Elapsed":41.5}
`)
	phases, err := readPhases(filepath.Join(dir, "phases.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	var tests []testTime
	for _, p := range phases {
		ts, err := readTests(filepath.Join(dir, p.Name+".json"), p.Name)
		if err != nil {
			t.Fatal(err)
		}
		tests = append(tests, ts...)
	}
	var b strings.Builder
	writeTable(&b, phases, tests)
	out := b.String()
	for _, want := range []string{
		"  bench             1:40        60  ok\n",
		"  e2e               2:40        75  FAILED (exit 1)\n",
		"  total                        235  (3m55s)\n",
		"the 4 slowest of 4 tests\n",
		"       70.2  e2e          p/e2e TestSlow (fail)\n        2.5  unit         p/core TestA\n        1.0  e2e          p/e2e TestQuick\n",
		"\ncheck: 2 passed, 1 failed, 1 skipped\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "TestA/sub") {
		t.Errorf("a subtest ranked among the tests:\n%s", out)
	}
	if !strings.HasSuffix(out, "check: 2 passed, 1 failed, 1 skipped\n") {
		t.Errorf("the count is not the last line:\n%s", out)
	}
}

func TestBadPhaseLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phases.tsv")
	if err := os.WriteFile(path, []byte("setup\t1000\tlong\t0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readPhases(path); err == nil || !strings.Contains(err.Error(), "phases.tsv:1: start, seconds and exit code must be numbers") {
		t.Fatalf("a bad phase line: %v", err)
	}
}
