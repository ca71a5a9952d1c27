// Command checkreport prints the closing table of `make check`: each
// phase's wall time and outcome, the total, and the slowest tests of every
// suite, read from the go test event streams (test2json, as gotestsum
// keeps them) the phases wrote.
//
//	go run ./testing/checkreport DIR
//
// DIR holds phases.tsv (a line per phase: name, start in Unix seconds,
// seconds, exit code) and PHASE.json for each phase that ran go test.
// Phases may overlap (check.sh runs bench-smoke beside lint, unit and
// integration): the total is the wall time from the first start to the
// last end, not their sum.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// slowest is how many tests the table names.
const slowest = 20

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: checkreport DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	phases, err := readPhases(filepath.Join(dir, "phases.tsv"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "checkreport:", err)
		os.Exit(1)
	}
	var tests []testTime
	for _, p := range phases {
		ts, err := readTests(filepath.Join(dir, p.Name+".json"), p.Name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "checkreport:", err)
			os.Exit(1)
		}
		tests = append(tests, ts...)
	}
	writeTable(os.Stdout, phases, tests)
}

// phase is one step of make check.
type phase struct {
	Name    string
	Start   int64 // Unix seconds
	Seconds int
	Exit    int
}

// testTime is how long one top-level test ran.
type testTime struct {
	Phase, Package, Test, Outcome string
	Elapsed                       time.Duration
}

func readPhases(path string) ([]phase, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("the phases' times: %w", err)
	}
	defer f.Close()
	var out []phase
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) != 4 {
			return nil, fmt.Errorf("%s:%d: want phase, start, seconds and exit code, got %q", path, n, sc.Text())
		}
		start, err0 := strconv.ParseInt(fields[1], 10, 64)
		secs, err1 := strconv.Atoi(fields[2])
		exit, err2 := strconv.Atoi(fields[3])
		if err0 != nil || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s:%d: start, seconds and exit code must be numbers: %q", path, n, sc.Text())
		}
		out = append(out, phase{Name: fields[0], Start: start, Seconds: secs, Exit: exit})
	}
	return out, sc.Err()
}

// event is the part of a test2json event the report reads.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64 // seconds
}

// slotWait is the line a test that waited for one of the e2e suite's
// slots logs (testing/e2e's slot): go test counts that wait in its time,
// the table does not.
var slotWait = regexp.MustCompile(`waited ([0-9.]+)s for a test slot`)

// readTests reads the top-level tests that ended in a phase's event
// stream; a phase without one (it ran no go test) has none.
func readTests(path, phaseName string) ([]testTime, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []testTime
	waited := map[string]float64{} // by package and test
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// A test binary's own non-JSON output reaches the stream
			// as Output events; a line that is no event at all is a
			// truncated stream's last.
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if e.Test == "" || strings.Contains(e.Test, "/") {
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			if m := slotWait.FindStringSubmatch(e.Output); m != nil {
				w, _ := strconv.ParseFloat(m[1], 64)
				waited[key] += w
			}
		case "pass", "fail", "skip":
			out = append(out, testTime{Phase: phaseName, Package: e.Package, Test: e.Test, Outcome: e.Action,
				Elapsed: time.Duration(max(e.Elapsed-waited[key], 0) * float64(time.Second))})
		}
	}
	return out, sc.Err()
}

func writeTable(w io.Writer, phases []phase, tests []testTime) {
	fmt.Fprintln(w, "make check: wall time by phase")
	fmt.Fprintf(w, "  %-14s %7s %9s  %s\n", "phase", "start", "seconds", "result")
	var first, last int64
	for i, p := range phases {
		if i == 0 || p.Start < first {
			first = p.Start
		}
		last = max(last, p.Start+int64(p.Seconds))
	}
	for _, p := range phases {
		result := "ok"
		if p.Exit != 0 {
			result = fmt.Sprintf("FAILED (exit %d)", p.Exit)
		}
		at := p.Start - first
		fmt.Fprintf(w, "  %-14s %4d:%02d %9d  %s\n", p.Name, at/60, at%60, p.Seconds, result)
	}
	// The wall time: phases that ran side by side count once.
	total := last - first
	fmt.Fprintf(w, "  %-14s %7s %9d  (%dm%02ds)\n", "total", "", total, total/60, total%60)

	sort.SliceStable(tests, func(i, j int) bool { return tests[i].Elapsed > tests[j].Elapsed })
	n := min(slowest, len(tests))
	fmt.Fprintf(w, "\nthe %d slowest of %d tests\n", n, len(tests))
	fmt.Fprintf(w, "  %9s  %-12s %s\n", "seconds", "phase", "test")
	for _, t := range tests[:n] {
		outcome := ""
		if t.Outcome != "pass" {
			outcome = " (" + t.Outcome + ")"
		}
		fmt.Fprintf(w, "  %9.1f  %-12s %s %s%s\n", t.Elapsed.Seconds(), t.Phase, t.Package, t.Test, outcome)
	}
	count := map[string]int{}
	for _, t := range tests {
		count[t.Outcome]++
	}
	fmt.Fprintf(w, "\ncheck: %d passed, %d failed, %d skipped\n", count["pass"], count["fail"], count["skip"])
}
