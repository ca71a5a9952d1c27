package core

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// maxCPU bounds the CPU numbers a CPU list may name.
const maxCPU = 8191

// ParseCPUList reads Linux's CPU list format ("0-2,5", as cgroups'
// cpuset.cpus and CRI's cpuset_cpus write it) into sorted, distinct CPU
// numbers; "" is none.
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		first, err := strconv.Atoi(lo)
		last := first
		if err == nil && isRange {
			last, err = strconv.Atoi(hi)
		}
		if err != nil || first < 0 || last < first || last > maxCPU {
			return nil, fmt.Errorf("%q is not a CPU or a range of CPUs", part)
		}
		for c := first; c <= last; c++ {
			seen[c] = true
		}
	}
	out := make([]int, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Ints(out)
	return out, nil
}
