package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Row is one line of the table `make bench` prints at its end: a figure,
// what we measured, the floor or peer it is held against, their ratio, the
// target and whether it is met. The benchmarks run in several test
// processes, so each appends its rows to the file $BENCH_TABLE (JSON
// lines) and testing/bench/table prints them together.
type Row struct {
	Figure string `json:"figure"`
	Ours   string `json:"ours"`
	Floor  string `json:"floor,omitempty"`
	Ratio  string `json:"ratio,omitempty"`
	Target string `json:"target,omitempty"`
	Met    string `json:"met,omitempty"`
}

// TableEnv names the file rows go to; without it rows are only printed.
const TableEnv = "BENCH_TABLE"

// record adds rows to the table.
func record(rows ...Row) {
	path := os.Getenv(TableEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench table %s: %v\n", path, err)
		return
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(os.Stderr, "bench table %s: %v\n", path, err)
		}
	}
}

// WriteTable writes rows as a Markdown table.
func WriteTable(w io.Writer, rows []Row) {
	fmt.Fprintln(w, "| figure | ours | floor or peer | ratio | target | met |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", cell(r.Figure), cell(r.Ours), cell(r.Floor), cell(r.Ratio), cell(r.Target), cell(r.Met))
	}
}

// Met tells whether a row's target was met: its met cell starts with
// "met" (met writes it; a figure may follow it, as in "met (6.0 %)").
func Met(r Row) bool { return strings.HasPrefix(r.Met, "met") }

// met says whether a target is met.
func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// ratioOf formats ours/floor.
func ratioOf(ours, floor float64) string {
	if floor == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f", ours/floor)
}

// ms formats a duration in milliseconds for the table.
func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Microsecond).String()
}
