// Command table prints the rows `make bench`'s benchmarks recorded (JSON
// lines, see bench.Row) as one Markdown table: figure, ours, floor or peer,
// ratio, target, met. A figure recorded twice (a benchmark's calibration
// round) keeps its last row, in its first row's place. With -check it also
// fails (exit 1) when a target was missed, naming each, or when no row
// has a target at all (make bench-check).
//
//	go run ./testing/bench/table [-check] FILE
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/virtlet/virtlet/testing/bench"
)

func main() {
	check := flag.Bool("check", false, "fail when a target was missed")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: table [-check] FILE")
		os.Exit(2)
	}
	rows, err := read(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bench.WriteTable(os.Stdout, rows)
	if *check && !targetsMet(os.Stdout, rows) {
		os.Exit(1)
	}
}

// targetsMet tells whether every row with a target met it, naming on w
// each that did not; a table without any target proves nothing and fails.
func targetsMet(w io.Writer, rows []bench.Row) bool {
	targets, missed := 0, 0
	for _, r := range rows {
		if r.Target == "" {
			continue
		}
		targets++
		if !bench.Met(r) {
			missed++
			fmt.Fprintf(w, "target missed: %s: %s, target %s (%s)\n", r.Figure, r.Ours, r.Target, r.Met)
		}
	}
	switch {
	case targets == 0:
		fmt.Fprintln(w, "bench-check: no row has a target")
		return false
	case missed > 0:
		fmt.Fprintf(w, "bench-check: %d of %d targets missed\n", missed, targets)
		return false
	}
	fmt.Fprintf(w, "bench-check: all %d targets met\n", targets)
	return true
}

func read(path string) ([]bench.Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("the benchmarks' rows: %w", err)
	}
	defer f.Close()
	var rows []bench.Row
	at := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var r bench.Row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if i, ok := at[r.Figure]; ok {
			rows[i] = r
			continue
		}
		at[r.Figure] = len(rows)
		rows = append(rows, r)
	}
	return rows, sc.Err()
}
