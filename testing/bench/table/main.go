// Command table prints the rows `make bench`'s benchmarks recorded (JSON
// lines, see bench.Row) as one Markdown table: figure, ours, floor or peer,
// ratio, target, met. A figure recorded twice (a benchmark's calibration
// round) keeps its last row, in its first row's place.
//
//	go run ./testing/bench/table FILE
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"github.com/virtlet/virtlet/testing/bench"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: table FILE")
		os.Exit(2)
	}
	rows, err := read(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bench.WriteTable(os.Stdout, rows)
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
