package core

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/virtlet/virtlet/ports"
)

// hugepageSize is the page size a VM's memory is backed with, from the
// container's hugepages-<size> limit (0: ordinary pages). The whole guest
// memory comes from pages of one size, so the limit must hold it: the VM's
// memory stays resources.limits.memory, a whole number of pages.
func hugepageSize(limits []HugepageLimit, memory int64) (int64, error) {
	switch len(limits) {
	case 0:
		return 0, nil
	case 1:
	default:
		var fields []string
		for _, h := range limits {
			fields = append(fields, hugepagesField(h))
		}
		return 0, &ports.InvalidError{Field: "resources.limits " + strings.Join(fields, " and "), Value: "two page sizes",
			Reason: "a VM's memory is backed by pages of one size", Allowed: "one hugepages-<size> limit"}
	}
	h := limits[0]
	size, err := parsePageSize(h.PageSize)
	if err != nil {
		return 0, &ports.InvalidError{Field: "resources.limits." + hugepagesField(h), Value: h.PageSize,
			Reason: err.Error(), Allowed: "a page size such as 2MB or 1GB"}
	}
	switch {
	case memory%size != 0:
		return 0, &ports.InvalidError{Field: "resources.limits.memory", Value: fmt.Sprintf("%d bytes", memory),
			Reason:  fmt.Sprintf("not a whole number of the %s hugepages the VM's memory is backed with", h.PageSize),
			Allowed: fmt.Sprintf("a multiple of %d bytes", size)}
	case int64(h.Bytes) < memory:
		return 0, &ports.InvalidError{Field: "resources.limits." + hugepagesField(h), Value: fmt.Sprintf("%d bytes", h.Bytes),
			Reason:  fmt.Sprintf("less than the VM's memory (%d bytes, resources.limits.memory): all of it is backed by hugepages", memory),
			Allowed: fmt.Sprintf("at least %d bytes", memory)}
	}
	return size, nil
}

// hugepagesField names the pod's resource as kubectl shows it: CRI's
// page size "2MB" is the resource hugepages-2Mi.
func hugepagesField(h HugepageLimit) string {
	if n, ok := strings.CutSuffix(h.PageSize, "B"); ok {
		return "hugepages-" + n + "i"
	}
	return "hugepages-" + h.PageSize
}

// parsePageSize reads CRI's page size names ("2MB", "1GB", "64KB"),
// which are binary sizes.
func parsePageSize(s string) (int64, error) {
	units := map[string]int64{"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
	for suffix, unit := range units {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil || v <= 0 || v&(v-1) != 0 {
				return 0, fmt.Errorf("%q is not a power of two", n)
			}
			return v * unit, nil
		}
	}
	return 0, fmt.Errorf("no KB, MB or GB unit")
}
