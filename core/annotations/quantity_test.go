package annotations

import (
	"errors"
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// apimachinery is the reference (a test may import it; the core may not):
// its exact decimal value, when that is a positive whole int64. (Its
// AsInt64 is no reference: it gives up on exact values such as 1Pi or
// 1.5Gi, which the core used to refuse for that reason.)
func reference(s string) (int64, bool) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, false
	}
	v, ok := new(big.Rat).SetString(q.AsDec().String())
	if !ok || !v.IsInt() || v.Sign() <= 0 || !v.Num().IsInt64() {
		return 0, false
	}
	return v.Num().Int64(), true
}

// check compares parseBytes with the reference. apimachinery saturates a
// value beyond int64 at MaxInt64; parseBytes refuses it instead (a root
// disk is not silently shrunk).
func check(t *testing.T, s string) {
	t.Helper()
	want, wantOK := reference(s)
	got, err := ParseBytes(s)
	if wantOK && want == math.MaxInt64 && errors.Is(err, errNotBytes) {
		return
	}
	if (err == nil) != wantOK || (wantOK && got != want) {
		t.Errorf("ParseBytes(%q) = %d, %v; apimachinery: %d, ok %v", s, got, err, want, wantOK)
	}
}

var quantityCases = []string{
	"1Gi", "512Mi", "10G", "4G", "1", "1024", "1.5Gi", "0.5Gi", "1.5", "0.5", "1k", "1Ki", "1Ei", "7Ei", "8Ei", "9E", "10E",
	"1e3", "1E3", "1e+3", "1e-3", "1500e-3", "2e18", "1e30", "1e-30", "+1Gi", "-1Gi", "0", "0Gi", "1m", "1000m", "1500m",
	"1n", "1000000000n", "1u", ".5Gi", "5.Gi", "1 GB", "1GB", "huge", "", "Gi", "1gi", "1.2.3", "1e", "1e1.5", "1ee3",
	"9223372036854775807", "9223372036854775808", "1Pi", "1T", "1.0000000001Gi",
}

func TestParseBytesMatchesKubernetes(t *testing.T) {
	for _, s := range quantityCases {
		check(t, s)
	}
	if _, err := ParseBytes("0E1000000000000000000"); err == nil {
		t.Error("a zero with a huge exponent was accepted")
	}
	if _, err := ParseBytes("8Ei"); !errors.Is(err, errNotBytes) {
		t.Errorf("8Ei (2^63 bytes): %v, want refused", err)
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range quantityCases {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// apimachinery takes seconds over a huge exponent; parseBytes only
		// has to refuse it, quickly.
		if i := strings.LastIndexAny(s, "eE"); i >= 0 {
			if e, err := strconv.ParseInt(s[i+1:], 10, 64); (err != nil && len(s[i+1:]) > 3) || e > 30 || e < -30 {
				if n, err := ParseBytes(s); err == nil {
					t.Errorf("ParseBytes(%q) = %d with a huge exponent", s, n)
				}
				return
			}
		}
		check(t, s)
	})
}
